"""Run a benchmark module as its page says: ``python -m benchmarks.<name> ARGS`` from the
repository root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dpr_cache.runtime.processes import child_env
from tests.support.fixtures import REPO


def _run(name: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def run_benchmark():
    """``run_benchmark(name, *args)``: the finished process (stdout, stderr, returncode)."""
    return _run
