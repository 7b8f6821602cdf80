"""Every file and folder the project writes: whole or not at all.

A file is written under a temporary name beside it, then renamed over the target (``os.replace``
is atomic on POSIX), so a reader, or a run that crashed half-way, never sees half a file. A
folder (a saved model, a checkpoint) is written the same way and swapped into place. Logs that
grow a line at a time (``append_line``) write each line with one call; their readers drop a
torn last line (``read_lines``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "write_atomic",
    "write_text_atomic",
    "write_json_atomic",
    "write_many_atomic",
    "write_dir_atomic",
    "append_line",
    "read_lines",
]


def write_atomic(path: str | Path, write: Callable[[Path], object], *, fsync: bool = False) -> Path:
    """Call ``write(tmp)`` then rename tmp over ``path``; tmp is removed if ``write`` fails.

    ``fsync``: flush the file to disk before the rename (checkpoints: survive a power loss).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_many_atomic(paths: list[Path], write: Callable[[list[Path]], object]) -> None:
    """Call ``write(tmps)`` (one temporary path per target, same order), then rename each over
    its target: files written together in one pass, each whole or not at all."""
    paths = [Path(p) for p in paths]
    tmps = [p.with_name(f"{p.name}.tmp{os.getpid()}") for p in paths]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmps)
        for tmp, path in zip(tmps, paths, strict=True):
            os.replace(tmp, path)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """``path`` holds ``text`` (UTF-8), entirely or not at all."""
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """``obj`` as indented JSON plus a newline."""
    return write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_dir_atomic(final: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp_dir)``, then swap ``tmp_dir`` into ``final`` (replacing an old one).

    Between the two renames ``final`` is briefly absent; a half-written folder never shows.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def append_line(f, line: str) -> None:
    """Append one line to an open text file with a single write, then flush it."""
    f.write(line.rstrip("\n") + "\n")
    f.flush()


def read_lines(path: str | Path) -> list[str]:
    """The complete lines of a log written by :func:`append_line` (a torn last line dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    return [line for line in lines[:-1] if line.strip()]  # the part after the last \n is torn
