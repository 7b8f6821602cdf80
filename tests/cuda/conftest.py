"""Every test here needs CUDA: marked ``cuda`` (``pytest -m cuda`` runs just these on a GPU)
and skipped where there is none."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    no_cuda = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "tests/cuda/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.cuda)
            if not torch.cuda.is_available():
                item.add_marker(no_cuda)


@pytest.fixture
def cuda() -> torch.device:
    return torch.device("cuda", 0)
