"""BM25 fused with the dense ranking, per question, over passage rows.

- ``linear`` (DPR's hybrid, Karpukhin et al. 2020, section 5.1): over the union of each side's top
  ``depth``, ``score = BM25(q, p) + weight * sim(q, p)``. A passage only one side ranked has its
  other score computed (``dense_of``: the question's vector with the passage's stored vector;
  ``sparse_of``: the BM25 index scores every passage), never guessed.
- ``rrf`` (reciprocal-rank fusion, Cormack et al. 2009; ranx's ``rrf``): ``score = sum over the
  sides that ranked p of 1 / (k + rank)``, ranks from 1. It needs no score, so a BM25 run brought
  from pyserini or Anserini fuses this way.

Ties are broken by passage row, so a fused ranking is the same on every run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dpr_cache.config import EvalConfig

__all__ = ["linear_scores", "fuse_linear", "fuse_rrf", "fuse"]

Ranking = tuple[np.ndarray, np.ndarray]  # (rows [n], scores [n]) best first; row -1: no passage


def _valid(ranking: Ranking) -> Ranking:
    rows, scores = ranking
    keep = rows >= 0
    return rows[keep].astype(np.int64), scores[keep].astype(np.float64)


def _ranked(rows: np.ndarray, scores: np.ndarray, k: int) -> Ranking:
    """The top ``k`` of (rows, scores): higher score first, ties by row."""
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]


def linear_scores(sparse: np.ndarray, dense: np.ndarray, weight: float) -> np.ndarray:
    """The linear hybrid's score of passages: ``BM25 + weight * dense`` (float64)."""
    return np.asarray(sparse, np.float64) + weight * np.asarray(dense, np.float64)


def fuse_linear(
    dense: Ranking,
    sparse: Ranking,
    weights: Sequence[float],
    dense_of: Callable[[np.ndarray], np.ndarray],
    sparse_of: Callable[[np.ndarray], np.ndarray],
    k: int,
) -> list[Ranking]:
    """``BM25 + weight * dense`` over the union of both rankings' rows, top ``k``, for each of
    ``weights`` (the missing scores computed once for all of them)."""
    (d_rows, d_scores), (s_rows, s_scores) = _valid(dense), _valid(sparse)
    rows = np.union1d(d_rows, s_rows)  # [u] sorted
    dense_all = np.empty(len(rows))
    sparse_all = np.empty(len(rows))
    in_d, in_s = np.isin(rows, d_rows), np.isin(rows, s_rows)
    dense_all[np.searchsorted(rows, d_rows)] = d_scores
    sparse_all[np.searchsorted(rows, s_rows)] = s_scores
    if (~in_d).any():
        dense_all[~in_d] = dense_of(rows[~in_d])
    if (~in_s).any():
        sparse_all[~in_s] = sparse_of(rows[~in_s])
    return [_ranked(rows, linear_scores(sparse_all, dense_all, w), k) for w in weights]


def fuse_rrf(rankings: Sequence[Ranking], k: int, rrf_k: int = 60) -> Ranking:
    """Reciprocal-rank fusion of the rankings (each best first), top ``k``."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(_valid(ranking)[0].tolist(), start=1):
            scores[row] = scores.get(row, 0.0) + 1.0 / (rrf_k + rank)
    rows = np.fromiter(scores, dtype=np.int64, count=len(scores))
    return _ranked(rows, np.fromiter(scores.values(), dtype=np.float64, count=len(rows)), k)


def fuse(
    spec: EvalConfig,
    dense: list[Ranking],
    sparse: list[Ranking],
    k: int,
    *,
    dense_of: Callable[[int, np.ndarray], np.ndarray] | None = None,
    sparse_of: Callable[[int, np.ndarray], np.ndarray] | None = None,
    weights: Sequence[float] | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each question's fused top ``k`` by ``spec.fusion`` (``eval.fusion*``), once for each
    linear weight of ``weights`` (default: ``spec.fusion_weight``; rrf has none, so one): a
    list of (scores [n, k] float32, -inf where fewer; rows [n, k], -1 there).
    ``dense_of(i, rows)`` / ``sparse_of(i, rows)`` score question i's missing rows (linear
    only)."""
    grid = (spec.fusion_weight,) if weights is None else tuple(weights)
    if spec.fusion == "rrf":
        grid = (None,)
    n = len(dense)
    out = [(np.full((n, k), -np.inf, np.float32), np.full((n, k), -1, np.int64)) for _ in grid]
    for i in range(n):
        if spec.fusion == "linear":
            fused = fuse_linear(
                dense[i],
                sparse[i],
                grid,
                lambda r, i=i: dense_of(i, r),
                lambda r, i=i: sparse_of(i, r),
                k,
            )
        else:
            fused = [fuse_rrf([sparse[i], dense[i]], k, spec.fusion_rrf_k)]
        for (scores, rows), (r, s) in zip(out, fused, strict=True):
            rows[i, : len(r)], scores[i, : len(r)] = r, s
    return out
