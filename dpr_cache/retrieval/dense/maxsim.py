"""Exact late-interaction (MaxSim) search over a :class:`~dpr_cache.retrieval.dense.tokens.
TokenStore` in bounded memory: the score of question q and passage p is the sum over q's real
tokens t of the max over p's tokens u of ``<q_t, p_u>``, as
:func:`dpr_cache.core.similarity.scores` defines it (a passage without a token scores
:data:`~dpr_cache.core.similarity.EMPTY_SCORE`). A question without a token finds nothing:
its rows are -1 and its scores -inf, as on the fast paths (:mod:`.token_ivf`).

Questions are [n, L, dim] token vectors, padding the zero vector. They are scanned in blocks of
whole questions, and for each block the store is read in blocks of whole passages
(:meth:`TokenStore.blocks`): one float32 product of the block's question tokens by the block's
passage tokens, its max over each passage's range of tokens (``np.maximum.reduceat``), its sum
over each question's tokens (``np.add.reduceat``), and FAISS's ``ResultHeap`` keeping each
question's running top k. The block sizes come from the memory budget less what the process
holds (:func:`plan_token_blocks`), so the peak is set by the budget, not by the corpus.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import faiss
import numpy as np

from dpr_cache.core.similarity import EMPTY_SCORE
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.search import _FIXED_BYTES, GB, Hits, _marked
from dpr_cache.retrieval.dense.tokens import TokenStore
from dpr_cache.runtime import memory

__all__ = [
    "MIN_BLOCK_TOKENS",
    "PAIR_BYTES",
    "QueryTokens",
    "TokenPlan",
    "block_scores",
    "maxsim_search",
    "plan_token_blocks",
    "row_maxsim",
]

MIN_BLOCK_TOKENS = 1024
"""The fewest passage tokens a store block is planned for (more when one passage has more)."""
PAIR_BYTES = 16
"""What one (question token, passage token) pair of a block holds at most: its product, and its
share of the per-passage max, the per-question sum and the block's scores (float32 each)."""


@dataclass(frozen=True)
class QueryTokens:
    """Questions as their real tokens: ``tokens`` [t, dim] float32, question i's being rows
    ``starts[i] : starts[i + 1]``."""

    tokens: np.ndarray
    starts: np.ndarray  # [n + 1] int64

    @classmethod
    def of(cls, queries: np.ndarray) -> QueryTokens:
        """The real (non-zero) token vectors of ``queries`` [n, L, dim]."""
        real = np.any(queries != 0, axis=-1)  # [n, L]
        starts = np.concatenate([[0], np.cumsum(real.sum(axis=1))]).astype(np.int64)
        return cls(np.ascontiguousarray(queries[real], dtype=np.float32), starts)

    @property
    def n(self) -> int:
        """The questions."""
        return len(self.starts) - 1

    @property
    def longest(self) -> int:
        """The most tokens a question has."""
        return int(np.diff(self.starts).max()) if self.n else 0

    def groups(self, max_tokens: int) -> Iterator[tuple[int, int]]:
        """Runs ``(first, past-the-last)`` of whole questions of ``max_tokens`` tokens at most
        (one question at least)."""
        i = 0
        while i < self.n:
            j = int(np.searchsorted(self.starts, self.starts[i] + max_tokens, side="right")) - 1
            j = min(max(j, i + 1), self.n)
            yield i, j
            i = j


@dataclass(frozen=True)
class TokenPlan:
    """How many passage tokens a store block holds and how many question tokens a query
    block."""

    block_tokens: int
    query_tokens: int
    free_bytes: int  # what the budget left over the process when planned


def _token_bytes(dim: int, itemsize: int) -> int:
    """What one passage token of a block holds: its stored row, its float32 copy, and its
    offset."""
    return dim * itemsize + (0 if itemsize == 4 else 4 * dim) + 8


