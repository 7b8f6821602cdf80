"""Scale benchmark steps over vectors: 21M synthetic float16 vectors, the exact streamed search
at 1M, 4M and 21M, IVF-PQ at 4M and 21M, HNSW at 4M."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks import nq_like
from benchmarks.harness import matmul_gflops
from benchmarks.scale_common import (
    DIM,
    GB,
    IVF,
    MATMUL_SECONDS,
    MEMORY_GB,
    N_FULL,
    N_QUERIES,
    SHARD_ROWS,
    SIZES,
    K,
    cli,
    measured,
    search_cli,
)

# -- vectors and exact search ---------------------------------------------------------------------


def step_vectors(work: Path) -> dict:
    start = time.perf_counter()
    paths = nq_like.write_vectors(work / "vectors", N_FULL, DIM, SHARD_ROWS)
    nq_like.write_queries(work / "queries.npy", N_QUERIES, DIM)
    size = sum(p.stat().st_size for p in paths)
    return {
        "rows": N_FULL,
        "dim": DIM,
        "dtype": "float16",
        "shards": len(paths),
        "disk_gb": round(size / GB, 2),
        "seconds": round(time.perf_counter() - start, 1),
    }


def step_exact(work: Path) -> dict:
    out = {"memory_gb": MEMORY_GB, "queries": N_QUERIES, "k": K, "sizes": {}}
    out["matmul_gflops"] = round(matmul_gflops(N_QUERIES, DIM, seconds=MATMUL_SECONDS), 1)
    for name, pattern in SIZES.items():
        index = work / f"flat-{name}"
        measured(
            cli("index", "--embeddings", str(work / "vectors" / pattern), "--out", str(index)),
            work / "logs" / f"index-flat-{name}.txt",
        )
        rows = json.loads((index / "meta.json").read_text())["rows"]
        found = work / f"exact-{name}.trec"
        figures = measured(
            search_cli(index, work / "queries.npy", K, found, MEMORY_GB),
            work / "logs" / f"search-flat-{name}.txt",
        )
        figures["rows"] = rows
        figures["gflops"] = round(2 * N_QUERIES * rows * DIM / figures["seconds"] / 1e9, 1)
        out["sizes"][name] = figures
    out["matmul_gflops_after"] = round(matmul_gflops(N_QUERIES, DIM, seconds=MATMUL_SECONDS), 1)
    return out


# -- approximate indexes --------------------------------------------------------------------------


def _top(path: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        qid, _, pid, *_ = line.split()
        found.setdefault(qid, set()).add(pid)
    return found


def recall(run: Path, exact: Path) -> float:
    """Mean share of each query's exact top k that the run found."""
    got, want = _top(run), _top(exact)
    return round(float(np.mean([len(got.get(q, set()) & w) / len(w) for q, w in want.items()])), 4)


def _approximate(work: Path, kind: str, name: str, memory_gb: float, *extra: str) -> dict:
    index = work / f"{kind}-{name}"
    build = measured(
        cli(
            "index",
            "--embeddings",
            str(work / "vectors" / SIZES[name]),
            "--out",
            str(index),
            "--type",
            kind,
            "--memory-gb",
            str(memory_gb),
            *extra,
        ),
        work / "logs" / f"index-{kind}-{name}.txt",
    )
    size = sum(p.stat().st_size for p in index.glob("faiss.*"))
    run = work / f"{kind}-{name}.trec"
    search = measured(
        search_cli(index, work / "queries.npy", K, run, memory_gb, "--nprobe", "64"),
        work / "logs" / f"search-{kind}-{name}.txt",
    )
    meta = json.loads((index / "meta.json").read_text())
    shutil.rmtree(index)  # keep the disk for the next steps
    return {
        "build": build,
        "search": search,
        "index_gb": round(size / GB, 3),
        "recall_at_100": recall(run, work / f"exact-{name}.trec"),
        "params": meta["index_params"],
    }


def step_ivfpq(work: Path) -> dict:
    return {name: _approximate(work, "ivfpq", name, 8.0, *IVF) for name in ("4M", "21M")}


def step_hnsw(work: Path) -> dict:
    return {"4M": _approximate(work, "hnsw", "4M", 20.0)}
