"""Files are written whole or not at all; logs drop a torn last line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpr_cache.runtime.atomic import (
    append_line,
    read_lines,
    write_atomic,
    write_dir_atomic,
    write_json_atomic,
    write_many_atomic,
    write_text_atomic,
)


class Crash(Exception):
    pass


def half_then_crash(tmp: Path) -> None:
    tmp.write_text("half of a new")
    raise Crash


def test_a_crash_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_json_atomic(target, {"v": 1})
    with pytest.raises(Crash):
        write_atomic(target, half_then_crash)
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_text_json_and_fsync(tmp_path: Path) -> None:
    write_text_atomic(tmp_path / "a" / "b.txt", "héllo\n")  # parents are made
    assert (tmp_path / "a" / "b.txt").read_text(encoding="utf-8") == "héllo\n"
    write_atomic(tmp_path / "c.bin", lambda tmp: tmp.write_bytes(b"x"), fsync=True)
    assert (tmp_path / "c.bin").read_bytes() == b"x"


def test_many_files_are_renamed_only_after_all_are_written(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    write_many_atomic([a, b], lambda tmps: [t.write_text(t.name) for t in tmps])
    assert a.read_text().startswith("a.txt.tmp") and b.read_text().startswith("b.txt.tmp")

    def first_then_crash(tmps: list[Path]) -> None:
        tmps[0].write_text("new a")
        raise Crash

    with pytest.raises(Crash):
        write_many_atomic([a, b], first_then_crash)
    assert a.read_text().startswith("a.txt.tmp")  # untouched: nothing was renamed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


def test_a_folder_is_swapped_in_whole(tmp_path: Path) -> None:
    final = tmp_path / "model"

    def write(version: str):
        def fill(tmp: Path) -> None:
            tmp.mkdir()
            (tmp / "weights").write_text(version)

        return fill

    write_dir_atomic(final, write("v1"))
    write_dir_atomic(final, write("v2"))
    assert (final / "weights").read_text() == "v2"

    def crash(tmp: Path) -> None:
        write("v3")(tmp)
        raise Crash

    with pytest.raises(Crash):
        write_dir_atomic(final, crash)
    assert (final / "weights").read_text() == "v2"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary folder left


def test_log_lines_and_a_torn_tail(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    with open(log, "a", encoding="utf-8") as f:
        append_line(f, json.dumps({"step": 1}))
        append_line(f, json.dumps({"step": 2}) + "\n")
    with open(log, "a", encoding="utf-8") as f:
        f.write('{"step": 3, "lo')  # a crash mid-line
    assert [json.loads(line)["step"] for line in read_lines(log)] == [1, 2]
    assert read_lines(tmp_path / "missing.jsonl") == []
