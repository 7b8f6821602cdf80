"""``dpr-cache score``: a teacher's score on every positive and hard negative of a training file
(:mod:`dpr_cache.retrieval.scoring`), written under the lock on ``OUT``; under ``torchrun`` each
part's records are split over the ranks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpr_cache.retrieval.dense.index import recorded_passages
from dpr_cache.retrieval.scoring import ScoreSpec, score
from dpr_cache.retrieval.teacher import TeacherSpec, open_teacher
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import check_output_file
from dpr_cache.runtime.device import advises_on_out_of_memory
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.lock import output_lock

__all__ = ["score_file", "format_summary"]


@advises_on_out_of_memory("lower --batch-size")
def score_file(
    teacher: TeacherSpec,
    train: Path,
    out: Path,
    spec: ScoreSpec,
    *,
    cache_dir: Path,
    progress: bool = True,
    command: str = "",
) -> dict[str, Any] | None:
    """Score ``train`` into ``out`` with the teacher asked for; rank 0 returns the summary."""
    teacher.check()
    spec.check()
    passages = teacher.passages or recorded_passages(teacher.index)
    check_output_file(out, {"the training file": train, "the passages file": passages})
    env = distributed.setup(teacher.device, "--device")
    try:
        with output_lock(out, is_file=True):
            laps = Laps()
            scorer = None
            if env.rank == 0:  # first: a first BM25 build is written once
                scorer = open_teacher(teacher, cache_dir=cache_dir, device=env.device)
            distributed.barrier()
            if scorer is None:
                scorer = open_teacher(teacher, cache_dir=cache_dir, device=env.device)
            return score(
                scorer,
                train,
                out,
                spec,
                rank=env.rank,
                world_size=env.world_size,
                progress=progress,
                command=command,
                laps=laps,
            )
    finally:
        distributed.teardown()


def format_summary(summary: dict[str, Any]) -> str:
    """What a scoring run did, a line a figure."""
    stages = ", ".join(f"{name} {s:.1f}" for name, s in summary["seconds_by_stage"].items())
    return "\n".join(
        [
            f"questions: {summary.get('questions', 0)} ({summary.get('no_positive', 0)} "
            "without a positive)",
            f"scored: {summary.get('positives', 0)} positives, "
            f"{summary.get('hard_negatives', 0)} hard negatives"
            + (
                f" ({summary['cleaned']} more left out by the teacher's rule)"
                if summary["settings"].get("teacher_margin") is not None
                or summary["settings"].get("teacher_relative") is not None
                else ""
            ),
            f"teacher: {json.dumps(summary['teacher'])}",
            f"seconds: {summary['seconds']:.1f} ({stages})",
        ]
    )
