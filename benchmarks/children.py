"""Benchmark figures from fresh processes: a command's wall time and its own peak resident
memory (``wait4``), and a module's JSON result, saved with its arguments so a rerun can keep it.

A peak resident set (``ru_maxrss``) is a high-water mark of a whole process, so every figure that
includes one comes from a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpr_cache.runtime.atomic import write_json_atomic
from dpr_cache.runtime.processes import ChildFailed, run_json_child

__all__ = ["Measured", "run_measured", "run_child_or_error", "cached_child_result"]


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
                stdout=fo,
                stderr=fe,
                env=env,
                check=False,
            )
        seconds = time.perf_counter() - start
        if not report.is_file():  # the command could not even start
            return Measured(wrapper.returncode or 127, seconds, 0, out.read_text(), err.read_text())
        maxrss, code = (int(x) for x in report.read_text().split())
        return Measured(code, seconds, maxrss * 1024, out.read_text(), err.read_text())


def run_child_or_error(module: str, payload: dict) -> dict:
    """The child's result, or the payload with ``error`` (exit code and last stderr line)."""
    try:
        return run_json_child(module, [json.dumps(payload)])
    except ChildFailed as e:
        return {**payload, "error": f"exit {e.returncode}: {e.tail[:200]}"}


def cached_child_result(
    module: str, args: dict, path: Path, reuse: bool, echo: Callable[[str], None]
) -> dict | None:
    """``module``'s result for ``args`` in a fresh process, saved in ``path`` with its args.

    With ``reuse``, a result saved for the same args is returned without running the child.
    A failed child is echoed and gives None (nothing is saved)."""
    if reuse and path.is_file():
        try:
            saved = json.loads(path.read_text())
            if saved["args"] == args:
                echo(f"{module}: kept from {path}")
                return saved["result"]
        except (ValueError, KeyError, TypeError):
            echo(f"{path}: not a saved result of this command; measuring again")
    result = run_child_or_error(module, args)
    if "error" in result:
        echo(f"{module}: {result['error']}")
        return None
    write_json_atomic(path, {"args": args, "result": result})
    return result
