"""The SQuAD v1.1 dev split in DPR's formats, built once from the shipped official file."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpr_cache.data.squad import build_squad
from tests.support.fixtures import SQUAD_SOURCE


@pytest.fixture(scope="package")
def squad_build(tmp_path_factory) -> tuple[Path, dict]:
    """(folder, counts) of ``build_squad`` on the shipped ``dev-v1.1.json.gz``."""
    out = tmp_path_factory.mktemp("squad")
    return out, build_squad(SQUAD_SOURCE, out)
