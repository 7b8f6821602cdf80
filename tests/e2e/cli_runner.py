"""Run the real CLI in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def cli_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(*args: str, cwd: Path = REPO, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "dpr_cache", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dpr-cache {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc


def popen_cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dpr_cache", *args],
        cwd=REPO,
        env=cli_env(),
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
