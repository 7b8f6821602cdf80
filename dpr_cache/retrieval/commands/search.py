"""``dpr-cache search``: queries against an index folder (fused with BM25 when asked), written
as a TREC run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpr_cache.data.passages import load_passages, passage_columns
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.faiss_index import IndexSpec
from dpr_cache.retrieval.dense.index import open_index, search_index
from dpr_cache.retrieval.dense.store import Shard, ids_path
from dpr_cache.retrieval.fusion import FusionSpec
from dpr_cache.retrieval.hybrid import dense_rankings, hybrid_search, open_sparse
from dpr_cache.retrieval.results import write_trec_run
from dpr_cache.runtime.lock import output_lock

__all__ = ["read_queries", "search_to_run", "HybridSearch"]


def read_queries(path: Path) -> tuple[np.ndarray, list[str]]:
    """Query vectors [n, d] float32 of a ``Q.npy`` and their ids (``Q.ids.txt`` beside it, else
    the row numbers)."""
    shard = Shard.open(path)
    vectors = shard.read(0, np.empty((shard.rows, shard.dim), shard.dtype)).astype(np.float32)
    ids_file = ids_path(Path(path))
    if not ids_file.is_file():
        return vectors, [str(i) for i in range(shard.rows)]
    ids = ids_file.read_text(encoding="utf-8").splitlines()
    if len(ids) != shard.rows:
        raise InputError(f"{ids_file}: {len(ids)} ids for the {shard.rows} rows of {path}")
    return vectors, ids


@dataclass(frozen=True)
class HybridSearch:
    """BM25 for ``search`` to fuse: from ``bm25_run`` (rrf), else built over ``passages`` (the
    index's own by default) for the question texts ``questions``."""

    fusion: FusionSpec
    cache_dir: Path
    questions: list[str] | None = None
    passages: Path | None = None
    bm25_run: Path | None = None


def search_to_run(
    index_dir: Path,
    queries: np.ndarray,
    qids: list[str],
    out: Path,
    *,
    k: int,
    memory_bytes: int,
    spec: IndexSpec | None = None,
    tag: str = "dpr-cache",
    rank: int = 0,
    world_size: int = 1,
    hybrid: HybridSearch | None = None,
) -> Path | None:
    """Search ``queries`` in the index (fused with BM25 per ``hybrid``); rank 0 writes the TREC
    run ``out`` and returns it."""
    with output_lock(out, is_file=True):
        return _search_to_run(index_dir, queries, qids, Path(out), k, memory_bytes, spec, tag,
                              rank, world_size, hybrid)  # fmt: skip


def _search_to_run(index_dir, queries, qids, out, k, memory_bytes, spec, tag, rank, world_size,
                   hybrid):  # fmt: skip
    opened = open_index(index_dir, spec)
    if hybrid is None:
        hits = search_index(opened, queries, k, memory_bytes, rank=rank, world_size=world_size)
        if hits is None:
            return None
        pids = opened.store.ids_of(hits.rows)
    else:
        if hybrid.questions is None and hybrid.bm25_run is None:
            raise InputError(
                "search --fusion: BM25 needs the question texts (--questions) or a run "
                "(--bm25-run) keyed by the query ids"
            )
        passages = hybrid.passages or Path(opened.meta.get("passages", {}).get("path", ""))
        if not passages.name:
            raise InputError(f"{index_dir}: records no passages file: give --passages TSV")
        dataset = load_passages(passages, hybrid.cache_dir)
        dense = dense_rankings(opened, dataset, passages, queries, max(hybrid.fusion.depth, k),
                               memory_bytes, rank=rank, world_size=world_size)  # fmt: skip
        if dense is None:
            return None
        sparse = open_sparse(passages, dataset, hybrid.cache_dir, hybrid.bm25_run, hybrid.fusion)
        hits = hybrid_search(opened, dataset, passages, queries, hybrid.questions or qids, qids,
                             sparse, hybrid.fusion, k, dense)  # fmt: skip
        valid = np.unique(hits.rows[hits.rows >= 0])
        ids = dict(zip(valid.tolist(), passage_columns(dataset, valid.tolist())["id"],
                       strict=True))  # fmt: skip
        pids = np.array([[ids.get(int(r), "") for r in row] for row in hits.rows], dtype=object)
    write_trec_run(Path(out), qids, pids, hits.scores, tag)
    return Path(out)
