"""Fixtures for every test: the offline environment, and float64 as the default dtype on demand.

Shared helpers live in :mod:`dpr_cache.testing` (tiny BERT, random inputs, the CLI runner);
fixtures of one folder live in that folder's conftest.py.
"""

from __future__ import annotations

import os

from dpr_cache.runtime.offline import OFFLINE_ENV

for _key, _value in OFFLINE_ENV.items():
    os.environ.setdefault(_key, _value)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
