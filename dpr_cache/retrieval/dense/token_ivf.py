"""The fast path of a multi-vector index (``index.type: ivf``): candidates from a FAISS index over
the token vectors, scored by exact MaxSim.

Every stored token goes into an IVF index of float16 codes (IVF-SQfp16, inner product) whose id
is the row of its passage: the token-to-passage map is the index's own ids. It is trained on a
sample of at most :data:`~dpr_cache.retrieval.dense.faiss_index.MAX_TRAIN_ROWS` tokens and filled
block by block into parts merged into on-disk inverted lists, as an IVF index of one vector a
passage is (:func:`~dpr_cache.retrieval.dense.faiss_index.write_ivf_on_disk`); search maps them.

A search sends each question token to ``index.ivf_nprobe`` lists for its
``max(TOKEN_HITS_PER_K * k, MIN_TOKEN_HITS)`` nearest tokens; their passages are the question's
candidates, whose tokens are read by offset a block at a time (the memory plan of the exact
search) and scored by exact MaxSim; the top k of those are the results. It is approximate: a
passage none of whose tokens is among a question token's nearest is not found. Questions are
searched one at a time, on one rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dpr_cache.config import IndexConfig
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.faiss_index import (
    MAX_TRAIN_ROWS,
    default_nlist,
    write_ivf_on_disk,
)
from dpr_cache.retrieval.dense.maxsim import QueryTokens, block_scores, prepared
from dpr_cache.retrieval.dense.search import Hits, _marked
from dpr_cache.retrieval.dense.tokens import TokenStore

__all__ = [
    "MIN_TOKEN_HITS",
    "TOKEN_HITS_PER_K",
    "build_token_ivf",
    "check_token_ivf",
    "token_ivf_search",
]

TOKEN_HITS_PER_K = 2
"""Nearest tokens each question token asks the index for, per passage asked of the search."""
MIN_TOKEN_HITS = 64
"""The fewest nearest tokens each question token asks the index for."""


def check_token_ivf(spec: IndexConfig, tokens: int) -> None:
    """InputError when ``index.ivf_nlist`` is more than the tokens it would partition."""
    if spec.ivf_nlist is not None and spec.ivf_nlist > tokens:
        raise InputError(f"index.ivf_nlist: {spec.ivf_nlist} is more than the {tokens} tokens")


def build_token_ivf(
    spec: IndexConfig, store: TokenStore, out: Path, block_tokens: int
) -> dict[str, Any]:
    """The IVF-SQfp16 index of every token of ``store`` (ids: their passages' rows) into
    ``out``, its blocks of ``block_tokens`` tokens at most; returns its parameters."""
    check_token_ivf(spec, store.tokens)
    nlist = spec.ivf_nlist or default_nlist(store.tokens)
    n_train = min(store.tokens, max(50 * nlist, 65_536), MAX_TRAIN_ROWS)
    quantizer = faiss.IndexFlatIP(store.dim)
    index = faiss.IndexIVFScalarQuantizer(
        quantizer, store.dim, nlist, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
    )
    index.train(store.sample_tokens(n_train))
    blocks = (
        (tokens, np.repeat(np.arange(start, start + len(offsets) - 1), np.diff(offsets)))
        for start, tokens, offsets in store.blocks(block_tokens)
    )
    write_ivf_on_disk(index, blocks, Path(out))
    return {"nlist": nlist, "train_tokens": n_train, "codes": "fp16", "ids": "passage rows"}


def token_ivf_search(
    index: faiss.Index, store: TokenStore, queries: np.ndarray, k: int, memory_bytes: int
) -> Hits:
    """Each question's top ``k`` among its candidates (the passages of its tokens' nearest
    tokens in ``index``), scored by exact MaxSim over ``store`` within ``memory_bytes``."""
    tokens, k, plan = prepared(store, queries, k, memory_bytes)
    hits = max(1, min(max(TOKEN_HITS_PER_K * k, MIN_TOKEN_HITS), index.ntotal))
    scores = np.full((tokens.n, k), -np.inf, np.float32)
    rows = np.full((tokens.n, k), -1, np.int64)
    for i in range(tokens.n):
        mine = QueryTokens.of(queries[i : i + 1])
        if mine.starts[-1] == 0:
            continue  # a question without a token finds nothing
        _, found = index.search(mine.tokens, hits)
        candidates = np.unique(found[found >= 0])
        best = _score_candidates(store, mine, candidates, k, plan.block_tokens)
        scores[i], rows[i] = best.scores[0], best.rows[0]
    return Hits(scores, rows)


def _score_candidates(
    store: TokenStore, question: QueryTokens, candidates: np.ndarray, k: int, block_tokens: int
) -> Hits:
    """One question's top ``k`` of ``candidates`` (sorted passage rows) by exact MaxSim, their
    tokens read by offset in runs of about ``block_tokens`` tokens."""
    heap = faiss.ResultHeap(1, k, keep_max=True)
    chunk = max(1, block_tokens // max(store.longest, 1))
    for start in range(0, len(candidates), chunk):
        picked = candidates[start : start + chunk]
        passage_tokens, offsets = store.take(picked)
        found = block_scores(question, passage_tokens, offsets)
        heap.add_result(found, picked[None, :])
    heap.finalize()
    return _marked(Hits(heap.D, heap.I))
