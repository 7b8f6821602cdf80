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


def test_drop_cached_advises_the_kernel_to_drop_each_whole_file(tmp_path, monkeypatch) -> None:
    """Each file given is advised DONTNEED from its first byte to its end (0, 0) by a descriptor
    on that file; a file that is not there is an error, not skipped."""
    import os

    import pytest

    from benchmarks.harness import drop_cached

    files = [tmp_path / "a.npy", tmp_path / "a.offsets.npy"]
    for f, size in zip(files, (4096, 10), strict=True):
        f.write_bytes(b"x" * size)
    advised, synced = [], []

    def spy(fd, offset, length, advice):
        advised.append((fd, os.fstat(fd).st_size, offset, length, advice))

    monkeypatch.setattr(os, "posix_fadvise", spy)
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd))
    drop_cached(files)
    dropped = os.POSIX_FADV_DONTNEED
    assert [a[1:] for a in advised] == [(4096, 0, 0, dropped), (10, 0, 0, dropped)]
    assert synced == [a[0] for a in advised]  # each written back before it is dropped
    for fd, *_ in advised:  # and closed
        with pytest.raises(OSError):
            os.fstat(fd)
    with pytest.raises(FileNotFoundError):
        drop_cached([tmp_path / "missing.npy"])
