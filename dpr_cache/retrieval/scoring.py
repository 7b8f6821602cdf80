"""A training file scored by a teacher (:mod:`dpr_cache.retrieval.teacher`): every record (DPR
JSON or JSON Lines, streamed) written to ``OUT`` as JSON Lines with every key kept, each of its
``positive_ctxs`` and ``hard_negative_ctxs`` given ``teacher_score`` (float), and a summary beside
it (``<OUT stem>.summary.json``: the teacher, the settings, the counts, seconds per stage).

Resumable as ``mine`` is (:mod:`dpr_cache.runtime.resumable`): the records go in parts of
``batch``, each written whole into ``OUT.parts/`` with its counts; a rerun with the same teacher,
file and settings keeps the finished parts. Under ``torchrun`` every rank reads each part, scores
the records ``i % world_size == rank`` of it, and rank 0 gathers the scores and writes the part.

Cleaning: with ``teacher_margin`` or ``teacher_relative`` (the teacher rule of
:mod:`dpr_cache.retrieval.mining.rules`; NV-Retriever's 95%-of-positive at 0.95), a hard negative
the teacher scores near the record's first positive, or above it, is left out of ``OUT`` and
counted (``cleaned``).

Where the teacher is a model on CUDA (``Teacher.ahead``), the next part is read, checked and
tokenized in a background thread while the device scores the current one, so the summary's
"read the training file" is then the wait for that thread and "score" the device's share; on
the CPU each part is read, tokenized and scored in turn.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from dpr_cache.data.layouts import iter_dpr_records
from dpr_cache.data.training import clean_example
from dpr_cache.errors import InputError
from dpr_cache.retrieval.mining.rules import NegativeRules, near_teacher_positive
from dpr_cache.retrieval.teacher import Group, Teacher, passage_of, score_groups
from dpr_cache.runtime.atomic import check_output_file
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.overlap import ahead
from dpr_cache.runtime.resumable import (
    PartJob,
    PartsSpec,
    file_signature,
    fingerprint,
    finish_parts,
    in_parts,
    open_parts,
    over_ranks,
    part_done,
    run_parts,
)

__all__ = ["ScoreSpec", "SCORED", "score", "groups_of"]

SCORED = ("positive_ctxs", "hard_negative_ctxs")  # the ctxs given a teacher_score


@dataclass(frozen=True)
class ScoreSpec:
    """How a file is scored: records a part (the resumable unit), and the teacher rule that
    leaves hard negatives out (None, None: every one kept)."""

    batch: int = 1024
    teacher_margin: float | None = None
    teacher_relative: float | None = None

    def check(self) -> None:
        if self.batch < 1:
            raise InputError(f"score: --batch {self.batch} must be >= 1")
        if self.teacher_margin is not None and self.teacher_margin < 0:
            raise InputError(f"score: --teacher-margin {self.teacher_margin} must be >= 0")
        if self.teacher_relative is not None and not 0 < self.teacher_relative <= 1:
            raise InputError(f"score: --teacher-relative {self.teacher_relative} must be in (0, 1]")

    @property
    def rules(self) -> NegativeRules | None:
        """The cleaning rule (None: none)."""
        if self.teacher_margin is None and self.teacher_relative is None:
            return None
        return NegativeRules(
            None, teacher_margin=self.teacher_margin, teacher_relative=self.teacher_relative
        )


def groups_of(train: Path, part: list[tuple[str, Any]]) -> list[Group]:
    """Each record's question and its positives and hard negatives, validated."""
    groups = []
    for where, obj in part:
        example = clean_example(obj, f"{train} {where}")
        ctxs = [(key, j, c) for key in SCORED for j, c in enumerate(example[key])]
        groups.append(
            Group(
                where=f"{train} {where}",
                question=example["question"],
                passages=[passage_of(c) for _, _, c in ctxs],
                names=[f"{key}[{j}]" for key, j, _ in ctxs],
            )
        )
    return groups


