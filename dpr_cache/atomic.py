"""Write a file so that readers never see half of it: write a temporary file, then rename."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["write_atomic", "write_json_atomic"]


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` then rename tmp over ``path``, so readers never see half a file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2) + "\n"))
