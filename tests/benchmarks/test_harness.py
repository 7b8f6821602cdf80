"""A benchmark's fresh process: its exit code, output and its own peak resident memory."""

from __future__ import annotations

import sys

from benchmarks.harness import run_measured


def test_a_measured_child_reports_its_own_peak() -> None:
    """The peak is the child's (128 MiB touched), not the largest of this process's children."""
    big = run_measured([sys.executable, "-c", "import numpy as n; n.ones(2**27 // 8).sum()"])
    small = run_measured([sys.executable, "-c", "print('hi')"])
    assert big.returncode == small.returncode == 0 and small.stdout == "hi\n"
    assert big.peak_rss > small.peak_rss + 100 * 2**20
    assert run_measured([sys.executable, "-c", "import sys; sys.exit(3)"]).returncode == 3


def test_pick_takes_the_last_match_or_the_first_when_asked() -> None:
    from benchmarks import point

    rows = [{"mode": "gradcache", "batch": 128, "n": 1}, {"mode": "full", "batch": 128, "n": 2}]
    rows.append({"mode": "gradcache", "batch": 128, "n": 3})  # e.g. realtext's memory point
    assert point.pick(rows, mode="gradcache", batch=128)["n"] == 3
    assert point.pick(rows, first=True, mode="gradcache", batch=128)["n"] == 1
    assert point.pick(rows, first=True, mode="gradcache", batch=64) is None
