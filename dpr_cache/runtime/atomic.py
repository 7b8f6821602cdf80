"""Every file and folder the project writes: whole or not at all, and a full disk said so.

A file is written under a temporary name beside it (``X.tmp<pid>``), then renamed over the target
(``os.replace`` is atomic on POSIX), so a reader, or a run that crashed half-way, never sees half
a file. A folder (a saved model, a checkpoint) is written as ``.tmp-X-<pid>`` and swapped into
place, the one it replaces moved aside as ``.old-X-<pid>`` for the instant between the renames.
What a killed process left (its temporaries; an old folder it had moved aside but not replaced)
is cleared, or put back, by the next write of the same target. Logs that grow a line at a time
(``append_line``) write each line with one call; their readers drop a torn last line
(``read_lines``).

A write that runs out of space (``ENOSPC``, a quota, a file-size limit) raises
:class:`DiskFull`: one line naming the file, what it needs and what is free; the partial
temporary is removed and the earlier version of the target, if any, is untouched.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from dpr_cache.errors import InputError
from dpr_cache.runtime.processes import alive

__all__ = [
    "DiskFull",
    "out_of_space",
    "check_output_file",
    "check_output_folder",
    "write_atomic",
    "write_text_atomic",
    "write_json_atomic",
    "write_many_atomic",
    "write_dir_atomic",
    "append_line",
    "read_lines",
]

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NEARLY_FULL = 1 << 20  # bytes: a write error without an errno where less is free is a full disk


class DiskFull(OSError):
    """A write that did not fit: the message names the file, the space it needs and the space
    free where it goes, or the file size limit it met (``ulimit -f``: errno EFBIG)."""

    def __init__(self, path: Path, needed: int | None, written: int = 0, code: int | None = None):
        path = Path(path)
        free = shutil.disk_usage(_existing(path.parent)).free
        need = f"about {_human(needed)}" if needed else f"over {_human(written)}"
        limit = _file_size_limit()
        if code == errno.EFBIG or (code is None and limit is not None and written >= limit):
            message = (
                f"cannot write {path}: it needs {need}, over this process's file size "
                f"limit of {_human(limit or 0)} (ulimit -f): raise the limit and run "
                "again (what was written before is kept)"
            )
        else:
            message = (
                f"no space left to write {path}: it needs {need}, {_human(free)} are "
                "free there; free some space and run again (what was written before is "
                "kept)"
            )
        super().__init__(errno.ENOSPC, message)
        self.path, self.needed, self.free, self.code = path, needed, free, code

    def __str__(self) -> str:
        return self.strerror


def _file_size_limit() -> int | None:
    """This process's file size limit in bytes (``RLIMIT_FSIZE``), None when unlimited."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def _human(n: int) -> str:
    """Bytes as a person reads them: 10.2 KB, 3.1 MB, 2.4 GB."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} bytes"


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _clear_left_behind(path: Path) -> None:
    """Remove the temporaries a dead process left for ``path``; put back an old folder it had
    moved aside when ``path`` itself is missing (it died between the two renames)."""
    name = re.escape(path.name)
    pattern = re.compile(rf"(?:{name}\.tmp(\d+)|\.tmp-{name}-(\d+)|\.old-{name}-(\d+))")
    if not path.parent.is_dir():
        return
    for sibling in path.parent.iterdir():
        match = pattern.fullmatch(sibling.name)
        if not match or alive(int(next(g for g in match.groups() if g))):
            continue
        if match.group(3) and not path.exists():
            sibling.rename(path)  # the complete old version: the new one never landed
        elif sibling.is_dir():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)


def _full(error: Exception, path: Path) -> bool:
    """Whether ``error`` is the disk (or a quota, or a size limit) running out: its errno says
    so, or it has none (a library's short write: numpy's OSError, torch's and FAISS's
    RuntimeError) and almost nothing is left where it wrote."""
    if isinstance(error, DiskFull):
        return False
    code = getattr(error, "errno", None)
    if code in _FULL:
        return True
    if code is not None:
        return False
    limit = _file_size_limit()  # a library's short write at the size limit
    if limit is not None and _size(path.with_name(f"{path.name}.tmp{os.getpid()}")) >= limit:
        return True
    return shutil.disk_usage(_existing(path.parent)).free < _NEARLY_FULL


def out_of_space(error: BaseException, path: Path) -> bool:
    """Whether ``error``, met while writing under ``path``, is the disk (or a quota, or a size
    limit) running out."""
    return isinstance(error, DiskFull) or (isinstance(error, Exception) and _full(error, path))


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def check_output_file(
    out: str | Path,
    inputs: Mapping[str, str | Path | None],
    folders: Mapping[str, str | Path | None] | None = None,
) -> None:
    """InputError, before anything is written, when the file a command will write is a folder,
    is one of the files it reads (``inputs``) or lies in a folder it reads (``folders``), each
    named as the message should say it."""
    out = Path(out)
    if out.is_dir():
        raise InputError(f"{out}: a folder: give the path of the file to write")
    for name, path in inputs.items():
        if path is not None and _same_file(Path(path), out):
            raise InputError(f"{out}: the output must not overwrite {name}")
    for name, folder in (folders or {}).items():
        if folder is not None and out.resolve().is_relative_to(Path(folder).resolve()):
            raise InputError(f"{out}: the output must not go into {name} ({folder})")


def check_output_folder(
    out: str | Path, inputs: Mapping[str, str | Path], own: Collection[str]
) -> None:
    """InputError, before anything is written, when the folder a command writes whole (swapped
    in, the one before it removed) is a file, is or holds one of the command's ``inputs``, or
    holds anything but the entries the command itself writes there (``own``)."""
    out = Path(out)
    if out.is_file():
        raise InputError(f"{out}: a file: give the folder to write")
    for name, path in inputs.items():
        if Path(path).resolve().is_relative_to(out.resolve()):
            raise InputError(f"{out}: holds {name}, which writing it would remove")
    other = sorted(p.name for p in out.iterdir() if p.name not in own) if out.is_dir() else []
    if other:
        shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
        raise InputError(
            f"{out}: holds {shown}, which writing it would remove: give a new folder, or an "
            "earlier one of this command's"
        )


def _same_file(a: Path, b: Path) -> bool:
    """One file by its path (links followed) or, both existing, by its inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    return a.exists() and b.exists() and os.path.samefile(a, b)


