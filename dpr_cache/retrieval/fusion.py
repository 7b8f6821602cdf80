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
from dataclasses import dataclass

import numpy as np

__all__ = ["FUSIONS", "FusionSpec", "fuse_linear", "fuse_rrf", "fuse"]

FUSIONS = ("none", "linear", "rrf")
Ranking = tuple[np.ndarray, np.ndarray]  # (rows [n], scores [n]) best first; row -1: no passage


@dataclass(frozen=True)
class FusionSpec:
    """How the two rankings become one: the method, linear's dense weight (None: tuned on
    held-out questions), the candidates taken from each side, and RRF's constant."""

    method: str = "none"
    weight: float | None = 1.1
    depth: int = 1000
    rrf_k: int = 60


def _valid(ranking: Ranking) -> Ranking:
    rows, scores = ranking
    keep = rows >= 0
    return rows[keep].astype(np.int64), scores[keep].astype(np.float64)


def _ranked(rows: np.ndarray, scores: np.ndarray, k: int) -> Ranking:
    """The top ``k`` of (rows, scores): higher score first, ties by row."""
    order = np.lexsort((rows, -scores))[:k]
    return rows[order], scores[order]


def fuse_linear(
    dense: Ranking,
    sparse: Ranking,
    weight: float,
    dense_of: Callable[[np.ndarray], np.ndarray],
    sparse_of: Callable[[np.ndarray], np.ndarray],
    k: int,
) -> Ranking:
    """``BM25 + weight * dense`` over the union of both rankings' rows, top ``k``."""
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
    return _ranked(rows, sparse_all + weight * dense_all, k)


def fuse_rrf(rankings: Sequence[Ranking], k: int, rrf_k: int = 60) -> Ranking:
    """Reciprocal-rank fusion of the rankings (each best first), top ``k``."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, row in enumerate(_valid(ranking)[0].tolist(), start=1):
            scores[row] = scores.get(row, 0.0) + 1.0 / (rrf_k + rank)
    rows = np.fromiter(scores, dtype=np.int64, count=len(scores))
    return _ranked(rows, np.fromiter(scores.values(), dtype=np.float64, count=len(rows)), k)


def fuse(
    spec: FusionSpec,
    dense: list[Ranking],
    sparse: list[Ranking],
    k: int,
    *,
    dense_of: Callable[[int, np.ndarray], np.ndarray] | None = None,
    sparse_of: Callable[[int, np.ndarray], np.ndarray] | None = None,
    weight: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each question's fused top ``k``: (scores [n, k] float32, -inf where fewer; rows [n, k],
    -1 there). ``dense_of(i, rows)`` / ``sparse_of(i, rows)`` score question i's missing rows
    (linear only); ``weight`` replaces ``spec.weight``."""
    n = len(dense)
    out_rows = np.full((n, k), -1, np.int64)
    out_scores = np.full((n, k), -np.inf, np.float32)
    for i in range(n):
        if spec.method == "linear":
            w = spec.weight if weight is None else weight
            rows, scores = fuse_linear(
                dense[i], sparse[i], w, lambda r, i=i: dense_of(i, r),
                lambda r, i=i: sparse_of(i, r), k,
            )  # fmt: skip
        elif spec.method == "rrf":
            rows, scores = fuse_rrf([sparse[i], dense[i]], k, spec.rrf_k)
        else:
            raise ValueError(f"fusion method must be one of {FUSIONS[1:]}, got {spec.method!r}")
        out_rows[i, : len(rows)], out_scores[i, : len(rows)] = rows, scores
    return out_scores, out_rows
