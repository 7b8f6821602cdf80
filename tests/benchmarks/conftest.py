"""Run a benchmark module as its page says: ``python -m benchmarks.<name> ARGS`` from the
repository root."""

from __future__ import annotations

import pytest

from tests.support.cli import run_benchmark


@pytest.fixture(name="run_benchmark")
def run_benchmark_fixture():
    """``run_benchmark(name, *args)``: the finished process (stdout, stderr, returncode)."""
    return run_benchmark


@pytest.fixture
def rehearse(tmp_path):
    """``rehearse(name, timeout)``: a resumable benchmark at toy size (``DPR_CACHE_SCALE_TINY``),
    its work in ``tmp_path/w``, its figures and page in ``tmp_path/out``: the finished process."""
    args = ["--work", str(tmp_path / "w"), "--out", str(tmp_path / "out")]

    def rehearse(name: str, timeout: float = 900):
        return run_benchmark(name, *args, timeout=timeout, env={"DPR_CACHE_SCALE_TINY": "1"})

    return rehearse
