"""What the scale benchmark's steps share: sizes, and commands run and measured in a fresh
process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from benchmarks.harness import option_args, run_measured
from dpr_cache.runtime.atomic import write_text_atomic
from dpr_cache.runtime.processes import child_env

TINY = os.environ.get("DPR_CACHE_SCALE_TINY") == "1"
"""A rehearsal of every step in seconds, at toy sizes (CI runs it; the labels stay)."""

N_FULL = 20_000 if TINY else 21_015_324  # psgs_w100.tsv
DIM = 32 if TINY else 768
SHARD_ROWS = 2_500 if TINY else 500_000
N_QUERIES = 50 if TINY else 3_610  # nq-test
K = 100
SIZES = {"1M": "part-0000[0-1].npy", "4M": "part-0000[0-7].npy", "21M": "part-*.npy"}
TSV_ROWS = {"1M": SHARD_ROWS * 2, "4M": SHARD_ROWS * 8, "21M": N_FULL}
JSON_GB = (0.001, 0.002, 0.004) if TINY else (1, 2, 4)
IVF = ["--nlist", "64", "--pq-m", "8"] if TINY else ["--nlist", "4096", "--pq-m", "64"]
TOKENIZE_ROWS = 2_000 if TINY else 40_000
MATMUL_SECONDS = 1.0 if TINY else 20.0
MEMORY_GB = 2.0
GB = 1e9


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dpr_cache", *args]


def search_cli(index: Path, queries: Path, k: int, out: Path, memory_gb, *more: str) -> list[str]:
    """``dpr-cache search`` of precomputed query vectors."""
    options = {"--index": index, "--query-embeddings": queries, "--k": k, "--out": out}
    return cli("search", *option_args({**options, "--memory-gb": memory_gb}), *more)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def measured(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` in a fresh process: its wall seconds and peak RSS; its output to ``log``."""
    done = run_measured(cmd, env=child_env())
    write_text_atomic(log, " ".join(cmd) + "\n" + done.stdout + "\n--- stderr ---\n" + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed ({done.returncode}); see {log}")
    return {"seconds": round(done.seconds, 2), "peak_rss_gb": round(done.peak_rss / GB, 3)}
