"""Run a benchmark module as its page says: ``python -m benchmarks.<name> ARGS`` from the
repository root."""

from __future__ import annotations

import pytest

from tests.support.cli import run_benchmark


@pytest.fixture(name="run_benchmark")
def run_benchmark_fixture():
    """``run_benchmark(name, *args)``: the finished process (stdout, stderr, returncode)."""
    return run_benchmark
