"""Where a miner's candidates come from: the model's query tower searching the index its passage
tower encoded, or BM25 over the passages file. Either ranks a part's questions into
:class:`Ranked`: each question's candidate passage rows (rows of the passages file) and scores,
best first, and its score for its own positive passage, for the margin rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from dpr_cache.data.passages import load_passages
from dpr_cache.errors import InputError
from dpr_cache.model.loading import model_fingerprint
from dpr_cache.retrieval.dense.index import (
    OpenIndex,
    encoded_from,
    pair_scores,
    passages_file,
    search_index,
)
from dpr_cache.retrieval.dense.questions import QuestionRun, query_tower, question_vectors
from dpr_cache.retrieval.dense.shards import passages_signature
from dpr_cache.retrieval.lexical import Bm25Index, top_rows
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.memory import memory_limit

__all__ = ["Ranked", "Ranker", "ModelRanker", "Bm25Ranker", "RANKERS"]

RANKERS = ("model", "bm25")


@dataclass
class Ranked:
    """A part's questions ranked: ``rows`` [n, k] passage rows (-1: no more candidates),
    ``scores`` [n, k] theirs, ``positive`` [n] each question's score for its positive passage
    (NaN: it has none)."""

    rows: np.ndarray
    scores: np.ndarray
    positive: np.ndarray


class Ranker(Protocol):
    """What the miner needs of a ranker."""

    dataset: Any  # the passages its rows index
    passages: Path

    def rank(
        self, questions: list[str], positive_rows: np.ndarray, k: int, laps: Laps
    ) -> Ranked | None:
        """The top ``k`` of each question; None on ranks other than 0."""
        ...

    def mined_by(self) -> dict[str, Any]:
        """What ranked the candidates, for the summary (JSON)."""
        ...

    def inputs(self) -> list[Any]:
        """Everything the ranking depends on (JSON), so that a rerun keeps finished parts only
        when it is unchanged."""
        ...


class ModelRanker:
    """The query tower of ``model_dir`` searching ``opened`` (the bounded search ``eval``
    uses; under ``torchrun`` each rank scans its share of the shards) within ``memory_gb``
    (:func:`memory_limit`, resolved once, after the first questions are encoded); the questions
    are encoded in ``precision`` (``auto``: resolved for ``device``)."""

    def __init__(
        self,
        model_dir: Path,
        opened: OpenIndex,
        passages: Path | None,
        *,
        cache_dir: Path,
        memory_gb: float | None,
        device: torch.device,
        precision: str = "auto",
        rank: int = 0,
        world_size: int = 1,
        dim: int | None = None,
    ) -> None:
        self.model = query_tower(model_dir, opened, device, {"dim": dim} if dim else None)
        self.run = QuestionRun(device, precision)
        self.passages = passages_file(opened, passages)
        self.dataset = load_passages(self.passages, cache_dir)
        if not encoded_from(opened, self.dataset, self.passages):
            raise InputError(
                f"{opened.path}: holds precomputed vectors; mine needs an index `dpr-cache "
                "index` encoded from the passages"
            )
        self.model_dir, self.opened, self.device = model_dir, opened, device
        self.memory_gb, self.process, self.world_size = memory_gb, rank, world_size
        self.memory_bytes: int | None = None  # resolved at the first search

    def rank(
        self, questions: list[str], positive_rows: np.ndarray, k: int, laps: Laps
    ) -> Ranked | None:
        queries = question_vectors(self.model, questions, self.run)
        laps.lap("encode questions")
        if self.memory_bytes is None:
            self.memory_bytes = memory_limit(self.memory_gb)
        hits = search_index(
            self.opened,
            queries,
            k,
            self.memory_bytes,
            rank=self.process,
            world_size=self.world_size,
        )
        laps.lap("search")
        if hits is None:
            return None
        positive = np.full(len(questions), np.nan, np.float32)
        has = positive_rows >= 0
        if has.any():
            positive[has] = pair_scores(self.opened, queries[has], positive_rows[has])
        return Ranked(hits.rows, hits.scores, positive)

    def mined_by(self) -> dict[str, Any]:
        opened = self.opened
        return {
            "ranker": "model",
            "model": str(self.model_dir),
            "fingerprint": model_fingerprint(self.model_dir),
            "index": str(opened.path),
            "type": opened.type,
            "rows": opened.store.rows,
            "shard_key": opened.meta.get("shard_key"),
            "search": opened.knobs(),
            "passages": str(self.passages),
            "precision": self.run.precision,
        }

    def inputs(self) -> list[Any]:
        opened = self.opened
        return [
            "model",
            model_fingerprint(self.model_dir),
            opened.meta.get("shard_key"),
            opened.type,
            opened.meta.get("model"),
            opened.meta.get("index_params"),
            opened.knobs(),
            self.run.precision,
        ]


class Bm25Ranker:
    """BM25 (:mod:`dpr_cache.retrieval.lexical`) over ``passages``, on rank 0; a passage that
    shares no word with the question (score 0) is not a candidate, as Lucene returns none."""

    def __init__(self, passages: Path, *, cache_dir: Path, rank: int = 0) -> None:
        self.passages = Path(passages)
        self.index = Bm25Index.open(self.passages, cache_dir)
        self.dataset = load_passages(self.passages, cache_dir)
        self.process = rank  # BM25 ranks on rank 0 alone

    def rank(
        self, questions: list[str], positive_rows: np.ndarray, k: int, laps: Laps
    ) -> Ranked | None:
        if self.process != 0:
            return None
        rows = np.full((len(questions), k), -1, np.int64)
        scores = np.zeros((len(questions), k), np.float64)
        positive = np.full(len(questions), np.nan, np.float64)
        for i, question in enumerate(questions):
            every = self.index.scores(question)  # [passages]
            top = top_rows(every, k)
            top = top[every[top] > 0]
            rows[i, : len(top)], scores[i, : len(top)] = top, every[top]
            if positive_rows[i] >= 0:
                positive[i] = every[positive_rows[i]]
        laps.lap("search")
        return Ranked(rows, scores, positive)

    def mined_by(self) -> dict[str, Any]:
        return {"ranker": "bm25", "passages": str(self.passages)}

    def inputs(self) -> list[Any]:
        return ["bm25", passages_signature(self.passages)]
