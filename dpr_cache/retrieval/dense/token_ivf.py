"""The fast paths of a multi-vector index: candidates from a FAISS index over the token vectors,
scored by exact MaxSim.

Every stored token goes into an IVF index whose id is the row of its passage (the
token-to-passage map is the index's own ids): ``index.type: ivf`` keeps float16 codes (IVF-SQfp16,
two bytes a dim), ``ivfpq`` product-quantized ones (``index.pq_m`` bytes a token, as PLAID's
compressed residuals keep a token small); each token's id adds 8 bytes. It is trained on a
sample of at most :data:`~dpr_cache.retrieval.dense.faiss_index.MAX_TRAIN_ROWS` tokens and
filled block by block into parts merged into on-disk inverted lists, as an IVF index of one
vector a passage is (:func:`~dpr_cache.retrieval.dense.faiss_index.write_ivf_on_disk`); search
maps them.

A search sends the tokens of a group of questions to ``index.ivf_nprobe`` lists each, for their
``max(index.ivf_token_hits * k, MIN_TOKEN_HITS)`` nearest tokens. A question's candidates are
the passages of its tokens' hits, shortlisted to the ``max(index.ivf_candidates * k,
MIN_CANDIDATES)`` of the highest sum of hits (each question token's best hit in the passage,
none adding zero), whose tokens are read by offset and scored by exact MaxSim; the top k of
those are the results. It is approximate: a passage none of whose tokens is among a question
token's nearest, or whose sum of hits is not in the shortlist, is not found. The group's hits
and the candidates' blocks come out of the memory budget; the mapped lists' pages do not.
Searched on one rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np

from dpr_cache.config import IndexConfig
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.faiss_index import trained_ivf, write_ivf_on_disk
from dpr_cache.retrieval.dense.maxsim import (
    QueryTokens,
    block_scores,
    plan_token_blocks,
    prepared,
)
from dpr_cache.retrieval.dense.search import Hits
from dpr_cache.retrieval.dense.tokens import TokenStore
from dpr_cache.runtime import memory

__all__ = [
    "MIN_CANDIDATES",
    "MIN_TOKEN_HITS",
    "QUESTION_GROUP",
    "build_token_ivf",
    "check_token_ivf",
    "token_ivf_search",
]

MIN_TOKEN_HITS = 64
"""The fewest nearest tokens each question token asks the index for."""
MIN_CANDIDATES = 256
"""The fewest passages a question's shortlist keeps."""
QUESTION_GROUP = 256
"""The most questions whose tokens are sent to the index at once (their hits held together;
fewer where the memory budget asks)."""
HIT_BYTES = 12
"""What one hit holds: its score (float32) and its passage row (int64)."""


def check_token_ivf(spec: IndexConfig, tokens: int, dim: int) -> None:
    """InputError when ``index.ivf_nlist`` is more than the tokens it would partition, or
    ``index.pq_m`` does not divide the token width (ivfpq)."""
    if spec.ivf_nlist is not None and spec.ivf_nlist > tokens:
        raise InputError(f"index.ivf_nlist: {spec.ivf_nlist} is more than the {tokens} tokens")
    if spec.type == "ivfpq" and dim % spec.pq_m:
        raise InputError(f"index.pq_m: {spec.pq_m} does not divide the token width {dim}")


def build_token_ivf(
    spec: IndexConfig, store: TokenStore, out: Path, block_tokens: int
) -> dict[str, Any]:
    """The IVF index (``spec.type``: ivf or ivfpq) of every token of ``store`` (ids: their
    passages' rows) into ``out``, its blocks of ``block_tokens`` tokens at most; returns its
    parameters."""
    check_token_ivf(spec, store.tokens, store.dim)
    index, params = trained_ivf(spec, store.tokens, store.dim, store.sample_tokens, flat_fp16=True)
    blocks = (
        (tokens, np.repeat(np.arange(start, start + len(offsets) - 1), np.diff(offsets)))
        for start, tokens, offsets in store.blocks(block_tokens)
    )
    write_ivf_on_disk(index, blocks, Path(out))
    return {**params, "ids": "passage rows"}


