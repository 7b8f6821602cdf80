"""Child processes of the project's own modules (``python -m dpr_cache.x ARGS``), used where a
measurement needs a fresh process: a peak resident set (``ru_maxrss``) is a high-water mark of a
whole process, so each memory probe (``train.chunk_size: auto``) runs in one of its own.

The child inherits this process's environment and finds this checkout's package first on
``PYTHONPATH``; its last line of standard output is one JSON object, the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ChildFailed", "child_env", "run_json_child"]

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
