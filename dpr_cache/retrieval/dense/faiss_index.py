"""Approximate FAISS indexes over an embedding store, built without holding all vectors.

- ``ivf`` (IVF-Flat) and ``ivfpq`` (IVF-PQ): the coarse quantizer (and PQ) are trained on a sample
  of at most ``MAX_TRAIN_ROWS`` rows; the store is then added block by block, each block into its
  own copy of the trained index written to disk, and the parts are merged into on-disk inverted
  lists (``faiss.ivfdata``, FAISS's ``OnDiskInvertedLists``) that search reads memory-mapped.
- ``hnsw``: the graph and its vectors must sit in RAM (FAISS cannot map them); refused with a
  clear error when its estimated size is over the memory budget.

Every index stores global store rows as ids, so results map to passages as the exact search's do.
Files: ``faiss.index`` (and ``faiss.ivfdata``) beside the index folder's ``meta.json``.
"""

from __future__ import annotations

import math
import shutil
import typing
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dpr_cache.config import IndexConfig
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.store import EmbeddingStore
from dpr_cache.runtime import memory
from dpr_cache.runtime.atomic import write_atomic

__all__ = [
    "search_knobs",
    "INDEX_TYPES",
    "INDEX_FILE",
    "IVF_DATA_FILE",
    "MAX_TRAIN_ROWS",
    "check_index_spec",
    "build_faiss_index",
    "trained_ivf",
    "write_ivf_on_disk",
    "default_nlist",
    "open_faiss_index",
    "configure_search",
    "hnsw_bytes",
]

INDEX_TYPES = typing.get_args(IndexConfig.model_fields["type"].annotation)
INDEX_FILE = "faiss.index"
IVF_DATA_FILE = "faiss.ivfdata"
MAX_TRAIN_ROWS = 1_000_000


def default_nlist(n: int) -> int:
    """IVF's lists for ``n`` vectors when ``index.ivf_nlist`` is unset: about 4 sqrt(n)."""
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


HNSW_BUILD_PEAK = 1.3
"""Peak RAM while an HNSW index is built, over its finished size: FAISS grows the vector storage
by doubling, and the last growth holds the old and the new buffer (measured: 17.2 GB peak for a
13.4 GB index of 4M x 768)."""


def hnsw_bytes(rows: int, dim: int, m: int, *, building: bool = False) -> int:
    """What an HNSW index of float32 vectors holds in RAM (the vectors and ~2M links a row),
    or, ``building``, the peak while it is built."""
    held = rows * (4 * dim + 2 * m * 4 + 16)
    return int(held * HNSW_BUILD_PEAK) if building else held


def check_index_spec(spec: IndexConfig, rows: int, dim: int, memory_gb: float | None) -> None:
    """InputError for a spec that cannot be built on these vectors, or whose index would not fit
    in ``memory_gb`` (given, the whole process's bound; unset, the headroom it may add)."""
    if spec.type not in INDEX_TYPES:
        raise InputError(f"index.type: {spec.type!r} is not one of {', '.join(INDEX_TYPES)}")
    if spec.type == "ivfpq" and dim % spec.pq_m:
        raise InputError(f"index.pq_m: {spec.pq_m} does not divide the embedding size {dim}")
    if spec.type in ("ivf", "ivfpq") and spec.ivf_nlist is not None and spec.ivf_nlist > rows:
        raise InputError(f"index.ivf_nlist: {spec.ivf_nlist} is more than the {rows} passages")
    if spec.type == "hnsw":
        need = hnsw_bytes(rows, dim, spec.hnsw_m, building=True)
        room = memory.HEADROOM_GB if memory_gb is None else memory_gb
        if need > room * 1e9:
            budget = (
                f"--memory-gb {memory_gb:g}"
                if memory_gb is not None
                else f"the {room:g} GB an unset --memory-gb lets the process add"
            )
            raise InputError(
                f"index.type hnsw: {rows} vectors of {dim} need about {need / 1e9:.1f} GB in RAM "
                f"to build ({hnsw_bytes(rows, dim, spec.hnsw_m) / 1e9:.1f} GB to search; HNSW "
                f"cannot be memory-mapped), over {budget}: use flat (exact, streamed) or ivfpq "
                "(on disk), or a larger budget"
            )


def _train_sample(store: EmbeddingStore, n_train: int) -> np.ndarray:
    rows = np.sort(np.random.default_rng(0).choice(store.rows, size=n_train, replace=False))
    return store.take(rows)


