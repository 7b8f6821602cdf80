"""Run the real CLI in a process of its own, as a user would (offline, this checkout's package):
forked from a server that has the heavy imports done (:mod:`tests.support.forkserver`), or a
fresh interpreter under ``torchrun`` or in an environment other than the server's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dpr_cache.runtime.processes import child_env, free_port
from tests.support.fixtures import REPO
from tests.support.forkserver import ForkServer, may_serve

__all__ = [
    "run_cli",
    "run_cli_env",
    "popen_cli",
    "toy_overrides",
    "fork_server_ready",
    "fork_python",
    "fork_bin",
    "settle_environment",
    "commands_forked",
]


_server: ForkServer | None = None
_base_env: dict[str, str] | None = None


def settle_environment() -> None:
    """Take this process's environment, as it is now, for the fork server's. The suite calls it
    once the tests are collected (tests/conftest.py): collecting imports the test modules, and
    some of their imports set variables read as modules are imported (scikit-learn's ``KMP_*``,
    torch's compiler's ``TORCHINDUCTOR_CACHE_DIR``). Taken before them, it would agree with no
    test's environment, and every command would start a fresh interpreter."""
    global _base_env
    _base_env = child_env()


def _server_env() -> dict[str, str]:
    """The fork server's environment: the one :func:`settle_environment` took (now, if not yet)."""
    if _base_env is None:
        settle_environment()
    return _base_env


def _fork_server() -> ForkServer:
    """This test process's fork server (started on first use, again if it ended)."""
    global _server
    if _server is None or not _server.alive():
        _server = ForkServer(_server_env(), REPO)
    return _server


def commands_forked() -> int:
    """How many :func:`run_cli` commands this test process's fork server has forked (0 before
    it started; the stand-ins of :func:`fork_python` and :func:`fork_bin` are not counted)."""
    return _server.forked if _server is not None and _server.alive() else 0


def fork_server_ready() -> None:
    """Start this test process's fork server now, where a test times a command against another
    process's progress and the server's start must not fall in that window."""
    _fork_server()


def fork_python() -> str:
    """A stand-in for ``python`` (a script's ``$PY``) that forks ``-m`` and ``-c`` commands from
    this test process's fork server (:meth:`ForkServer.python`)."""
    return str(_fork_server().python())


def fork_bin() -> str:
    """A folder holding stand-ins for ``python`` and ``dpr-cache`` (to put first on ``PATH``)."""
    server = _fork_server()
    server.dpr_cache()
    return str(server.python().parent)


def run_cli(
    *args: str, cwd: Path = REPO, check: bool = True, world: int = 1, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m dpr_cache ARGS`` to the end, under ``torchrun --nproc_per_node WORLD`` when
    ``world`` > 1 (one thread a rank); with ``check``, AssertionError on a non-zero exit."""
    return _run_in(child_env(), args, cwd, check, world, timeout)


def run_cli_env(
    changes: dict[str, str | None], *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess:
    """:func:`run_cli` in this environment changed by ``changes`` (a value None: unset)."""
    env = child_env()
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return _run_in(env, args, REPO, check, 1, timeout)


def _run_in(env, args, cwd: Path, check: bool, world: int, timeout: float):
    proc = None
    if world == 1 and may_serve(_server_env(), env):
        proc = _fork_server().run(["-m", "dpr_cache", *args], cwd, env, timeout)
    if proc is None:
        proc = _spawn(args, cwd, env, world, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"dpr-cache {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def _spawn(args, cwd: Path, env: dict[str, str], world: int, timeout: float):
    """A fresh interpreter (``world`` > 1: under torchrun)."""
    launcher = [sys.executable]
    if world > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={world}"]
        launcher += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
        env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [*launcher, "-m", "dpr_cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def popen_cli(*args: str) -> subprocess.Popen:
    """``python -m dpr_cache ARGS`` started in the background (to signal it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "dpr_cache", *args],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def toy_overrides(tmp_path: Path, **extra) -> list[str]:
    """Small, fast settings on the committed toy corpus, writing only under tmp_path."""
    settings = {
        "output_dir": str(tmp_path / "run"),
        "data.cache_dir": str(tmp_path / "cache"),
        "train.batch_size": 16,
        "train.chunk_size": 4,
        "train.max_steps": 6,
        "train.checkpoint_every": 3,
        "train.num_threads": 1,
        **extra,
    }
    args = []
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    return args


def encode_args(model: Path, out: Path, *extra: str) -> list[str]:
    """``encode`` of the toy passages by ``model`` into ``out``, ``extra`` flags last."""
    passages = str(REPO / "data" / "toy" / "passages.tsv")
    return ["encode", "--model", str(model), "--passages", passages, "--out", str(out), *extra]


def bm25_args(command: str, out: Path, *extra: str) -> list[str]:
    """``score --teacher bm25`` or ``mine --ranker bm25`` of the toy training file over the toy
    passages, into ``out``."""
    flag = {"score": "--teacher", "mine": "--ranker"}[command]
    toy = REPO / "data" / "toy"
    passages, train = str(toy / "passages.tsv"), str(toy / "train.jsonl")
    return [
        command,
        flag,
        "bm25",
        "--passages",
        passages,
        "--train",
        train,
        "--out",
        str(out),
        *extra,
    ]


def index_toy(root: Path, model: Path) -> Path:
    """``index`` of the toy config's passages by ``model`` into ``root`` (its data cache
    there too); the index folder."""
    sets = {"output_dir": root, "data.cache_dir": root / "cache"}
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    run_cli("index", "--config", "configs/toy.yaml", "--model", str(model), "-q", *args)
    return root / "index"


def run_benchmark(
    name: str, *args: str, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m benchmarks.NAME ARGS`` from the repository root, as its page says to run
    it, with ``env`` added to the environment: the finished process (stdout, stderr,
    returncode)."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=REPO,
        env={**child_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
