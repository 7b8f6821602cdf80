"""Child processes of the project's own modules (``python -m dpr_cache.x ARGS``), used where a
measurement needs a fresh process: a peak resident set (``ru_maxrss``) is a high-water mark of a
whole process, so each memory probe (``train.chunk_size: auto``) runs in one of its own. Also
what a process knows of others (:func:`alive`, :func:`state`) and the set-up of the data-loader
workers it forks (:func:`loader_worker`), and a free port for a process group's rendezvous
(:func:`free_port`).

The child inherits this process's environment and finds this checkout's package first on
``PYTHONPATH``; its last line of standard output is one JSON object, the result.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = [
    "rank_process",
    "ChildFailed",
    "child_env",
    "run_json_child",
    "alive",
    "state",
    "worker_init",
    "free_port",
]

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the dpr_cache package


class ChildFailed(RuntimeError):
    """A child exited non-zero or printed no result; ``tail`` is its last line of stderr."""

    def __init__(self, module: str, returncode: int, tail: str):
        super().__init__(f"python -m {module}: exit {returncode}: {tail}")
        self.module, self.returncode, self.tail = module, returncode, tail


def child_env() -> dict[str, str]:
    """This process's environment with this package first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
    return env


def free_port() -> int:
    """A TCP port free on this machine now (a process group's rendezvous: torchrun's
    ``--master_port``, ``init_process_group``'s ``tcp://`` address)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_json_child(module: str, args: list[str]) -> dict:
    """Run ``python -m module *args`` to the end; return the JSON object on its last stdout line.

    Raises :class:`ChildFailed` when the child exits non-zero or prints nothing.
    """
    cmd = [sys.executable, "-m", module, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ChildFailed(module, done.returncode, tail[:300])
    return json.loads(lines[-1])


def state(pid: int) -> str:
    """A process's state letter in /proc (R, S, T stopped, Z ended, ...; "" when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (one that ended but was not reaped: no)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return state(pid) != "Z"


def worker_init(parent: int | None = None):
    """A DataLoader ``worker_init_fn`` for this process's workers (``parent``: its pid)."""
    return functools.partial(loader_worker, os.getpid() if parent is None else parent)


def loader_worker(parent: int, _worker_id: int) -> None:
    """Set up a data-loader worker forked by ``parent``: Ctrl-C and SIGTERM are the parent's (it
    checkpoints, then stops its workers), and on Linux the worker is killed when the parent
    ends however it ends; a worker of a ``kill -9``-ed parent would otherwise wait forever on
    a queue no one reads."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the worker ends when its queue fails
        return
    if os.getppid() != parent:  # the parent ended before the line above
        os._exit(1)


def rank_process(agent: int, rank: int) -> int | None:
    """The pid of rank ``rank`` of a torchrun agent (pid ``agent``): its child whose environment
    holds that RANK; None when there is none (yet, or any more)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().split(") ", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):  # ended while being read
            continue
        if parent == agent and f"RANK={rank}".encode() in environ:
            return int(pid)
    return None