def plan_token_blocks(
    memory_bytes: int,
    store: TokenStore,
    queries: QueryTokens,
    k: int,
    used: int | None = None,
) -> TokenPlan:
    """Block sizes that keep the process under ``memory_bytes``: what the process holds
    (``used``, default its resident memory now), the top-k heaps and a fixed allowance come
    off first; then as many question tokens a block as leave a store block of
    :data:`MIN_BLOCK_TOKENS` (or the longest passage), so that the store is read as few times
    as it can be; then the store block as large as what is left allows.

    Raises InputError, naming the ``--memory-gb`` that would fit, when one question's tokens
    against the smallest store block do not fit."""
    used = memory.rss_bytes() if used is None else used
    token_bytes = _token_bytes(store.dim, store.dtype.itemsize)
    heaps = 2 * 12 * k * queries.n  # each question's heap and its result rows
    min_block = min(max(MIN_BLOCK_TOKENS, store.longest), max(store.tokens, store.longest, 1))
    min_query = max(queries.longest, 1)

    def need(q: int, block: int) -> int:
        return block * token_bytes + q * (block * PAIR_BYTES + 4 * store.dim)

    free = memory_bytes - used - _FIXED_BYTES - heaps
    if free < need(min_query, min_block):
        least = used + _FIXED_BYTES + heaps + need(min_query, min_block)
        raise InputError(
            f"a memory budget of {memory_bytes / GB:.2f} GB is too small; this process already "
            f"holds {used / GB:.2f} GB; a block of {min_block} passage tokens against a "
            f"question of {min_query} tokens ({store.dim}-d) needs about {least / GB:.2f} GB "
            f"in all: give --memory-gb {math.ceil(least / 1e8) / 10:.1f} or more"
        )
    per_query = min_block * PAIR_BYTES + 4 * store.dim
    total_q = max(int(queries.starts[-1]), min_query)
    q = min(total_q, max(min_query, (free - min_block * token_bytes) // per_query))
    block = (free - 4 * store.dim * q) // (token_bytes + q * PAIR_BYTES)
    block = max(min_block, min(block, max(store.tokens, 1)))
    return TokenPlan(int(block), int(q), int(free))


def block_scores(
    queries: QueryTokens, tokens: np.ndarray, offsets: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """[n questions, n passages] float32 MaxSim of ``queries`` against one block's passages
    (``tokens`` [t, dim] float32, passage j's rows ``offsets[j] : offsets[j + 1]``).
    ``out``: a float32 buffer of at least ``len(queries.tokens) * t`` for the token scores."""
    n_q, n_p = queries.n, len(offsets) - 1
    p_real = np.flatnonzero(np.diff(offsets) > 0)
    q_real = np.flatnonzero(np.diff(queries.starts) > 0)
    if len(q_real) == n_q and len(p_real) == n_p and n_q and n_p:
        return _maxsim(queries, q_real, tokens, offsets[p_real], out)
    scores = np.zeros((n_q, n_p), np.float32)
    if len(p_real) and len(q_real):
        scores[np.ix_(q_real, p_real)] = _maxsim(queries, q_real, tokens, offsets[p_real], out)
    scores[:, np.diff(offsets) == 0] = EMPTY_SCORE
    return scores


def _maxsim(
    queries: QueryTokens,
    q_real: np.ndarray,
    tokens: np.ndarray,
    p_starts: np.ndarray,
    out: np.ndarray | None,
) -> np.ndarray:
    """[questions q_real, passages] MaxSim of the questions with a token against the passages
    with one (their tokens beginning at ``p_starts`` of ``tokens``): one float32 product of the
    tokens, its max over each passage's tokens, its sum over each question's."""
    t_q, t_p = len(queries.tokens), len(tokens)
    sim = np.empty(t_q * t_p, np.float32) if out is None else out[: t_q * t_p]
    sim = sim.reshape(t_q, t_p)
    np.matmul(queries.tokens, tokens.T, out=sim)  # [question tokens, passage tokens]
    best = np.maximum.reduceat(sim, p_starts, axis=1)  # [question tokens, passages]
    return np.add.reduceat(best, queries.starts[q_real], axis=0)  # [questions, passages]


def maxsim_search(
    store: TokenStore,
    queries: np.ndarray,
    k: int,
    memory_bytes: int,
    *,
    shards: Sequence[int] | None = None,
) -> Hits:
    """The exact MaxSim top ``k`` of ``queries`` [n, L, dim] (padding zero) over ``store``
    (or the shards given), within ``memory_bytes``."""
    tokens, k, plan = prepared(store, queries, k, memory_bytes)
    scores = np.empty((tokens.n, k), np.float32)
    rows = np.empty((tokens.n, k), np.int64)
    for q0, q1 in tokens.groups(plan.query_tokens):
        part = QueryTokens(
            tokens.tokens[tokens.starts[q0] : tokens.starts[q1]],
            tokens.starts[q0 : q1 + 1] - tokens.starts[q0],
        )
        hits = _scan(store, part, k, plan, shards)
        scores[q0:q1], rows[q0:q1] = hits.scores, hits.rows
    empty = np.diff(tokens.starts) == 0
    scores[empty], rows[empty] = -np.inf, -1
    return Hits(scores, rows)


def prepared(
    store: TokenStore, queries: np.ndarray, k: int, memory_bytes: int
) -> tuple[QueryTokens, int, TokenPlan]:
    """The questions' real tokens, ``k`` cut to the passages there are, and the block plan
    within ``memory_bytes``; InputError for question vectors of another width."""
    queries = np.asarray(queries, dtype=np.float32)
    if queries.ndim != 3 or queries.shape[2] != store.dim:
        raise InputError(
            f"question token vectors of shape {tuple(queries.shape)} against {store.dim}-d "
            "passage tokens"
        )
    k = max(1, min(k, store.rows))
    tokens = QueryTokens.of(queries)
    return tokens, k, plan_token_blocks(memory_bytes, store, tokens, k)


def _scan(
    store: TokenStore, part: QueryTokens, k: int, plan: TokenPlan, shards: Sequence[int] | None
) -> Hits:
    """One block of questions against every store block: their top ``k``."""
    heap = faiss.ResultHeap(part.n, k, keep_max=True)
    every = np.arange(part.n, dtype=np.int64)
    size = max(len(part.tokens), 1) * max(plan.block_tokens, store.longest)
    buffer = np.empty(size, np.float32)
    for start, block, offsets in store.blocks(plan.block_tokens, shards):
        found = block_scores(part, block, offsets, buffer)
        ids = np.arange(start, start + found.shape[1], dtype=np.int64)
        heap.add_result_subset(every, found, ids)
    heap.finalize()
    return _marked(Hits(heap.D, heap.I))


def row_maxsim(store: TokenStore, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """[len(rows)] float32: the MaxSim of one question ``query`` [L, dim] (padding zero)
    against the passages ``rows`` of ``store`` (a few: their tokens are read by offset)."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if not len(rows):
        return np.zeros(0, np.float32)
    tokens, offsets = store.take(rows)
    return block_scores(QueryTokens.of(np.asarray(query)[None]), tokens, offsets)[0]
