"""The FAISS side of the index: build flat / HNSW / IVF-PQ from embedding shards, load it back,
configure and run inner-product search. Files under ``output_dir/index/``: faiss.index (row i is
passage row i of the passages file), passage_ids.txt (one id a line), meta.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dpr_cache.errors import InputError

__all__ = [
    "IndexSpec",
    "INDEX_FILE",
    "IDS_FILE",
    "META_FILE",
    "check_index_spec",
    "new_index",
    "configure_search",
    "search",
    "load_index",
]

INDEX_FILE = "faiss.index"
IDS_FILE = "passage_ids.txt"
META_FILE = "meta.json"
_MAX_TRAIN_ROWS = 1_000_000  # IVF-PQ training sample cap (rows held in memory)


@dataclass(frozen=True)
class IndexSpec:
    """The kind of FAISS index and its knobs (build time and search time)."""

    type: str = "flat"  # flat | hnsw | ivfpq
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    ivf_nlist: int | None = None  # default ~4*sqrt(N)
    pq_m: int = 16
    ivf_nprobe: int = 16


def _default_nlist(n: int) -> int:
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


def check_index_spec(spec: IndexSpec, n: int, dim: int) -> None:
    if spec.type != "ivfpq":
        return
    if dim % spec.pq_m:
        raise InputError(f"index.pq_m: {spec.pq_m} does not divide the embedding size {dim}")
    if spec.ivf_nlist is not None and spec.ivf_nlist > n:
        raise InputError(f"index.ivf_nlist: {spec.ivf_nlist} is more than the {n} passages")


def _gather_rows(shards: list[np.ndarray], shard_size: int, rows: np.ndarray) -> np.ndarray:
    parts = []
    for k, emb in enumerate(shards):
        lo = k * shard_size
        sel = rows[(rows >= lo) & (rows < lo + len(emb))] - lo
        if len(sel):
            parts.append(np.asarray(emb[sel]))
    return np.concatenate(parts)


def new_index(
    spec: IndexSpec, shards: list[np.ndarray], shard_size: int, n: int, dim: int
) -> tuple[faiss.Index, dict[str, Any]]:
    """An empty (trained, for IVF-PQ) index of ``spec.type`` and the parameters it was given."""
    if spec.type == "flat":
        return faiss.IndexFlatIP(dim), {}
    if spec.type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = spec.hnsw_ef_search
        return index, {"hnsw_m": spec.hnsw_m, "ef_construction": int(index.hnsw.efConstruction)}
    nlist = spec.ivf_nlist or _default_nlist(n)
    n_train = min(n, max(50 * nlist, 65_536), _MAX_TRAIN_ROWS)
    rows = np.sort(np.random.default_rng(0).choice(n, size=n_train, replace=False))
    train = np.ascontiguousarray(_gather_rows(shards, shard_size, rows), dtype=np.float32)
    nbits = 8 if n_train >= 256 else max(1, int(math.log2(n_train)))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, spec.pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
    index.train(train)  # faiss's Python wrapper keeps ``quantizer`` alive with ``index``
    params = {"nlist": nlist, "pq_m": spec.pq_m, "pq_nbits": nbits, "train_rows": n_train}
    return index, params


def configure_search(index: faiss.Index, spec: IndexSpec) -> faiss.Index:
    """Apply the search-time knobs (``ivf_nprobe``, ``hnsw_ef_search``) to a loaded index."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(spec.ivf_nprobe, ivf.nlist)
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = spec.hnsw_ef_search
    return index


def search(index: faiss.Index, q_embs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k inner-product search: (scores [n, k'], rows [n, k']), k' = min(k, index size);
    a row of -1 means no result (approximate indexes)."""
    q = np.ascontiguousarray(q_embs, dtype=np.float32)
    return index.search(q, max(1, min(k, index.ntotal)))


def load_index(index_dir: str | Path, *, with_ids: bool = True) -> tuple[faiss.Index, list, dict]:
    """(index, passage ids by row, meta); ids are [] when ``with_ids`` is False."""
    index_dir = Path(index_dir)
    files = [index_dir / name for name in (META_FILE, INDEX_FILE, IDS_FILE)]
    if not all(f.is_file() for f in files):
        raise InputError(f"no index at {index_dir}: run `dpr-cache index` first")
    meta = json.loads(files[0].read_text())
    index = faiss.read_index(str(files[1]))
    ids = files[2].read_text(encoding="utf-8").splitlines() if with_ids else []
    if index.ntotal != meta.get("n_passages") or (with_ids and len(ids) != index.ntotal):
        raise InputError(f"{index_dir}: index files disagree: rerun `dpr-cache index`")
    return index, ids, meta
