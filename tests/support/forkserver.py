"""A fork server for the tests' commands: one process imports torch, transformers, faiss,
datasets and the CLI once, then forks a child per ``python -m MODULE ARGS`` or ``python -c CODE
ARGS``. Each child is a process of its own, as a fresh interpreter would be (its exit code,
signals, memory, working folder, environment, standard streams), without the seconds of imports
a fresh interpreter spends.

Two clients: :meth:`ForkServer.run` (the tests' ``dpr-cache`` commands, :mod:`tests.support.cli`)
and :meth:`ForkServer.python`, an executable that stands in for ``python`` where a script runs
``"$PY" -m ...`` (the studies' dry runs; :meth:`ForkServer.dpr_cache` stands in for
``dpr-cache``): it hands the server its own standard streams, relays signals to the child and
exits as the child did. A request the server cannot serve as a fresh
interpreter would (other options, or an environment that differs in what is read as modules are
imported, :func:`may_serve`) runs in a fresh interpreter instead.

What a forked child shares with the server and a fresh process would not: the modules imported
(and what they read from the environment as they were imported, hence :func:`may_serve`; a
package in the command's working folder does not replace the one imported), the hash seed, the
resource limits, its parent (the server) and its process group.

Protocol, on a Unix socket, one connection a command: the request is an 8-byte big-endian length
and a JSON object ``{"argv", "cwd", "env", "umask", "ignored"}`` (``ignored``: the signals the
client ignores, which the child ignores too), sent with the child's standard streams (three file
descriptors); ``argv`` is ``-m MODULE ARGS``, ``-c CODE ARGS`` or ``--entry MODULE:NAME ARGV0
ARGS`` (an installed command's entry point); the server answers one JSON line, ``{"pid"}`` as
the child starts (or ``{"fresh": true}``: run it in a fresh interpreter), then ``{"rc"}`` as it
ends (a negative rc: the signal that ended it). A client that goes away takes its child with it
(SIGKILL). The server ends when its standard input closes.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import types
from pathlib import Path

__all__ = ["ForkServer", "may_serve"]

_READ_AT_IMPORT_PREFIXES = (
    "PYTHON",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "CUDA_",
    "NVIDIA_",
    "TORCH",
    "PYTORCH_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "DATASETS_",
    "TQDM_",
    "FAISS_",
    "NUMBA_",
    "LD_",
    "MALLOC_",
    "LC_",
)
_READ_AT_IMPORT = frozenset(
    {"LANG", "HOME", "XDG_CACHE_HOME", "TMPDIR", "TEMP", "TMP", "TZ"}
    | {"USE_TORCH", "USE_TF", "USE_FLAX", "USE_JAX"}
)
FRESH = "DPR_CACHE_TESTS_FORK"
"""``DPR_CACHE_TESTS_FORK=0``: every command in a fresh interpreter (to tell a fork server's fault
from the command's)."""


# set by dpr-cache's CLI itself as it starts (runtime.quiet), whatever the server imported: a
# child applies them as a fresh interpreter does
_SET_BY_THE_CLI = frozenset({"TOKENIZERS_PARALLELISM", "TRANSFORMERS_VERBOSITY"})


def _read_at_import(name: str) -> bool:
    if name in _SET_BY_THE_CLI:
        return False
    return name in _READ_AT_IMPORT or name.startswith(_READ_AT_IMPORT_PREFIXES)


def may_serve(server_env: dict[str, str], env: dict[str, str]) -> bool:
    """Whether a child forked from a server started with ``server_env`` runs as a fresh
    interpreter with ``env`` would: the two agree on every variable read as the server's modules
    were imported (Python's own, the thread pools', CUDA's, Hugging Face's, the locale, the
    caches' folders)."""
    if env.get(FRESH) == "0":
        return False
    names = {k for k in (*server_env, *env) if _read_at_import(k)}
    return all(server_env.get(k) == env.get(k) for k in names)


class ForkServer:
    """A server process started with ``env``; :meth:`run` and :meth:`python` are its clients."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.forked = 0  # the commands :meth:`run` had forked
        self._dir = tempfile.mkdtemp(prefix="dpr-cache-fork-")
        self.socket = str(Path(self._dir) / "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forkserver", self.socket],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        line = self.proc.stdout.readline()  # {"ready": true} once the imports are done
        if not line:
            raise RuntimeError(f"the fork server did not start (exit {self.proc.wait()})")
        atexit.register(self.close)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess | None:
        """``python ARGV`` in a forked child, as ``subprocess.run`` with ``capture_output=True,
        text=True`` would return it (TimeoutExpired past ``timeout``); None where the server
        says to run it in a fresh interpreter."""
        command = [sys.executable, *argv]
        with tempfile.TemporaryDirectory(prefix="dpr-cache-fork-") as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            with (
                open(os.devnull, "rb") as stdin,
                open(out, "wb") as stdout,
                open(err, "wb") as stderr,
                socket.socket(socket.AF_UNIX) as conn,
            ):
                conn.settimeout(timeout)
                conn.connect(self.socket)
                request = {"argv": list(argv), "cwd": str(cwd), "env": dict(env)}
                request |= {"umask": _umask(), "ignored": []}
                body = json.dumps(request).encode()
                fds = [stdin.fileno(), stdout.fileno(), stderr.fileno()]
                socket.send_fds(conn, [struct.pack(">Q", len(body)) + body], fds)
                answers = conn.makefile("rb")
                pid = None
                try:
                    first = _answer(answers)
                    if first.get("fresh"):
                        return None
                    pid = first["pid"]
                    self.forked += 1
                    rc = _answer(answers)["rc"]
                except TimeoutError:
                    if pid is not None:
                        os.kill(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(
                        command, timeout, out.read_text(), err.read_text()
                    ) from None
            return subprocess.CompletedProcess(command, rc, out.read_text(), err.read_text())

    def python(self) -> Path:
        """An executable that runs ``-m MODULE ARGS`` and ``-c CODE ARGS`` in this server's
        children and anything else in a fresh ``sys.executable``: a stand-in for ``python``."""
        return self._stand_in("python", None, [sys.executable])

    def dpr_cache(self) -> Path:
        """The same for ``dpr-cache ARGS``: its entry point (``dpr_cache.cli:app``) in a child,
        or the installed command itself."""
        installed = Path(sys.executable).parent / "dpr-cache"
        fresh = [str(installed)] if installed.exists() else [sys.executable, "-m", "dpr_cache"]
        return self._stand_in("dpr-cache", "dpr_cache.cli:app", fresh)

    def _stand_in(self, name: str, entry: str | None, fresh: list[str]) -> Path:
        path = Path(self._dir) / name
        if not path.exists():
            code = _CLIENT.replace("@SOCKET@", repr(self.socket)).replace("@ENTRY@", repr(entry))
            path.write_text(f"#!{sys.executable} -S\n{code.replace('@FRESH@', repr(fresh))}")
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        for name in ("python", "dpr-cache", "socket"):
            Path(self._dir, name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _answer(answers) -> dict:
    line = answers.readline()
    if not line:
        raise RuntimeError("the fork server closed the connection without an answer")
    return json.loads(line)


_CLIENT = '''\
"""A command through a fork server where it can (see tests/support/forkserver.py)."""
import json, os, signal, socket, struct, sys

SOCKET, ENTRY, FRESH = @SOCKET@, @ENTRY@, @FRESH@
RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
           signal.SIGUSR2)
args = sys.argv[1:]
pid, pending = None, []


def end_by(number):
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    sys.exit(128 + number)


def fresh():
    for number in pending:  # a signal that came before the command started ends it here
        end_by(number)
    os.execv(FRESH[0], [*FRESH, *args])


def relay(number, frame):
    if pid is None:
        pending.append(number)
        return
    try:
        os.kill(pid, number)
    except OSError:
        pass


if ENTRY is not None:
    argv = ["--entry", ENTRY, sys.argv[0], *args]
elif len(args) >= 2 and args[0] in ("-m", "-c"):
    argv = args
else:
    fresh()
ignored = [
    int(number)
    for number in signal.valid_signals()
    if number not in (signal.SIGKILL, signal.SIGSTOP)
    and signal.getsignal(number) is signal.SIG_IGN
]
for number in RELAYED:
    if number not in ignored:
        signal.signal(number, relay)
mask = os.umask(0)
os.umask(mask)
try:
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(SOCKET)
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": mask,
               "ignored": ignored}
    body = json.dumps(request).encode()
    socket.send_fds(conn, [struct.pack(">Q", len(body)) + body], [0, 1, 2])
    answers = conn.makefile("rb")
    first = json.loads(answers.readline())
except (OSError, ValueError):
    fresh()
if first.get("fresh"):
    fresh()
pid = first["pid"]
for number in pending:
    relay(number, None)
line = answers.readline()
if not line:
    sys.exit(1)
rc = json.loads(line)["rc"]
if rc < 0:
    end_by(-rc)
sys.exit(rc)
'''


# -- the server ---------------------------------------------------------------------------


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


_INTERRUPTED = -1
""":func:`_run_main`'s code for a command ended by an uncaught KeyboardInterrupt."""


def _child(request: dict, fds: list[int], set_by_imports: dict[str, str]) -> None:
    """In the forked child: become ``python ARGV`` run from ``cwd`` with the request's
    environment (and the defaults the imports set in it), umask, ignored signals and standard
    streams, and end as that interpreter would; never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**set_by_imports, **request["env"]})
        os.umask(request["umask"])
        for number in request["ignored"]:
            signal.signal(number, signal.SIG_IGN)
        for fd, passed in enumerate(fds):
            os.dup2(passed, fd)
            os.close(passed)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty())
        code = _run_main(request["argv"])
        threading._shutdown()  # as an interpreter's exit: wait for the threads not daemonic
        atexit._run_exitfuncs()
        sys.modules["__main__"].__dict__.clear()  # what the command left open is closed
        gc.collect()
    finally:
        try:
            if not sys.stdout.closed:
                sys.stdout.flush()
        except Exception:
            code = 120  # what the interpreter exits with when its last flush fails
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if code == _INTERRUPTED:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _run_main(argv: list[str]) -> int:
    """``python -m MODULE ARGS``, ``python -c CODE ARGS`` or an installed command's entry point
    in this process, in a new ``__main__`` module, as the interpreter runs them; their exit
    code (:data:`_INTERRUPTED` for an uncaught KeyboardInterrupt)."""
    option, target, *args = argv
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    try:
        if option == "-m":
            if not sys.flags.safe_path:
                sys.path[0] = os.getcwd()
            sys.argv = ["-m", *args]
            runpy._run_module_as_main(target, alter_argv=True)
        elif option == "-c":
            if not sys.flags.safe_path:
                sys.path[0] = ""
            sys.argv = ["-c", *args]
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:  # --entry MODULE:NAME ARGV0 ARGS, as an installed command's script runs it
            sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
            sys.argv = args
            module, name = target.split(":")
            sys.exit(getattr(importlib.import_module(module), name)())
        return 0
    except SystemExit as stop:
        return _exit_code(stop.code)
    except BaseException as error:
        error = error.with_traceback(error.__traceback__.tb_next)  # from the command's frame
        sys.excepthook(type(error), error, error.__traceback__)
        return _INTERRUPTED if isinstance(error, KeyboardInterrupt) else 1


def _exit_code(code) -> int:
    """What the interpreter exits with for ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request and its descriptors; on a bad request, the descriptors closed and
    ValueError or OSError raised."""
    fds: list[int] = []
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        if len(data) < 8:
            raise ValueError("short request")
        size = struct.unpack(">Q", data[:8])[0]
        body = data[8:]
        while len(body) < size:
            more = conn.recv(size - len(body))
            if not more:
                raise ValueError("truncated request")
            body += more
        request = json.loads(body)
        if len(fds) != 3 or request["argv"][0] not in ("-m", "-c", "--entry"):
            raise ValueError("not a request this server serves")
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class _Server:
    def __init__(self, path: str, env: dict[str, str]) -> None:
        self.env = env  # as started, before the imports
        self.set_by_imports = {k: v for k, v in os.environ.items() if k not in env}
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
        self.children: dict[int, socket.socket] = {}

    def serve(self) -> None:
        print(json.dumps({"ready": True}), flush=True)
        while True:
            for key, _ in self.selector.select(timeout=0.05):
                if key.data == "accept":
                    self._start(self.listener.accept()[0])
                elif key.data == "stdin":
                    if not os.read(sys.stdin.fileno(), 4096):
                        self._stop()
                        return
                else:  # a client went away before its child ended
                    self.selector.unregister(key.fileobj)
                    _kill(key.data)
            self._reap()

    def _start(self, conn: socket.socket) -> None:
        conn.settimeout(30)  # a client that connects and says nothing does not hold the server
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError, KeyError, IndexError):
            conn.close()
            return
        try:
            if not may_serve(self.env, request["env"]):
                with contextlib.suppress(OSError):
                    conn.sendall(b'{"fresh": true}\n')
                conn.close()
                return
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                self.listener.close()
                for other in (conn, *self.children.values()):
                    other.close()
                _child(request, fds, self.set_by_imports)
        finally:
            for fd in fds:
                os.close(fd)
        self.children[pid] = conn
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the client is gone: so is its command
            _kill(pid)
            return
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _reap(self) -> None:
        while self.children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError):
                self.selector.unregister(conn)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()

    def _stop(self) -> None:
        for pid in list(self.children):
            _kill(pid)
        while self.children:
            pid, _ = os.waitpid(-1, 0)
            conn = self.children.pop(pid, None)
            if conn is not None:
                conn.close()
        self.listener.close()


def _kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    before = dict(os.environ)
    _preload()
    _Server(sys.argv[1], before).serve()
