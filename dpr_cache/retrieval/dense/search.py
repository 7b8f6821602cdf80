"""Top-k inner-product search in bounded memory.

Exact (``flat``): the store is scanned block by block (:meth:`EmbeddingStore.blocks`, float32
scores from the stored vectors) with ``faiss.knn`` on each block and FAISS's ``ResultHeap`` keeping
each query's running top k; queries go in blocks too when their heaps would not fit. The block
sizes come from the memory budget less what the process already holds, so the peak resident
memory is set by the budget, not by the corpus. The budget bounds the whole process when given
(``--memory-gb``); unset, it lets the process grow by a headroom over what it holds when its
first search or build begins (:func:`~dpr_cache.runtime.memory.memory_limit`). Under
``torchrun`` each rank scans the shards ``k % world_size == rank`` and rank 0 merges the ranks'
top k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.store import EmbeddingStore
from dpr_cache.runtime import memory

__all__ = ["Hits", "BlockPlan", "plan_blocks", "exact_search", "index_search", "merge_hits"]

GB = 1e9
MIN_BLOCK_ROWS = 1024
_FIXED_BYTES = 96 * 2**20  # FAISS's BLAS tiles and result copies, allocator slack


@dataclass
class Hits:
    """Each query's top k, best first: ``scores`` [nq, k] float32 (-inf where there are fewer
    than k candidates) and ``rows`` [nq, k] int64 global store rows (-1 there)."""

    scores: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True)
class BlockPlan:
    """How many store rows and queries one step of the scan holds."""

    block_rows: int
    query_rows: int
    free_bytes: int  # what the budget left over the process when planned


def plan_blocks(
    memory_bytes: int,
    dim: int,
    itemsize: int,
    n_queries: int,
    k: int,
    used: int | None = None,
    *,
    held: int = 0,
    share: float = 1.0,
) -> BlockPlan:
    """Block sizes that keep the process under ``memory_bytes``: ``share`` of the part of the
    budget that neither the process (``used``, default its resident memory now) nor what the
    caller holds beside the blocks (``held``) takes goes, less a fixed allowance, 80% to the
    store block (stored rows plus their float32 copy), the rest to the queries' heaps and
    copies.

    Raises InputError, naming the ``--memory-gb`` that would fit, when not even
    ``MIN_BLOCK_ROWS`` rows fit.
    """
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    used = memory.rss_bytes() if used is None else used
    row_bytes = dim * itemsize + (0 if itemsize == 4 else 4 * dim)

    def free_and_rows(budget: int) -> tuple[int, int]:
        free = int((budget - used - held) * share) - _FIXED_BYTES
        return free, int(0.8 * max(free, 0)) // row_bytes

    free, block_rows = free_and_rows(memory_bytes)
    query_bytes = 4 * dim + 3 * 12 * k  # the query, its heap, faiss.knn's output and a merge copy
    query_rows = max(1, min(n_queries, int(0.2 * max(free, 0)) // query_bytes))
    if block_rows < MIN_BLOCK_ROWS:
        need = used + held + (_FIXED_BYTES + MIN_BLOCK_ROWS * row_bytes / 0.8) / share
        tenths = math.ceil(need / 1e8)  # the least --memory-gb, in tenths, these sums accept
        while free_and_rows(memory.memory_limit(tenths / 10))[1] < MIN_BLOCK_ROWS:
            tenths += 1
        held_part = f", and {held / GB:.2f} GB more while the index is built" if held else ""
        share_part = (
            f"with {share:.0%} of what is left for the blocks (the rest for the index being "
            "built), "
            if share < 1
            else ""
        )
        raise InputError(
            f"a memory budget of {memory_bytes / GB:.2f} GB is too small; this process already "
            f"holds {used / GB:.2f} GB{held_part}; {share_part}one block of {MIN_BLOCK_ROWS} "
            f"rows of {dim} needs about {need / GB:.2f} GB in all: give --memory-gb "
            f"{tenths / 10:.1f} or more"
        )
    return BlockPlan(block_rows, query_rows, free)


def merge_hits(parts: Sequence[Hits], k: int) -> Hits:
    """The top k of several partial results over disjoint rows (FAISS's ResultHeap)."""
    n = parts[0].scores.shape[0]
    heap = faiss.ResultHeap(n, k, keep_max=True)
    for part in parts:
        heap.add_result(np.ascontiguousarray(part.scores), np.ascontiguousarray(part.rows))
    heap.finalize()
    return _marked(Hits(heap.D, heap.I))


def _marked(hits: Hits) -> Hits:
    """``hits`` with -inf as the score of every missing hit (FAISS leaves -FLT_MAX there)."""
    hits.scores[hits.rows < 0] = -np.inf
    return hits


def exact_search(
    store: EmbeddingStore,
    queries: np.ndarray,
    k: int,
    memory_bytes: int,
    *,
    shards: Sequence[int] | None = None,
    on_rows: Callable[[int], object] | None = None,
) -> Hits:
    """The exact top ``k`` of ``queries`` [nq, dim] over ``store`` (or the shards given)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != store.dim:
        raise InputError(
            f"query vectors of shape {tuple(queries.shape)} against {store.dim}-d passages"
        )
    k = max(1, min(k, store.rows))
    plan = plan_blocks(memory_bytes, store.dim, store.dtype.itemsize, len(queries), k)
    scores = np.empty((len(queries), k), np.float32)
    rows = np.empty((len(queries), k), np.int64)
    for q0 in range(0, len(queries), plan.query_rows):
        q = queries[q0 : q0 + plan.query_rows]
        heap = faiss.ResultHeap(len(q), k, keep_max=True)
        for start, block in store.blocks(plan.block_rows, shards):
            kb = min(k, len(block))
            d, i = faiss.knn(q, block, kb, metric=faiss.METRIC_INNER_PRODUCT)
            if kb < k:  # pad a short block's result to k columns
                d = np.pad(d, ((0, 0), (0, k - kb)), constant_values=-np.inf)
                i = np.pad(i, ((0, 0), (0, k - kb)), constant_values=-1)
            heap.add_result(d, np.where(i >= 0, i + start, -1))
            if on_rows is not None and q0 == 0:
                on_rows(len(block))
        heap.finalize()
        scores[q0 : q0 + len(q)], rows[q0 : q0 + len(q)] = heap.D, heap.I
    return Hits(scores, rows)


def index_search(index: faiss.Index, queries: np.ndarray, k: int) -> Hits:
    """Search a FAISS index whose ids are global store rows (IVF, IVF-PQ, HNSW)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if queries.ndim != 2 or queries.shape[1] != index.d:
        raise InputError(
            f"query vectors of shape {tuple(queries.shape)} against a {index.d}-d index"
        )
    scores, rows = index.search(queries, max(1, min(k, index.ntotal)))
    return _marked(Hits(scores, rows.astype(np.int64)))
