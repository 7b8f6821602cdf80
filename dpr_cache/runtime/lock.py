"""One command at a time on an output: an exclusive lock on a lock file of the folder
(``<folder>/.dpr-cache.lock``) or file (``.<name>.lock`` beside it) it writes, held for the
command's life. It is a POSIX record lock (``lockf``): owned by the process, not passed to the
children it forks (data-loader workers, which may outlive a killed parent by seconds), released
by the kernel when the process ends however it ends, so a crash or a ``kill -9`` never leaves it
stuck; it works on NFS too. The file names the holder (pid, host, command, start), so a
second command is refused at once with a message that says who holds it.

Within a process the lock is re-entrant: a command's entry point takes it before its heavy
imports (a second command is refused at once), and the work it calls, which takes the same lock,
finds it held by this process and goes on (a POSIX lock taken twice and closed once would be
released under the outer holder).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from dpr_cache.errors import InputError

__all__ = ["output_lock", "lock_path", "LOCK_NAME"]

LOCK_NAME = ".dpr-cache.lock"
_HELD: set[Path] = set()  # the lock files this process holds (pid-checked: a fork holds none)
_OWNER = [os.getpid()]


def lock_path(target: Path, is_file: bool = False) -> Path:
    """The lock file of an output: inside a folder, or beside a file (hidden)."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock") if is_file else target / LOCK_NAME


@contextlib.contextmanager
def output_lock(target: str | Path, *, is_file: bool = False) -> Iterator[None]:
    """Hold the lock of ``target`` (a folder, or with ``is_file`` a file's path) for the block;
    InputError naming the holder when another process holds it. Under ``torchrun`` rank 0
    holds it for the run and the other ranks take nothing."""
    if not is_file and Path(target).is_file():  # said on every rank
        raise InputError(f"{target}: a file: give the folder to write into")
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    path = lock_path(Path(target), is_file).absolute()
    if _OWNER[0] != os.getpid():  # a forked child: its parent's locks are not its own
        _HELD.clear()
        _OWNER[0] = os.getpid()
    if path in _HELD:  # this process holds it already (its entry point took it)
        yield
        return
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]  # deepest first
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    held = False
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except OSError:  # EACCES or EAGAIN: held by another process
            raise InputError(
                f"{target}: in use by {_holder(fd)}: wait for it to end, or write somewhere else"
            ) from None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": " ".join(["dpr-cache", *sys.argv[1:]])[:300],
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        _HELD.add(path)
        yield
    finally:
        _HELD.discard(path)
        if held and made and _only(path):  # a command that wrote nothing in the folder it made
            path.unlink()  # while held: no other process holds this file
        os.close(fd)  # releases the lock
        _remove_empty(made)


def _only(path: Path) -> bool:
    """True when the lock file is all its folder holds."""
    try:
        return os.listdir(path.parent) == [path.name]
    except OSError:  # the folder is gone (a command that put another in its place)
        return False


def _remove_empty(folders: list[Path]) -> None:
    """The folders this lock made (deepest first) that are still empty: a command that stopped
    before writing anything leaves no empty folder."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # something was written there, or another command made it its own
            return


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        who = json.loads(text)
        return f"pid {who['pid']} on {who['host']} since {who['started']} ({who['command']})"
    except (ValueError, KeyError, TypeError):
        return "another process (its lock file says no more)"
