"""The one place that scores (question, passage) pairs with a teacher, for ``dpr-cache score``
and for ``mine``'s teacher rule.

A teacher is named ``bm25``, ``hybrid`` or a cross-encoder folder:

- a Hugging Face cross-encoder (:mod:`dpr_cache.model.cross_encoder`): its logit for the pair
  (question, ``title + " " + text``), batched longest first under the precision asked for;
- ``bm25``: the lexical room's BM25 (:mod:`dpr_cache.retrieval.lexical`) over a passages TSV,
  built once and opened memory-mapped as ``eval`` does; a passage is found there by its id;
- ``hybrid``: ``BM25 + weight * dense``, the linear fusion ``eval`` uses
  (:func:`~dpr_cache.retrieval.fusion.linear_scores`), the dense score being the model's question
  vector times the passage's vector stored in the index it encoded from the passages (a
  multi-vector model's: the MaxSim of their token vectors, as its search scores them).

Passages are scored a group at a time (a question and its passages); an error names the group's
record and the passage (``positive_ctxs[0]``, ``hard_negative_ctxs[3]``) in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from dpr_cache.config import default_of
from dpr_cache.data.ids import derived_passage_id
from dpr_cache.data.passages import load_passages, passage_rows
from dpr_cache.errors import InputError
from dpr_cache.model.cross_encoder import (
    PAIRS_A_FORWARD,
    NonFiniteScore,
    Pair,
    load_cross_encoder,
    score_pairs,
    tokenize_pairs,
)
from dpr_cache.model.loading import model_fingerprint, resolve_model_dir
from dpr_cache.retrieval.dense.index import encoded_from, open_index, passages_file, row_scores
from dpr_cache.retrieval.dense.questions import QuestionRun, query_tower, question_vectors
from dpr_cache.retrieval.dense.shards import passages_signature
from dpr_cache.retrieval.fusion import linear_scores
from dpr_cache.retrieval.lexical import Bm25Index
from dpr_cache.runtime.device import PRECISIONS, resolve_precision
from dpr_cache.runtime.overlap import transfer_for

__all__ = [
    "TEACHERS",
    "TeacherSpec",
    "Passage",
    "Group",
    "Teacher",
    "open_teacher",
    "score_groups",
    "precision_for",
]

TEACHERS = ("bm25", "hybrid")  # and any cross-encoder folder


class Passage(NamedTuple):
    """A passage to score: its id as the file gives it (None: it gives none), title and text."""

    passage_id: str | None
    title: str | None
    text: str


@dataclass(frozen=True)
class Group:
    """A question and the passages to score for it; ``where`` names its record and ``names``
    each passage (for error lines)."""

    where: str
    question: str
    passages: list[Passage]
    names: list[str]


@dataclass(frozen=True)
class TeacherSpec:
    """Which teacher scores and with what: ``name`` (bm25 | hybrid | a cross-encoder folder),
    the passages TSV (bm25, hybrid), the bi-encoder and its index (hybrid) and the dense
    score's weight, and for a cross-encoder its precision (auto: bf16 on a GPU, else fp32),
    pairs a forward (None: ``PAIRS_A_FORWARD``) and token limit (None: the model's)."""

    name: str
    passages: Path | None = None
    model: str | None = None
    index: Path | None = None
    fusion_weight: float | None = None
    precision: str = "auto"
    batch_size: int | None = None
    max_length: int | None = None
    device: str = default_of("eval.device")
    dim: int | None = None  # hybrid: the dense vectors' width asked (--dim); None: the index's

    @property
    def kind(self) -> str:
        return self.name if self.name in TEACHERS else "cross-encoder"

    @property
    def weight(self) -> float:
        """The dense score's weight in the hybrid (``eval``'s default when none is given)."""
        return (
            default_of("eval.fusion_weight") if self.fusion_weight is None else self.fusion_weight
        )

    def check(self, flag: str = "--teacher") -> None:
        """InputError, one line, for options that contradict the teacher or are missing."""
        kind = self.kind
        given = {
            "--passages": self.passages,
            "--model": self.model,
            "--index": self.index,
            "--fusion-weight": self.fusion_weight,
            "--batch-size": self.batch_size,
            "--max-length": self.max_length,
            "--dim": self.dim,
        }
        allowed = {
            "bm25": {"--passages"},
            "hybrid": {"--passages", "--model", "--index", "--fusion-weight", "--dim"},
            "cross-encoder": {"--batch-size", "--max-length"},
        }[kind]
        extra = [key for key, value in given.items() if value is not None and key not in allowed]
        if extra:
            raise InputError(f"{flag} {self.name}: takes no {', '.join(extra)}")
        if kind == "bm25" and self.passages is None:
            raise InputError(f"{flag} bm25: give --passages TSV")
        if kind == "hybrid" and (self.model is None or self.index is None):
            raise InputError(f"{flag} hybrid: give --model DIR and --index DIR")
        if self.precision not in ("auto", *PRECISIONS):
            raise InputError(
                f"--precision: {self.precision!r} is not one of auto, {', '.join(PRECISIONS)}"
            )
        if kind != "cross-encoder" and self.precision not in ("auto", "fp32"):
            raise InputError(f"--precision {self.precision}: {self.name} scores in fp32")
        if self.batch_size is not None and self.batch_size < 1:
            raise InputError(f"--batch-size {self.batch_size} must be >= 1")
        if self.fusion_weight is not None and not self.fusion_weight >= 0:
            raise InputError(f"--fusion-weight {self.fusion_weight} must be >= 0, as eval's")


def precision_for(precision: str, device: torch.device) -> str:
    """A cross-encoder's precision on ``device``: ``auto`` as every command resolves it
    (:func:`~dpr_cache.runtime.device.resolve_precision`: bf16 on a GPU whose hardware has it,
    else fp16; fp32 on the CPU). fp16 on the CPU is refused (CPUs run it slowly or not at
    all)."""
    if precision == "fp16" and device.type != "cuda":
        raise InputError("--precision fp16 needs a GPU: use bf16 or fp32 on the CPU")
    return resolve_precision(precision, device)


class Teacher(Protocol):
    """What ``score`` and ``mine`` need of a teacher."""

    ahead: bool  # whether preparing the next groups in another thread pays (a model on CUDA)

    def prepare(self, groups: Sequence[Group]) -> Any:
        """What scoring ``groups`` needs done on the host first (a cross-encoder's tokens),
        to be done while the device scores the groups before; None where there is nothing."""
        ...

    def score(self, groups: Sequence[Group], prepared: Any = None) -> list[np.ndarray]:
        """Each group's scores (float64, one a passage, in order); ``prepared``: what
        :meth:`prepare` gave for these groups (None: done here)."""
        ...

    def describe(self) -> dict[str, Any]:
        """The teacher and its settings, for a summary (JSON)."""
        ...

    def inputs(self) -> list[Any]:
        """Everything its scores depend on (JSON), to keep a run's finished parts."""
        ...


class CrossEncoderTeacher:
    """A cross-encoder folder's score of each pair."""

    def __init__(self, spec: TeacherSpec, device: torch.device) -> None:
        self.encoder = load_cross_encoder(spec.name, max_length=spec.max_length, device=device)
        self.precision = precision_for(spec.precision, device)
        self.batch_size = PAIRS_A_FORWARD if spec.batch_size is None else spec.batch_size
        self.ahead = transfer_for(device).non_blocking

    def prepare(self, groups: Sequence[Group]) -> dict[str, list[list[int]]] | None:
        """The groups' pairs tokenized (:func:`tokenize_pairs`); None when there is none."""
        pairs, encoder = _pairs(groups), self.encoder
        return tokenize_pairs(encoder.tokenizer, pairs, encoder.max_length) if pairs else None

    def score(self, groups: Sequence[Group], prepared: Any = None) -> list[np.ndarray]:
        pairs = _pairs(groups)
        try:
            flat = score_pairs(
                self.encoder,
                pairs,
                batch_size=self.batch_size,
                precision=self.precision,
                features=prepared,
            )
        except NonFiniteScore as e:
            group, j = _locate(groups, e.index)
            raise InputError(
                f"{group.where}: {group.names[j]}: the cross-encoder {self.encoder.path} scored "
                f"it inf or NaN under {self.precision}"
                + (" (fp16 may overflow: try bf16 or fp32)" if self.precision == "fp16" else "")
            ) from None
        return _split(flat.astype(np.float64), groups)

    def describe(self) -> dict[str, Any]:
        encoder = self.encoder
        return {
            "teacher": "cross-encoder",
            "model": str(encoder.path),
            "fingerprint": model_fingerprint(encoder.path),
            "labels": encoder.num_labels,
            "max_length": encoder.max_length,
            "precision": self.precision,
            "batch_size": self.batch_size,
            "device": str(encoder.device),
        }

    def inputs(self) -> list[Any]:
        e = self.encoder
        return ["cross-encoder", model_fingerprint(e.path), e.max_length, self.precision]


class Bm25Teacher:
    """BM25's score of each passage of ``passages``, found by its id."""

    ahead = False  # BM25 scores on the host, with nothing to prepare

    def __init__(self, passages: Path, cache_dir: Path) -> None:
        self.passages = Path(passages)
        self.index = Bm25Index.open(self.passages, cache_dir)
        self.dataset = load_passages(self.passages, cache_dir)

    def rows(self, groups: Sequence[Group], kind: str) -> list[np.ndarray]:
        """Each group's passages' rows in the passages file; InputError for one not there."""
        ids = [p.passage_id or "" for g in groups for p in g.passages]
        found = passage_rows(self.dataset, ids) if ids else np.zeros(0, np.int64)
        missing = np.flatnonzero(found < 0)
        if missing.size:
            group, j = _locate(groups, int(missing[0]))
            pid = group.passages[j].passage_id
            where = f"{group.where}: {group.names[j]}"
            if pid is None:
                raise InputError(
                    f"{where} has no passage_id: the {kind} teacher finds passages in "
                    f"{self.passages} by id"
                )
            raise InputError(
                f"{where}: passage {pid!r} is not in {self.passages} (the {kind} teacher finds "
                "passages there by id)"
            )
        return _split(found, groups)

    def bm25(self, groups: Sequence[Group], rows: list[np.ndarray]) -> list[np.ndarray]:
        return [
            self.index.scores(g.question)[r].astype(np.float64)
            for g, r in zip(groups, rows, strict=True)
        ]

    def prepare(self, groups: Sequence[Group]) -> None:
        return None

    def score(self, groups: Sequence[Group], prepared: Any = None) -> list[np.ndarray]:
        return self.bm25(groups, self.rows(groups, "bm25"))

    def describe(self) -> dict[str, Any]:
        return {"teacher": "bm25", "passages": str(self.passages)}

    def inputs(self) -> list[Any]:
        return ["bm25", passages_signature(self.passages)]


class HybridTeacher(Bm25Teacher):
    """``BM25 + weight * dense`` of each passage: the dense score from the model's question
    vector and the passage's stored vector."""

    def __init__(self, spec: TeacherSpec, cache_dir: Path, device: torch.device) -> None:
        self.opened = open_index(spec.index)
        super().__init__(passages_file(self.opened, spec.passages), cache_dir)
        if not encoded_from(self.opened, self.dataset, self.passages):
            raise InputError(
                f"{spec.index}: holds precomputed vectors: the hybrid teacher scores passages "
                "by their stored vectors, which needs an index `dpr-cache index` encoded from "
                "the passages"
            )
        self.model_dir = resolve_model_dir(spec.model, Path("."))
        asked = {"dim": spec.dim} if spec.dim is not None else None
        self.model = query_tower(self.model_dir, self.opened, device, asked)
        self.run, self.weight = QuestionRun(device, "fp32"), spec.weight

    def score(self, groups: Sequence[Group], prepared: Any = None) -> list[np.ndarray]:
        rows = self.rows(groups, "hybrid")
        bm25 = self.bm25(groups, rows)
        if not groups:
            return []
        queries = question_vectors(self.model, [g.question for g in groups], self.run)
        return [
            linear_scores(b, row_scores(self.opened, q, r), self.weight)
            for b, r, q in zip(bm25, rows, queries, strict=True)
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "teacher": "hybrid",
            "passages": str(self.passages),
            "model": str(self.model_dir),
            "fingerprint": model_fingerprint(self.model_dir),
            "index": str(self.opened.path),
            "fusion_weight": self.weight,
        }

    def inputs(self) -> list[Any]:
        meta = self.opened.meta
        return [
            "hybrid",
            passages_signature(self.passages),
            model_fingerprint(self.model_dir),
            meta.get("shard_key"),
            self.weight,
        ]


def open_teacher(spec: TeacherSpec, *, cache_dir: Path, device: torch.device) -> Teacher:
    """The teacher ``spec`` names, on ``device``."""
    spec.check()
    if spec.kind == "bm25":
        return Bm25Teacher(spec.passages, cache_dir)
    if spec.kind == "hybrid":
        return HybridTeacher(spec, cache_dir, device)
    return CrossEncoderTeacher(spec, device)


def score_groups(
    teacher: Teacher, groups: Sequence[Group], prepared: Any = None
) -> list[np.ndarray]:
    """Each group's scores from ``teacher`` (``prepared``: what its ``prepare`` gave for these
    groups, None: prepared as they are scored); InputError naming the record and passage of
    the first score that is not finite."""
    scores = teacher.score(groups) if prepared is None else teacher.score(groups, prepared)
    for group, values in zip(groups, scores, strict=True):
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            j = int(bad[0])
            raise InputError(
                f"{group.where}: {group.names[j]}: the teacher scored it {values[j]}, "
                "not a finite number"
            )
    return scores


def passage_of(ctx: dict[str, Any]) -> Passage:
    """A cleaned ctx (:func:`~dpr_cache.data.training.clean_example`) as a passage to score: its
    id None when the file gave none (the id clean_example derived from title and text)."""
    pid = ctx["passage_id"]
    if pid == derived_passage_id(ctx["title"], ctx["text"]):
        pid = None
    return Passage(pid, ctx["title"], ctx["text"])


def _pairs(groups: Sequence[Group]) -> list[Pair]:
    """Every (question, passage) pair of the groups, in order."""
    return [Pair(g.question, p.title, p.text) for g in groups for p in g.passages]


def _split(flat: np.ndarray, groups: Sequence[Group]) -> list[np.ndarray]:
    ends = np.cumsum([len(g.passages) for g in groups])[:-1]
    return list(np.split(flat, ends)) if groups else []


def _locate(groups: Sequence[Group], flat_index: int) -> tuple[Group, int]:
    """The group and place in it of a passage numbered across all groups."""
    for group in groups:
        if flat_index < len(group.passages):
            return group, flat_index
        flat_index -= len(group.passages)
    raise IndexError(flat_index)