def write_atomic(
    path: str | Path,
    write: Callable[[Path], object],
    *,
    fsync: bool = False,
    size_hint: int | None = None,
) -> Path:
    """Call ``write(tmp)`` then rename tmp over ``path``; tmp is removed if ``write`` fails.

    ``fsync``: flush the file to disk before the rename (checkpoints: survive a power loss).
    ``size_hint``: the bytes the file will take, for the message when the disk is full.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _clear_left_behind(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        if _full(e, path):
            written = _size(tmp)
            tmp.unlink(missing_ok=True)
            raise DiskFull(path, size_hint, written, getattr(e, "errno", None)) from None
        raise
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
        _clear_left_behind(p)
    try:
        write(tmps)
        for tmp, path in zip(tmps, paths, strict=True):
            os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        if _full(e, paths[0]):
            written = sum(_size(t) for t in tmps)
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise DiskFull(paths[0], None, written, getattr(e, "errno", None)) from None
        raise
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """``path`` holds ``text`` (UTF-8), entirely or not at all."""
    data = text.encode("utf-8")
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), size_hint=len(data))


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """``obj`` as indented JSON plus a newline."""
    return write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def write_dir_atomic(
    final: str | Path, write: Callable[[Path], object], *, size_hint: int | None = None
) -> Path:
    """Call ``write(tmp_dir)``, then swap ``tmp_dir`` into ``final`` (replacing an old one).

    Between the two renames ``final`` is briefly absent; a half-written folder never shows, and
    a process killed between them leaves the old folder aside for the next write to put back.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    _clear_left_behind(final)
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, RuntimeError) as e:
        if isinstance(e, DiskFull) or _full(e, final):  # named after the folder, not its part
            written = _size(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            code = e.code if isinstance(e, DiskFull) else getattr(e, "errno", None)
            raise DiskFull(final, size_hint, written, code) from None
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def append_line(f, line: str) -> None:
    """Append one line to an open text file with a single write, then flush it; a full disk
    is :class:`DiskFull` naming the file."""
    try:
        f.write(line.rstrip("\n") + "\n")
        f.flush()
    except OSError as e:
        if _full(e, Path(f.name)):
            raise DiskFull(Path(f.name), len(line) + 1, code=e.errno) from None
        raise


def read_lines(path: str | Path) -> list[str]:
    """The complete lines of a log written by :func:`append_line` (a torn last line dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    return [line for line in lines[:-1] if line.strip()]  # the part after the last \n is torn
