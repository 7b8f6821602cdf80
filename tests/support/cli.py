"""Run the real CLI in a subprocess, as a user would (offline, this checkout's package)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from dpr_cache.runtime.processes import child_env
from tests.support.fixtures import REPO

__all__ = ["run_cli", "popen_cli", "toy_overrides", "free_port"]


def free_port() -> int:
    """A TCP port free on this machine now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(
    *args: str, cwd: Path = REPO, check: bool = True, world: int = 1, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m dpr_cache ARGS`` to the end, under ``torchrun --nproc_per_node WORLD`` when
    ``world`` > 1 (one thread a rank); with ``check``, AssertionError on a non-zero exit."""
    launcher = [sys.executable]
    env = child_env()
    if world > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc_per_node={world}"]
        launcher += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
        env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [*launcher, "-m", "dpr_cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dpr-cache {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


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