def score(
    teacher: Teacher,
    train: Path,
    out: Path,
    spec: ScoreSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    command: str = "",
    laps: Laps | None = None,
) -> dict[str, Any] | None:
    """Score ``train`` into ``out`` (see the module docstring); rank 0 returns the summary. The
    caller holds the lock on ``out``."""
    spec.check()
    train, out = Path(train), Path(out)
    check_output_file(out, {"the training file": train})
    laps = laps or Laps()
    inputs = fingerprint(*teacher.inputs(), file_signature(train), dataclasses.asdict(spec))
    parts = PartsSpec(out, spec.batch, inputs, rank, world_size)
    open_parts(parts)
    laps.lap("load the teacher")
    job = PartJob(
        work=lambda made: _score_part(teacher, train, made, parts, laps),
        write=lambda f, made, scores: _write_records(f, made[0], scores, spec.rules),
        count=lambda made: len(made[0]),
    )
    made = _parts_ahead(teacher, train, spec.batch, parts.folder, rank, world_size)
    with closing(made):  # closed: a part made ahead is waited for, not left running
        totals = run_parts(parts, made, job, laps=laps, progress=progress, desc="score")
    if totals is None:
        return None
    stages = laps.seconds()
    summary = {
        **totals,
        "train": str(train),
        "out": str(out),
        "teacher": teacher.describe(),
        "settings": dataclasses.asdict(spec),
        "command": command,
        "ranks": world_size,
        "seconds": round(sum(stages.values()), 1),
        "seconds_by_stage": stages,
    }
    finish_parts(parts, summary)
    return summary


def _parts_ahead(
    teacher: Teacher, train: Path, size: int, parts: Path, rank: int, world_size: int
) -> Iterator[tuple[list[tuple[str, Any]], tuple[list[Group], Any] | None]]:
    """Each part's records, and where the teacher prepares ahead (``teacher.ahead``) its groups
    with this rank's share of them prepared, made in a background thread while the part before
    is scored (None: a part already done here, or a teacher that does not prepare ahead: the
    caller makes the groups)."""

    def made():
        for n, batch in enumerate(_records(train, size)):
            if not teacher.ahead or part_done(parts, n):
                yield batch, None
                continue
            groups = groups_of(train, batch)
            share = groups[rank::world_size]  # this rank's, as over_ranks splits a part
            yield batch, (groups, teacher.prepare(share))

    return ahead(made(), enabled=teacher.ahead)


def _records(train: Path, size: int) -> Iterator[list[tuple[str, Any]]]:
    """The file's records, whole, in parts of ``size`` (only one part in memory)."""
    return in_parts(iter_dpr_records(train), size, f"{train}: no questions")


def _score_part(
    teacher: Teacher,
    train: Path,
    made: tuple[list[tuple[str, Any]], tuple[list[Group], Any] | None],
    parts: PartsSpec,
    laps: Laps,
) -> list[np.ndarray] | None:
    """Every record's scores of a part on rank 0 (None elsewhere), each rank scoring its share
    (:func:`~dpr_cache.runtime.resumable.over_ranks`). ``made``: the part's records, and its
    groups with this rank's share prepared when made ahead (else None: made here)."""
    batch, ready = made
    groups, prepared = ready or (groups_of(train, batch), None)
    scores = over_ranks(groups, lambda share: score_groups(teacher, share, prepared), parts)
    laps.lap("score")
    return scores


def _write_records(
    f: IO[str],
    batch: list[tuple[str, Any]],
    scores: list[np.ndarray],
    rules: NegativeRules | None = None,
) -> dict[str, int]:
    """The part's records written to ``f`` with each scored ctx's ``teacher_score`` (less the
    hard negatives ``rules`` drops); the part's counts."""
    counts = {
        "questions": len(batch),
        "positives": 0,
        "hard_negatives": 0,
        "no_positive": 0,
        "cleaned": 0,
    }
    for (_, obj), values in zip(batch, scores, strict=True):
        values = iter(values.tolist())
        for key in SCORED:
            for ctx in obj.get(key) or []:
                ctx["teacher_score"] = next(values)
        if rules is not None and obj.get("positive_ctxs"):
            counts["cleaned"] += _clean(obj, rules)
        counts["positives"] += len(obj.get("positive_ctxs") or [])
        counts["hard_negatives"] += len(obj.get("hard_negative_ctxs") or [])
        counts["no_positive"] += not obj.get("positive_ctxs")
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return counts


def _clean(obj: dict[str, Any], rules: NegativeRules) -> int:
    """Leave out of ``obj`` the hard negatives its teacher scores near its first positive;
    how many were left out."""
    positive = obj["positive_ctxs"][0]["teacher_score"]
    negatives = obj.get("hard_negative_ctxs") or []
    kept = [c for c in negatives if not near_teacher_positive(c["teacher_score"], positive, rules)]
    obj["hard_negative_ctxs"] = kept
    return len(negatives) - len(kept)
