"""Child processes of the project's own modules (``python -m dpr_cache.x ARGS``), used where a
measurement needs a fresh process: a peak resident set (``ru_maxrss``) is a high-water mark of a
whole process, so each benchmark point and each memory probe runs in one of its own.

The child inherits the environment with the offline defaults and finds this checkout's package
first on ``PYTHONPATH``; its last line of standard output is one JSON object, the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dpr_cache.runtime.offline import offline_env

__all__ = ["ChildFailed", "Measured", "child_env", "run_json_child", "run_measured"]

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the dpr_cache package


class ChildFailed(RuntimeError):
    """A child exited non-zero or printed no result; ``tail`` is its last line of stderr."""

    def __init__(self, module: str, returncode: int, tail: str):
        super().__init__(f"python -m {module}: exit {returncode}: {tail}")
        self.module, self.returncode, self.tail = module, returncode, tail


def child_env() -> dict[str, str]:
    """This process's environment, offline by default, with this package first on the path."""
    env = offline_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_ROOT, env.get("PYTHONPATH")]))
    return env


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


@dataclass
class Measured:
    """A finished command: exit code, wall seconds, peak resident memory, its output."""

    returncode: int
    seconds: float
    peak_rss: int  # bytes, the kernel's ru_maxrss of the child (as /usr/bin/time -v reports it)
    stdout: str
    stderr: str


_WAIT4 = (
    "import os, sys; pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ); "
    "_, status, usage = os.wait4(pid, 0); "
    "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}')"
)
"""A bare interpreter that spawns the command and reports its ``wait4`` figures: the command
starts from this small process, so its peak is its own (a child forked straight from a large
process would count that process's pages resident at the fork)."""


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run ``cmd`` to the end: exit code, wall time, and its own peak RSS (``ru_maxrss``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "wait4"
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        start = time.perf_counter()
        with open(out, "w") as fo, open(err, "w") as fe:
            wrapper = subprocess.run(
                [sys.executable, "-S", "-c", _WAIT4, str(report), *cmd],
                stdout=fo, stderr=fe, env=env, check=False,
            )  # fmt: skip
        seconds = time.perf_counter() - start
        if not report.is_file():  # the command could not even start
            return Measured(wrapper.returncode or 127, seconds, 0, out.read_text(), err.read_text())
        maxrss, code = (int(x) for x in report.read_text().split())
        return Measured(code, seconds, maxrss * 1024, out.read_text(), err.read_text())