def trained_ivf(
    spec: IndexConfig,
    rows: int,
    dim: int,
    sample: Callable[[int], np.ndarray],
    *,
    flat_fp16: bool = False,
) -> tuple[faiss.Index, dict[str, Any]]:
    """An empty IVF index of ``spec.type`` (ivf: flat codes, float16 ones with ``flat_fp16``;
    ivfpq: ``spec.pq_m`` bytes a vector) for ``rows`` vectors of ``dim``, trained on
    ``sample(n)``'s n vectors, with the parameters it was given."""
    nlist = spec.ivf_nlist or default_nlist(rows)
    n_train = min(rows, max(50 * nlist, 65_536), MAX_TRAIN_ROWS)
    quantizer = faiss.IndexFlatIP(dim)
    params: dict[str, Any] = {"nlist": nlist, "train_rows": n_train}
    if spec.type == "ivf" and flat_fp16:
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, dim, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
        )
        params["codes"] = "fp16"
    elif spec.type == "ivf":
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    else:
        nbits = 8 if n_train >= 256 else max(1, int(math.log2(n_train)))
        index = faiss.IndexIVFPQ(
            quantizer, dim, nlist, spec.pq_m, nbits, faiss.METRIC_INNER_PRODUCT
        )
        params.update(pq_m=spec.pq_m, pq_nbits=nbits)
    index.train(sample(n_train))  # FAISS's Python wrapper keeps ``quantizer`` alive with ``index``
    return index, params


def build_faiss_index(
    spec: IndexConfig, store: EmbeddingStore, out: Path, block_rows: int
) -> dict[str, Any]:
    """Build ``spec.type`` over ``store`` into ``out`` (faiss.index, faiss.ivfdata); return the
    parameters it was given. Ids are global store rows."""
    out = Path(out)
    if spec.type == "hnsw":  # rows are added in order: HNSW's own ids are the global rows
        index = faiss.IndexHNSWFlat(store.dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        for _, block in store.blocks(block_rows):
            index.add(block)
        write_atomic(out / INDEX_FILE, lambda tmp: faiss.write_index(index, str(tmp)))
        return {"hnsw_m": spec.hnsw_m, "ef_construction": int(index.hnsw.efConstruction)}
    trained, params = trained_ivf(spec, store.rows, store.dim, partial(_train_sample, store))
    blocks = (
        (block, np.arange(start, start + len(block), dtype=np.int64))
        for start, block in store.blocks(block_rows)
    )
    write_ivf_on_disk(trained, blocks, out)
    return params


def write_ivf_on_disk(
    trained: faiss.Index, blocks: Iterable[tuple[np.ndarray, np.ndarray]], out: Path
) -> None:
    """Fill the trained IVF index with ``blocks`` (vectors [n, d] float32 and their ids [n]),
    each block into its own copy of it written to disk, the copies merged into on-disk inverted
    lists (``faiss.ivfdata``) and the index written as ``faiss.index`` into ``out``."""
    parts = Path(out) / "parts"
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    names = []
    for n, (block, ids) in enumerate(blocks):
        part = faiss.clone_index(trained)
        part.add_with_ids(block, ids)
        names.append(str(parts / f"part-{n:05d}.index"))
        faiss.write_index(part, names[-1])
        del part
    from faiss.contrib.ondisk import merge_ondisk

    (out / IVF_DATA_FILE).unlink(missing_ok=True)
    merge_ondisk(trained, names, str(out / IVF_DATA_FILE))
    write_atomic(out / INDEX_FILE, lambda tmp: faiss.write_index(trained, str(tmp)))
    shutil.rmtree(parts, ignore_errors=True)


def open_faiss_index(index_dir: Path, spec: IndexConfig) -> faiss.Index:
    """The index of ``index_dir`` with its inverted lists memory-mapped, search knobs applied."""
    path = Path(index_dir) / INDEX_FILE
    if not path.is_file():
        raise InputError(f"{path}: missing: rebuild the index")
    index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR)
    return configure_search(index, spec)


def search_knobs(index: faiss.Index | None) -> dict[str, int]:
    """The search-time knobs a loaded index is set to (none for flat): what its results depend
    on besides the queries."""
    if index is None:
        return {}
    ivf = faiss.try_extract_index_ivf(index)
    knobs = {"nprobe": int(ivf.nprobe)} if ivf is not None else {}
    if hasattr(index, "hnsw"):
        knobs["ef_search"] = int(index.hnsw.efSearch)
    return knobs


def configure_search(index: faiss.Index, spec: IndexConfig) -> faiss.Index:
    """Apply the search-time knobs (``ivf_nprobe``, ``hnsw_ef_search``) to a loaded index."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(spec.ivf_nprobe, ivf.nlist)
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = spec.hnsw_ef_search
    return index
