"""Hybrid retrieval for ``eval`` and ``search``: the dense index's top ``depth`` and BM25's (built
with bm25s over the passages file, or a TREC run brought from pyserini or Anserini) fused per
``eval.fusion*`` (:class:`~dpr_cache.config.EvalConfig`), and linear fusion's weight picked on
held-out questions. Rows are the passages file's rows throughout."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpr_cache.config import EvalConfig
from dpr_cache.data.answers import has_answer
from dpr_cache.data.passages import passage_columns, passage_rows
from dpr_cache.errors import InputError
from dpr_cache.retrieval.dense.index import Corpus, row_scores, search_index
from dpr_cache.retrieval.dense.search import Hits
from dpr_cache.retrieval.fusion import Ranking, fuse
from dpr_cache.retrieval.lexical import Bm25Index
from dpr_cache.retrieval.metrics import first_relevant_rank, hit_metrics
from dpr_cache.retrieval.results import read_trec_run

__all__ = [
    "TUNING_GRID",
    "Sparse",
    "Tuning",
    "open_sparse",
    "dense_rankings",
    "hybrid_search",
    "fused_search",
    "tune_weight",
]

log = logging.getLogger(__name__)

TUNING_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 1.1, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
               200.0, 500.0, 1000.0)  # fmt: skip
"""Linear weights tried: BM25 scores run to tens; dense scores from about 1 (cosines) to about
100 (DPR's dot products), so the weight that balances them spans five decades."""


@dataclass
class Sparse:
    """BM25's side: an index that scores any passage, or a run's ranking per question id."""

    index: Bm25Index | None = None
    run: dict[str, Ranking] | None = None
    source: str = ""

    def rankings(self, questions: Sequence[str], qids: Sequence[str], depth: int) -> list:
        if self.index is not None:
            return self.index.search(list(questions), depth)
        empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
        missing = [q for q in qids if q not in self.run]
        if missing:
            log.warning(
                "%s: no ranking for %d of %d questions (first %r): BM25 adds nothing to them",
                self.source,
                len(missing),
                len(qids),
                missing[0],
            )
        return [tuple(a[:depth] for a in self.run.get(q, empty)) for q in qids]


def open_sparse(
    corpus: Corpus, cache_dir: Path, run: str | Path | None, spec: EvalConfig
) -> Sparse:
    """BM25 from ``run`` (a TREC run; RRF only, as the config's check says) or built over the
    corpus's passages (saved, reused).
    Rank 0 alone fuses, so it alone opens BM25, once every collective search is done: a first
    build can take long, and no rank waits on it."""
    if run is None:
        return Sparse(index=Bm25Index.open(corpus.path, cache_dir), source=str(corpus.path))
    ranked = read_trec_run(Path(run))  # qid -> [(pid, score)] best first
    pids = [pid for pairs in ranked.values() for pid, _ in pairs]
    rows = passage_rows(corpus.dataset, pids)  # one lookup for the whole run
    if (rows < 0).any():
        bad = int(np.flatnonzero(rows < 0)[0])
        qid = next(q for q, pairs in ranked.items() if any(p == pids[bad] for p, _ in pairs))
        raise InputError(f"{run}: passage {pids[bad]!r} (question {qid}) is not in {corpus.path}")
    by_qid, start = {}, 0
    for qid, pairs in ranked.items():
        by_qid[qid] = (
            rows[start : start + len(pairs)],
            np.array([s for _, s in pairs], np.float32),
        )
        start += len(pairs)
    return Sparse(run=by_qid, source=str(run))


def dense_rankings(
    corpus: Corpus,
    queries: np.ndarray,
    depth: int,
    memory_bytes: int,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> list[Ranking] | None:
    """Each question's dense top ``depth`` over passage rows: the collective part of a hybrid
    search (every rank scans its shards; None on ranks but 0)."""
    hits = search_index(
        corpus.index, queries, depth, memory_bytes, rank=rank, world_size=world_size
    )
    if hits is None:
        return None
    rows = corpus.rows_of(hits.rows)
    return [(rows[i], hits.scores[i]) for i in range(len(rows))]


def _scorers(corpus: Corpus, queries, questions, sparse, spec):
    """Linear fusion's scorers of the rows one side did not rank (None for rrf)."""
    if spec.fusion != "linear":
        return None, None
    if not corpus.encoded_from_file():
        raise InputError(
            f"{corpus.index.path}: holds precomputed vectors: linear fusion scores passages by "
            "their stored vectors, which needs an index `dpr-cache index` encoded from the "
            "passages"
        )

    def dense_of(i: int, rows: np.ndarray) -> np.ndarray:
        return row_scores(corpus.index, queries[i], rows)

    def sparse_of(i: int, rows: np.ndarray) -> np.ndarray:
        return sparse.index.scores(questions[i])[rows]

    return dense_of, sparse_of


def hybrid_search(
    corpus: Corpus,
    queries: np.ndarray,
    questions: Sequence[str],
    qids: Sequence[str],
    sparse: Sparse,
    spec: EvalConfig,
    k: int,
    dense: list[Ranking],
    *,
    weight: float | None = None,
) -> Hits:
    """The fused top ``k`` of each question (rows are passage rows), from its ``dense``
    rankings (:func:`dense_rankings`) and BM25's."""
    bm25 = sparse.rankings(questions, qids, spec.fusion_depth)
    dense_of, sparse_of = _scorers(corpus, queries, questions, sparse, spec)
    weights = None if weight is None else [weight]
    [(scores, rows)] = fuse(
        spec, dense, bm25, k, dense_of=dense_of, sparse_of=sparse_of, weights=weights
    )
    return Hits(scores, rows)


def tune_weight(
    corpus: Corpus,
    queries: np.ndarray,
    qas: Sequence[tuple[str, list[str]]],
    sparse: Sparse,
    spec: EvalConfig,
    metric: str,
    dense: list[Ranking],
    match: str,
    *,
    qids: Sequence[str] | None = None,
    qrels: dict[str, dict[str, int]] | None = None,
) -> tuple[float, dict[str, float]]:
    """The weight of :data:`TUNING_GRID` with the best ``metric`` (``top{k}`` or ``mrr@10``) on
    the held-out questions ``qas`` (their ``dense`` rankings from :func:`dense_rankings`), and
    every weight's figure. Relevant: a passage ``qrels`` grades above 0 for the question's id
    (``qids``), else one holding an answer (DPR's answer match)."""
    k = 10 if metric == "mrr@10" else int(metric.removeprefix("top"))
    questions = [q for q, _ in qas]
    qids = [str(i) for i in range(len(qas))] if qids is None else list(qids)
    bm25 = sparse.rankings(questions, qids, spec.fusion_depth)
    dense_of, sparse_of = _scorers(corpus, queries, questions, sparse, spec)
    fused = fuse(spec, dense, bm25, k, dense_of=dense_of, sparse_of=sparse_of, weights=TUNING_GRID)
    rows = np.unique(np.concatenate([r.ravel() for _, r in fused]))
    rows = rows[rows >= 0]
    columns = passage_columns(corpus.dataset, rows.tolist())
    texts = dict(zip(rows.tolist(), columns["text"], strict=True))
    pids = dict(zip(rows.tolist(), columns["id"], strict=True))
    answered: dict[tuple[int, int], bool] = {}  # (question, row): the same under many weights

    def relevant(q: int, row: int) -> bool:
        if (q, row) not in answered:
            if row < 0:
                answered[q, row] = False
            elif qrels is not None:
                answered[q, row] = qrels.get(qids[q], {}).get(pids[row], 0) > 0
            else:
                answered[q, row] = has_answer(qas[q][1], texts[row], match)
        return answered[q, row]

    grid = {}
    for w, (_, top) in zip(TUNING_GRID, fused, strict=True):
        ranks = [
            first_relevant_rank([relevant(q, r) for r in q_rows])
            for q, q_rows in enumerate(top.tolist())
        ]
        grid[f"{w:g}"] = float(hit_metrics(ranks, [k])[metric].mean())
    best = max(TUNING_GRID, key=lambda w: (grid[f"{w:g}"], -abs(np.log(w))))
    return best, grid


@dataclass(frozen=True)
class Tuning:
    """Held-out questions that pick linear fusion's weight: their qas, ids and vectors, the
    file they came from, and the qrels that judge them (None: their answers do)."""

    qas: list[tuple[str, list[str]]]
    qids: list[str]
    vectors: np.ndarray
    path: Path
    qrels: dict[str, dict[str, int]] | None = None
    qrels_source: str | None = None


def fused_search(
    corpus: Corpus,
    queries: np.ndarray,
    questions: Sequence[str],
    qids: Sequence[str],
    spec: EvalConfig,
    cache_dir: Path,
    memory_bytes: int,
    *,
    tune: Tuning | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[Hits, dict[str, Any]] | None:
    """The hybrid search of ``eval`` and ``search``: each question's fused top ``max(top_k)``
    (rows are passage rows) and a record of what fused them, the weight tuned first on
    ``tune`` when given; None on ranks but 0. Every collective dense search runs first; BM25
    is opened after them, on rank 0 alone."""
    depth = max(spec.fusion_depth, max(spec.top_k))

    def dense(vectors: np.ndarray) -> list[Ranking] | None:
        return dense_rankings(
            corpus, vectors, depth, memory_bytes, rank=rank, world_size=world_size
        )

    tune_dense = dense(tune.vectors) if tune is not None else None
    dev_dense = dense(queries)
    if dev_dense is None:
        return None
    sparse = open_sparse(corpus, cache_dir, spec.bm25_run, spec)
    record: dict[str, Any] = {
        "method": spec.fusion,
        "depth": spec.fusion_depth,
        "bm25": sparse.source,
    }
    if spec.fusion == "linear":
        record["weight"] = None if spec.fusion_weight == "auto" else spec.fusion_weight
    else:
        record["rrf_k"] = spec.fusion_rrf_k
    if tune is not None:
        weight, grid = tune_weight(
            corpus,
            tune.vectors,
            tune.qas,
            sparse,
            spec,
            spec.fusion_tune_metric,
            tune_dense,
            spec.match,
            qids=tune.qids,
            qrels=tune.qrels,
        )
        spec = spec.model_copy(update={"fusion_weight": weight})
        judged = f"answers ({spec.match} match)"
        record.update(
            weight=weight,
            tuned_on=str(tune.path.resolve()),
            tune_metric=spec.fusion_tune_metric,
            grid=grid,
            judged_by=judged if tune.qrels is None else f"qrels {tune.qrels_source}",
        )
    hits = hybrid_search(corpus, queries, questions, qids, sparse, spec, max(spec.top_k), dev_dense)
    return hits, record
