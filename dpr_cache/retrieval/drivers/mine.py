"""``dpr-cache mine``: hard negatives for a training file, ranked by the model over its index or
by BM25 over the passages (:mod:`dpr_cache.retrieval.mining.miner`, the one candidate loop for
both), written under the lock on ``OUT``; under ``torchrun`` the index's shards are split over
the ranks. A teacher (:mod:`dpr_cache.retrieval.teacher`), on rank 0, drops the candidates it
scores near the positive."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpr_cache.config import default_of
from dpr_cache.errors import InputError
from dpr_cache.model.loading import resolve_model_dir
from dpr_cache.retrieval.dense.index import open_index, recorded_passages, search_spec
from dpr_cache.retrieval.mining.miner import mine
from dpr_cache.retrieval.mining.rankers import RANKERS, Bm25Ranker, ModelRanker
from dpr_cache.retrieval.mining.rules import MineSpec, check_spec
from dpr_cache.retrieval.teacher import TeacherSpec, open_teacher
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import check_output_file
from dpr_cache.runtime.device import PRECISIONS, advises_on_out_of_memory
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.lock import output_lock

__all__ = ["RankerSpec", "mine_file", "format_summary"]


@dataclass(frozen=True)
class RankerSpec:
    """What ranks the candidates: ``model`` (the model that encoded ``index``; ``passages``
    default to the index's own) or ``bm25`` (over ``passages``), how a search may run, and the
    precision the model encodes the questions in (``auto``: resolved for the device)."""

    name: str = "model"
    model: str | None = None
    index: Path | None = None
    passages: Path | None = None
    nprobe: int = default_of("index.ivf_nprobe")
    ef_search: int = default_of("index.hnsw_ef_search")
    memory_gb: float | None = None  # the whole process's peak; None: memory_limit's default
    device: str = default_of("eval.device")
    precision: str = "auto"
    dim: int | None = None  # the model's vectors' width asked (--dim); None: the index's

    def check(self, teacher: str | None = None) -> None:
        """InputError when the ranker is unknown or its inputs are missing or foreign (a hybrid
        teacher takes --model and --index under either ranker), or when a precision is asked
        for that no model here runs in (``teacher``: the teacher's kind, if any)."""
        if self.name not in RANKERS:
            raise InputError(f"--ranker: {self.name!r} is not one of {', '.join(RANKERS)}")
        if self.name == "model" and (self.model is None or self.index is None):
            raise InputError("mine --ranker model: give --model DIR and --index DIR")
        if self.name == "bm25":
            if self.passages is None:
                raise InputError("mine --ranker bm25: give --passages TSV")
            if teacher != "hybrid" and (self.model is not None or self.index is not None):
                raise InputError("mine --ranker bm25: ranks with no --model or --index")
        if self.precision not in ("auto", *PRECISIONS):
            raise InputError(
                f"--precision: {self.precision!r} is not one of auto, {', '.join(PRECISIONS)}"
            )
        if self.name == "bm25" and teacher != "cross-encoder" and self.precision != "auto":
            raise InputError(
                f"--precision {self.precision}: mine --ranker bm25 runs a model only as a "
                "cross-encoder --teacher"
            )


@advises_on_out_of_memory("run it with --device cpu")
def mine_file(
    ranker: RankerSpec,
    train: Path,
    out: Path,
    spec: MineSpec,
    *,
    qrels: Path | None,
    cache_dir: Path,
    progress: bool = True,
    command: str = "",
    teacher: TeacherSpec | None = None,
) -> dict[str, Any] | None:
    """Mine ``train`` into ``out`` with the ranker asked for; rank 0 returns the summary.
    ``teacher`` (its own options; the passages, model and index are the ranker's) scores the
    candidates for the teacher rule."""
    ranker.check(teacher.kind if teacher is not None else None)
    check_spec(spec)
    if teacher is None and spec.rules.by_teacher:
        raise InputError("mine: --teacher-margin and --teacher-relative need --teacher")
    if teacher is not None and not spec.rules.by_teacher:
        raise InputError("mine: --teacher needs --teacher-margin or --teacher-relative")
    passages = ranker.passages or recorded_passages(ranker.index)
    inputs = {"the training file": train, "the passages file": passages}
    check_output_file(out, {**inputs, "the qrels file": qrels})
    env = distributed.setup(ranker.device, "--device")
    try:
        with output_lock(out, is_file=True):
            laps = Laps()
            if ranker.name == "bm25":
                ranks = Bm25Ranker(ranker.passages, cache_dir=cache_dir, rank=env.rank)
            else:
                opened = open_index(
                    ranker.index, search_spec(ranker.index, ranker.nprobe, ranker.ef_search)
                )
                ranks = ModelRanker(
                    resolve_model_dir(ranker.model, Path(".")),
                    opened,
                    ranker.passages,
                    cache_dir=cache_dir,
                    memory_gb=ranker.memory_gb,
                    device=env.device,
                    precision=ranker.precision,
                    rank=env.rank,
                    world_size=env.world_size,
                    dim=ranker.dim,
                )
            laps.lap("load the ranker and passages")
            scorer = None
            if teacher is not None and env.rank == 0:
                scorer = open_teacher(
                    _teacher_of(teacher, ranker, ranks.passages),
                    cache_dir=cache_dir,
                    device=env.device,
                )
            laps.lap("load the teacher")
            return mine(
                ranks,
                train,
                out,
                spec,
                qrels=qrels,
                rank=env.rank,
                progress=progress,
                command=command,
                laps=laps,
                teacher=scorer,
            )
    finally:
        distributed.teardown()


def _teacher_of(teacher: TeacherSpec, ranker: RankerSpec, passages: Path) -> TeacherSpec:
    """The teacher with the ranker's passages (bm25, hybrid), model and index (hybrid)."""
    if teacher.kind == "bm25":
        return dataclasses.replace(teacher, passages=passages)
    if teacher.kind == "hybrid":
        return dataclasses.replace(
            teacher, passages=passages, model=ranker.model, index=ranker.index, dim=ranker.dim
        )
    return teacher


def format_summary(summary: dict[str, Any]) -> str:
    """What a mining run did, a line a figure."""
    n = max(summary.get("questions", 0), 1)
    negatives = summary.get("negatives", 0)
    lines = [
        f"questions: {summary.get('questions', 0)}",
        f"hard negatives: {negatives} ({negatives / n:.1f} a question; "
        f"{summary.get('short', 0)} questions with fewer than asked)",
        f"candidates looked at: {summary.get('candidates', 0)} (top "
        f"{summary['settings']['skip']} skipped: {summary.get('skipped_top', 0)})",
    ]
    lines += [f"dropped, {rule}: {count}" for rule, count in summary["dropped"].items()]
    if summary["settings"]["keep_bm25"]:
        lines.append(f"the file's own kept: {summary.get('kept_bm25', 0)}")
    if summary.get("answer_in_top"):
        ks = "/".join(key[3:] for key in summary["answer_in_top"])
        rates = " / ".join(f"{v:.1f}" for v in summary["answer_in_top"].values())
        lines.append(f"questions with an answer in the window's top-{ks} (%): {rates}")
    by = summary["mined_by"]
    what = by["model"] if by["ranker"] == "model" else by["passages"]
    lines.append(f"mined by: {by['ranker']} {json.dumps(what)}")
    if "teacher" in by:
        lines.append(f"teacher: {json.dumps(by['teacher'])}")
    stages = ", ".join(f"{name} {s:.1f}" for name, s in summary["seconds_by_stage"].items())
    lines.append(f"seconds: {summary['seconds']:.1f} ({stages})")
    return "\n".join(lines)
