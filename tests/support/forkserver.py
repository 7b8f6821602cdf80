"""A fork server for the tests' ``dpr-cache`` commands: one process imports torch, transformers,
faiss, datasets and the CLI once, then forks a child per command. Each child is a process of its
own, as ``python -m dpr_cache ARGS`` would be (its exit code, signals, memory, working folder,
environment, stdout and stderr), without the seconds of imports a fresh interpreter spends.

What a forked child shares with the server and a fresh process would not: the modules imported
(and whatever they read from the environment as they were imported) and the hash seed. So a
command forks only where its environment is the one the server started with, but for the
variables pytest sets per test (:data:`PER_TEST`); a child runs with the command's own.

Protocol, one JSON object a line: the server says ``{"ready": true}`` once its imports are done;
for each request ``{"args", "cwd", "env", "out", "err"}`` it answers ``{"pid"}`` as the child
starts and ``{"rc"}`` as it ends (a negative rc: the signal that ended it).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

__all__ = ["ForkServer", "PER_TEST"]

PER_TEST = frozenset({"PYTEST_CURRENT_TEST"})


class ForkServer:
    """The client: a server process started with ``env``, and ``run`` for each command."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._read(timeout=300)  # {"ready": true}
        atexit.register(self.close)

    @staticmethod
    def may_serve(server_env: dict[str, str], env: dict[str, str]) -> bool:
        """Whether ``env`` is ``server_env`` but for :data:`PER_TEST`."""

        def fixed(e: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k not in PER_TEST}

        return fixed(env) == fixed(server_env)

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        """``python -m dpr_cache ARGS`` in a forked child; as ``subprocess.run`` with
        ``capture_output=True, text=True`` would return it (TimeoutExpired past ``timeout``)."""
        with tempfile.TemporaryDirectory(prefix="dpr-cache-fork-") as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            request = {"args": args, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            pid = self._read(timeout=60)["pid"]
            try:
                rc = self._read(timeout)["rc"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._read(timeout=60)
                raise subprocess.TimeoutExpired(["dpr-cache", *args], timeout) from None
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "dpr_cache", *args], rc, out.read_text(), err.read_text()
            )

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"the fork server did not answer in {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _preload() -> None:
    """What most commands import, so that a child finds it imported."""
    import datasets  # noqa: F401
    import faiss  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoTokenizer, BertModel  # noqa: F401

    import dpr_cache.cli.app  # noqa: F401
    import dpr_cache.model.biencoder  # noqa: F401
    import dpr_cache.train.trainer  # noqa: F401


def _child(request: dict) -> None:
    """In the forked child: become ``python -m dpr_cache ARGS`` run from ``cwd``; never
    returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.path[0] = os.getcwd()  # ``python -m`` puts the working folder first
        sys.argv = ["dpr_cache", *request["args"]]
        try:
            runpy.run_module("dpr_cache", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _exit_code(code) -> int:
    """What the interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _serve() -> None:
    _preload()
    requests, answers = sys.stdin.buffer, sys.stdout.buffer

    def answer(obj: dict) -> None:
        answers.write(json.dumps(obj).encode() + b"\n")
        answers.flush()

    answer({"ready": True})
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        answer({"pid": pid})
        _, status = os.waitpid(pid, 0)
        answer({"rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    _serve()