def token_ivf_search(
    index: faiss.Index,
    store: TokenStore,
    queries: np.ndarray,
    k: int,
    memory_bytes: int,
    spec: IndexConfig,
) -> Hits:
    """Each question's top ``k`` among its shortlisted candidates (the passages of its tokens'
    nearest tokens in ``index``), scored by exact MaxSim over ``store``, its hits and blocks
    within ``memory_bytes``; ``spec.ivf_token_hits`` and ``spec.ivf_candidates`` set how many
    candidates (module docstring)."""
    tokens, k, _ = prepared(store, queries, k, memory_bytes)
    longest = max(tokens.longest, 1)  # one question's candidates scored at a time
    hits = max(1, min(max(spec.ivf_token_hits * k, MIN_TOKEN_HITS), index.ntotal))
    per_question = 2 * HIT_BYTES * longest * hits  # its hits, and FAISS's heaps of them
    free = memory_bytes - memory.rss_bytes()
    group = int(max(1, min(QUESTION_GROUP, free // 4 // per_question)))
    one = QueryTokens(np.zeros((longest, store.dim), np.float32), np.array([0, longest]))
    plan = plan_token_blocks(memory_bytes - group * per_question, store, one, k)
    keep = max(spec.ivf_candidates * k, MIN_CANDIDATES)
    scores = np.full((tokens.n, k), -np.inf, np.float32)
    rows = np.full((tokens.n, k), -1, np.int64)
    reader = _Reader(store, plan.block_tokens, tokens.longest)
    for g0 in range(0, tokens.n, group):
        g1 = min(g0 + group, tokens.n)
        first = tokens.starts[g0]
        sims, found = index.search(tokens.tokens[first : tokens.starts[g1]], hits)
        for i in range(g0, g1):
            a, b = tokens.starts[i], tokens.starts[i + 1]
            if a == b:
                continue  # a question without a token finds nothing
            candidates = _shortlist(sims[a - first : b - first], found[a - first : b - first], keep)
            mine = QueryTokens(tokens.tokens[a:b], np.array([0, b - a], np.int64))
            scores[i], rows[i] = reader.top(mine, candidates, k)
    return Hits(scores, rows)


def _shortlist(sims: np.ndarray, found: np.ndarray, keep: int) -> np.ndarray:
    """The sorted passage rows of one question's hits (``found`` [its tokens, hits], -1 none;
    ``sims`` their scores), cut to the ``keep`` of the highest sum over its tokens of the
    token's best hit in the passage (zero where it has none)."""
    real = found >= 0
    rows, column = np.unique(found[real], return_inverse=True)
    if len(rows) <= keep:
        return rows
    best = np.full((len(found), len(rows)), -np.inf, np.float32)
    np.maximum.at(best, (np.nonzero(real)[0], column), sims[real])
    summed = np.where(np.isfinite(best), best, 0.0).sum(axis=0)
    top = np.argpartition(-summed, keep - 1)[:keep]
    return np.sort(rows[top])


class _Reader:
    """Buffers reused by every question of a search: a run of at most ``passages`` candidates'
    tokens as stored and as float32, and their scores against a question's tokens."""

    def __init__(self, store: TokenStore, block_tokens: int, question_tokens: int) -> None:
        self.store = store
        self.passages = max(1, block_tokens // max(store.longest, 1))
        size = self.passages * max(store.longest, 1)
        self.buffers = (
            np.empty((size, store.dim), store.dtype),
            np.empty((size, store.dim), np.float32),
        )
        self.sims = np.empty(max(question_tokens, 1) * size, np.float32)

    def top(
        self, question: QueryTokens, candidates: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """The question's top ``k`` of ``candidates`` (sorted passage rows) by exact MaxSim,
        their tokens read by offset a run at a time: scores and rows [k], -inf and -1 past the
        candidates."""
        found = np.full(len(candidates), -np.inf, np.float32)
        for start in range(0, len(candidates), self.passages):
            run = candidates[start : start + self.passages]
            tokens, offsets = self.store.take(run, self.buffers)
            found[start : start + len(run)] = block_scores(question, tokens, offsets, self.sims)[0]
        best = np.argsort(-found, kind="stable")[:k]
        scores = np.full(k, -np.inf, np.float32)
        rows = np.full(k, -1, np.int64)
        scores[: len(best)], rows[: len(best)] = found[best], candidates[best]
        return scores, rows
