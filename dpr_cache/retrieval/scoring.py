"""A training file scored by a teacher (:mod:`dpr_cache.retrieval.teacher`): every record (DPR
JSON or JSON Lines, streamed) written to ``OUT`` as JSON Lines with every key kept, each of its
``positive_ctxs`` and ``hard_negative_ctxs`` given ``teacher_score`` (float), and a summary beside
it (``<OUT stem>.summary.json``: the teacher, the settings, the counts, seconds per stage).

Resumable as ``mine`` is (:mod:`dpr_cache.retrieval.mining.parts`): the records go in parts of
``batch``, each written whole into ``OUT.parts/`` with its counts; a rerun with the same teacher,
file and settings keeps the finished parts. Under ``torchrun`` every rank reads each part, scores
the records ``i % world_size == rank`` of it, and rank 0 gathers the scores and writes the part.

Where the teacher is a model on CUDA (``Teacher.ahead``), the next part is read, checked and
tokenized in a background thread while the device scores the current one, so the summary's
"read the training file" is then the wait for that thread and "score" the device's share; on
the CPU each part is read, tokenized and scored in turn.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from tqdm.auto import tqdm

from dpr_cache.data.training import clean_example, iter_raw
from dpr_cache.errors import InputError
from dpr_cache.retrieval.mining.miner import summary_path
from dpr_cache.retrieval.mining.parts import join_parts, parts_dir
from dpr_cache.retrieval.teacher import Group, Teacher, passage_of, score_groups
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import check_output_file, write_atomic, write_json_atomic
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.overlap import ahead

__all__ = ["ScoreSpec", "SCORED", "score", "groups_of"]

SCORED = ("positive_ctxs", "hard_negative_ctxs")  # the ctxs given a teacher_score


@dataclass(frozen=True)
class ScoreSpec:
    """How a file is scored: records a part (the resumable unit)."""

    batch: int = 1024

    def check(self) -> None:
        if self.batch < 1:
            raise InputError(f"score: --batch {self.batch} must be >= 1")


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
    parts = parts_dir(out, teacher.inputs(), train, spec, None, rank)
    laps.lap("load the teacher")
    bar = tqdm(unit="q", desc="score", disable=not (progress and rank == 0), dynamic_ncols=True)
    n_parts = 0
    made = _parts_ahead(teacher, train, spec.batch, parts, rank, world_size)
    with bar, closing(made):  # closed: a part made ahead is waited for, not left running
        for batch, ready in made:
            laps.lap("read the training file")
            part = _part_path(parts, n_parts)
            if not distributed.rank0_says(part.with_suffix(".json").is_file()):
                groups, prepared = ready or (groups_of(train, batch), None)
                scores = _scored(teacher, groups, prepared, rank, world_size)
                laps.lap("score")
                if rank == 0:
                    counts = _write_part(part, batch, scores)
                    write_json_atomic(part.with_suffix(".json"), counts)
                laps.lap("write the part")
            n_parts += 1
            bar.update(len(batch))
    distributed.barrier()
    if rank != 0:
        return None
    summary = join_parts(parts, out, n_parts)
    del summary["dropped"]  # no rule drops anything here
    laps.lap("join the parts into OUT")
    stages = laps.seconds()
    summary.update(
        train=str(train),
        out=str(out),
        teacher=teacher.describe(),
        settings=dataclasses.asdict(spec),
        command=command,
        ranks=world_size,
        seconds=round(sum(stages.values()), 1),
        seconds_by_stage=stages,
    )
    write_json_atomic(summary_path(out), summary)
    shutil.rmtree(parts, ignore_errors=True)
    return summary


def _part_path(parts: Path, n: int) -> Path:
    """Part ``n``'s records; the part is done once its counts (``.json``) follow it."""
    return parts / f"part-{n:06d}.jsonl"


def _parts_ahead(
    teacher: Teacher, train: Path, size: int, parts: Path, rank: int, world_size: int
) -> Iterator[tuple[list[tuple[str, Any]], tuple[list[Group], Any] | None]]:
    """Each part's records, and where the teacher prepares ahead (``teacher.ahead``) its groups
    with this rank's share of them prepared, made in a background thread while the part before
    is scored (None: a part already done here, or a teacher that does not prepare ahead: the
    caller makes the groups)."""

    def made():
        for n, batch in enumerate(_records(train, size)):
            if not teacher.ahead or _part_path(parts, n).with_suffix(".json").is_file():
                yield batch, None
                continue
            groups = groups_of(train, batch)
            yield batch, (groups, teacher.prepare(groups[rank::world_size]))

    return ahead(made(), enabled=teacher.ahead)


def _records(train: Path, size: int) -> Iterator[list[tuple[str, Any]]]:
    """The file's records, whole, in parts of ``size`` (only one part in memory)."""
    batch, read = [], 0
    for item in iter_raw(train):
        batch.append(item)
        read += 1
        if len(batch) == size:
            yield batch
            batch = []
    if not read:
        raise InputError(f"{train}: no questions")
    if batch:
        yield batch


def _scored(
    teacher: Teacher, groups: list[Group], prepared: Any, rank: int, world_size: int
) -> list[np.ndarray] | None:
    """Every group's scores on rank 0 (None elsewhere): each rank scores its share (``prepared``:
    what the teacher prepared of that share, or None) and rank 0 gathers them. A rank's bad
    input stops every rank with its one line."""
    if world_size == 1:
        return score_groups(teacher, groups, prepared)
    share = groups[rank::world_size]
    try:
        result: tuple[str, Any] = ("ok", score_groups(teacher, share, prepared))
    except InputError as e:
        result = ("error", str(e))
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, result)
    errors = [message for status, message in gathered if status == "error"]
    if errors:
        raise InputError(errors[0])
    if rank != 0:
        return None
    out: list[np.ndarray] = [np.zeros(0)] * len(groups)
    for r, (_, scores) in enumerate(gathered):
        out[r::world_size] = scores
    return out


def _write_part(part: Path, batch: list[tuple[str, Any]], scores: list[np.ndarray]) -> dict:
    """The part's records with each scored ctx's ``teacher_score``; the counts."""
    counts = {"questions": len(batch), "positives": 0, "hard_negatives": 0, "no_positive": 0}

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for (_, obj), values in zip(batch, scores, strict=True):
                values = iter(values.tolist())
                for key in SCORED:
                    for ctx in obj.get(key) or []:
                        ctx["teacher_score"] = next(values)
                counts["positives"] += len(obj.get("positive_ctxs") or [])
                counts["hard_negatives"] += len(obj.get("hard_negative_ctxs") or [])
                counts["no_positive"] += not obj.get("positive_ctxs")
                f.write(json.dumps(obj, ensure_ascii=False) + "\n")

    write_atomic(part, write)
    return counts
