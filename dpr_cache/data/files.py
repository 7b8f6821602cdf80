"""Open input files, plain or gzip-compressed, with clear errors for missing ones."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import IO

from dpr_cache.errors import InputError

_GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    """True when the file starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def check_file(path: Path) -> Path:
    """Return ``path`` if it is an existing file, else raise InputError."""
    path = Path(path)
    if not path.exists():
        from dpr_cache.data.download import fetch_hint

        raise InputError(f"{path}: no such file{fetch_hint(path)}")
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    return path


def open_binary(path: Path) -> IO[bytes]:
    """Open a file for reading bytes, decompressing gzip transparently."""
    path = check_file(path)
    return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")


def open_text(path: Path) -> IO[str]:
    """Open a UTF-8 text file (BOM skipped) for reading, gzip transparently; newline='' for csv."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")
