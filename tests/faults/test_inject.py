"""The fault tests' helpers: a folder's bytes counted while a command changes it."""

from __future__ import annotations

import os

from tests.faults.inject import folder_bytes


def test_folder_bytes_counts_nested_files_and_skips_what_vanishes(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "x").write_bytes(b"12345")
    (tmp_path / "a" / "b" / "y").write_bytes(b"123")
    assert folder_bytes(tmp_path) == 8
    assert folder_bytes(tmp_path / "gone") == 0  # not there (yet, or any more)
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        if str(path).endswith("y"):
            raise FileNotFoundError(path)  # renamed between listing and counting
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    assert folder_bytes(tmp_path) == 5
