"""The one miner: hard negatives for every question of a training file, whatever ranks them.

For each question (DPR JSON or JSON Lines), a ranker (:mod:`~dpr_cache.retrieval.mining.rankers`:
the model over its index, or BM25) gives its candidates best first; :func:`negatives_of` walks the
window ``[skip, skip + depth)`` of them, and those no rule drops
(:mod:`~dpr_cache.retrieval.mining.rules`: the positive, judged relevant, holding an answer,
within a margin of the positive by the ranker's score or a teacher's) become the record's
``hard_negative_ctxs`` (``passage_id``, ``title``, ``text``, ``score``), best first; with
``keep_bm25`` the file's own hard negatives follow them. Every other key is kept. The records go
to ``OUT`` as JSON Lines, with what mined them, what each rule dropped and the seconds each stage
took beside it (``<OUT stem>.summary.json``).

Resumable (:mod:`dpr_cache.runtime.resumable`): the questions go in parts of ``batch``, each
written whole into ``OUT.parts/``; a rerun with the same ranker, file, settings and qrels keeps
the finished parts. Under ``torchrun`` every rank ranks every part (the model's ranker splits the
index's shards over the ranks) and rank 0 writes it. A question's id (for the qrels)
is its record's ``id``, ``qid``, ``_id`` or ``query_id``, else its place in the file from 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from dpr_cache.data.answers import has_answer
from dpr_cache.data.layouts import iter_dpr_records
from dpr_cache.data.passages import passage_columns, passage_rows
from dpr_cache.errors import InputError
from dpr_cache.retrieval.metrics import hit_metrics, read_qrels
from dpr_cache.retrieval.mining.parts import records, write_records
from dpr_cache.retrieval.mining.rankers import Ranked, Ranker
from dpr_cache.retrieval.mining.rules import RULES, MineSpec, check_spec, drop_reason
from dpr_cache.retrieval.teacher import Group, Passage, Teacher, passage_of, score_groups
from dpr_cache.runtime.atomic import check_output_file
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.resumable import (
    PartJob,
    PartsSpec,
    file_signature,
    fingerprint,
    finish_parts,
    open_parts,
    run_parts,
)

__all__ = ["mine", "mine_part", "negatives_of", "HIT_KS"]

HIT_KS = (1, 5, 20, 100)
ANSWER_AT = "answer_at_"  # a part's count of questions whose first answer is at a window rank


def mine(
    ranker: Ranker,
    train: Path,
    out: Path,
    spec: MineSpec,
    *,
    qrels: Path | None = None,
    rank: int = 0,
    progress: bool = True,
    command: str = "",
    laps: Laps | None = None,
    teacher: Teacher | None = None,
) -> dict[str, Any] | None:
    """Mine ``train`` into ``out`` (see the module docstring); rank 0 returns the summary. The
    caller holds the lock on ``out``. ``teacher`` (rank 0's; None elsewhere) scores the window's
    candidates and the positive for the teacher rule."""
    check_spec(spec)
    if spec.rules.by_teacher and rank == 0 and teacher is None:
        raise InputError("mine: --teacher-margin and --teacher-relative need --teacher")
    train, out = Path(train), Path(out)
    check_output_file(out, {"the training file": train})
    laps = laps or Laps()
    judged = read_qrels(qrels) if qrels is not None else None
    inputs = ranker.inputs() + ([teacher.inputs()] if teacher is not None else [])
    parts = _parts_spec(out, inputs, train, spec, qrels, rank)
    open_parts(parts)
    laps.lap("load the ranker and passages")
    raw = iter_dpr_records(train)  # the whole records again, streamed beside the parts (rank 0)
    job = PartJob(
        work=lambda batch: mine_part(ranker, batch, train, spec, judged, laps, teacher),
        write=lambda f, batch, mined: _written(f, raw, mined, spec, train),
        skip=lambda batch: _past(raw, len(batch)),
    )
    questions = records(train, spec.batch)
    totals = run_parts(parts, questions, job, laps=laps, progress=progress, desc="mine")
    if totals is None:
        return None
    summary = _with_dropped(totals)
    summary["answer_in_top"] = _hit_rates(summary, spec)
    stages = laps.seconds()
    mined_by = {**ranker.mined_by(), "qrels": str(qrels) if qrels else None}
    if teacher is not None:
        mined_by["teacher"] = teacher.describe()
    summary.update(
        train=str(train),
        out=str(out),
        settings=dataclasses.asdict(spec),
        command=command,
        seconds=round(sum(stages.values()), 1),
        seconds_by_stage=stages,
        mined_by=mined_by,
    )
    finish_parts(parts, summary)
    return summary


def _parts_spec(
    out: Path, ranker: list[Any], train: Path, spec: MineSpec, qrels: Path | None, rank: int
) -> PartsSpec:
    """The run's parts: of ``spec.batch`` questions, kept while the ranker (``ranker``: what
    the ranking depends on), the training file, the settings and the qrels stay the same."""
    judged = file_signature(qrels) if qrels is not None else None
    inputs = fingerprint(*ranker, file_signature(train), dataclasses.asdict(spec), judged)
    return PartsSpec(out, spec.batch, inputs, rank)


def _written(
    f: IO[str],
    raw: Iterator[tuple[str, Any]],
    mined: tuple[list[list[dict]], dict[str, Any]],
    spec: MineSpec,
    train: Path,
) -> dict[str, Any]:
    """A part's records written to ``f`` with their mined negatives; the part's counts."""
    negatives, counts = mined
    return {**counts, "kept_bm25": write_records(f, raw, negatives, spec.keep_bm25, train)}


def _past(raw: Iterator[tuple[str, Any]], n: int) -> None:
    """``raw`` moved past a finished part's ``n`` records."""
    for _ in itertools.islice(raw, n):
        pass


def _with_dropped(totals: dict[str, Any]) -> dict[str, Any]:
    """The summed counts with each rule's ``dropped_*`` count gathered under ``dropped``."""
    dropped = {rule: totals.pop(f"dropped_{rule}", 0) for rule in RULES}
    return {**totals, "dropped": dropped}


def mine_part(
    ranker: Ranker,
    batch: list,
    train: Path,
    spec: MineSpec,
    qrels: dict | None,
    laps: Laps,
    teacher: Teacher | None = None,
) -> tuple[list[list[dict]], dict[str, Any]]:
    """Each question's mined negatives (empty on ranks but 0) and the counts."""
    examples = [b[2] for b in batch]
    if spec.rules.match is not None:
        for where, _, example in batch:
            if not example["answers"]:
                raise InputError(
                    f"{train} {where}: question {example['question'][:60]!r} has no answers "
                    "to match (--match none, or --qrels, mines without them)"
                )
    positive_rows = _positive_rows(ranker, batch, train)
    laps.lap("find the positives")
    window = spec.skip + spec.depth
    ranked = ranker.rank([e["question"] for e in examples], positive_rows, window, laps)
    if ranked is None:
        return [], {}
    rows = sorted({int(r) for r in ranked.rows[:, spec.skip :].ravel() if r >= 0})
    found = passage_columns(ranker.dataset, rows)
    laps.lap("read the candidates")
    where = {row: i for i, row in enumerate(rows)}
    taught = [None] * len(batch)
    if teacher is not None and spec.rules.by_teacher:
        taught = _teacher_scores(teacher, batch, ranked, found, where, spec, train)
        laps.lap("score with the teacher")
    counts: Counter = Counter(questions=len(batch))
    mined = []
    for q, (_, qid, example) in enumerate(batch):
        judged = frozenset(p for p, g in (qrels or {}).get(qid, {}).items() if g > 0)
        negatives, answer_at = negatives_of(
            example, ranked, q, found, where, spec, judged, counts, taught[q]
        )
        mined.append(negatives)
        counts[f"{ANSWER_AT}{answer_at}"] += 1
    laps.lap("apply the rules")
    return mined, dict(counts)


def negatives_of(
    example: dict,
    ranked: Ranked,
    q: int,
    found: dict[str, list],
    where: dict[int, int],
    spec: MineSpec,
    judged: frozenset[str],
    counts: Counter,
    taught: tuple[float, dict[int, float]] | None = None,
) -> tuple[list[dict], int | None]:
    """The candidate loop: question ``q``'s candidates in its window, best first, kept unless a
    rule drops them, until ``spec.negatives`` are kept; and the rank in the window of the first
    candidate holding an answer (None: none does, or answers are not matched). ``taught``: the
    teacher's score of the positive and of each candidate row (None: no teacher rule)."""
    rows, scores = ranked.rows[q], ranked.scores[q]
    pos_score = None if np.isnan(ranked.positive[q]) else float(ranked.positive[q])
    out: list[dict] = []
    answer_at = None
    counts["skipped_top"] += int((rows[: spec.skip] >= 0).sum())
    window = zip(rows[spec.skip :].tolist(), scores[spec.skip :].tolist(), strict=True)
    for at, (row, score) in enumerate(window):
        if row < 0:
            break
        i = where[row]
        pid, text = found["id"][i], found["text"][i]
        holds = None
        if spec.rules.match is not None and answer_at is None:
            holds = has_answer(example["answers"], text, spec.rules.match)
            answer_at = at if holds else None
        if len(out) == spec.negatives:
            if answer_at is not None or spec.rules.match is None:
                break
            continue  # full: only looking for the first answer now
        counts["candidates"] += 1
        reason = drop_reason(
            example,
            pid,
            text,
            score,
            spec.rules,
            positive_score=pos_score,
            judged=judged,
            holds_answer=holds,
            teacher=None if taught is None else (taught[1][row], taught[0]),
        )
        if reason is not None:
            counts[f"dropped_{reason}"] += 1
            continue
        out.append(
            {
                "passage_id": pid,
                "title": found["title"][i],
                "text": text,
                "score": round(float(score), 4),
            }
        )
    counts["negatives"] += len(out)
    counts["short"] += len(out) < spec.negatives
    return out, answer_at


def _teacher_scores(
    teacher: Teacher,
    batch: list,
    ranked: Ranked,
    found: dict[str, list],
    where: dict[int, int],
    spec: MineSpec,
    train: Path,
) -> list[tuple[float, dict[int, float]] | None]:
    """For each question with a positive: the teacher's score of its first positive and of
    each candidate row of its window (None: no positive, so no teacher rule)."""
    asked, groups = [], []
    for q, (at, _, example) in enumerate(batch):
        if not example["positive_ctxs"]:
            continue
        rows = [r for r in ranked.rows[q, spec.skip :].tolist() if r >= 0]
        candidates = [where[r] for r in rows]
        passages = [passage_of(example["positive_ctxs"][0])] + [
            Passage(found["id"][i], found["title"][i], found["text"][i]) for i in candidates
        ]
        names = ["positive_ctxs[0]"] + [f"candidate {found['id'][i]!r}" for i in candidates]
        groups.append(Group(f"{train} {at}", example["question"], passages, names))
        asked.append((q, rows))
    taught: list[tuple[float, dict[int, float]] | None] = [None] * len(batch)
    for (q, rows), scores in zip(asked, score_groups(teacher, groups), strict=True):
        taught[q] = (float(scores[0]), dict(zip(rows, scores[1:].tolist(), strict=True)))
    return taught


def _positive_rows(ranker: Ranker, batch: list, train: Path) -> np.ndarray:
    """The passages row of each question's first positive (-1: none); InputError when a
    positive is not among the ranker's passages."""
    ids = [b[2]["positive_ctxs"][0]["passage_id"] if b[2]["positive_ctxs"] else None for b in batch]
    asked = [(i, pid) for i, pid in enumerate(ids) if pid is not None]
    rows = np.full(len(batch), -1, np.int64)
    found = passage_rows(ranker.dataset, [pid for _, pid in asked]) if asked else []
    for (i, pid), row in zip(asked, found, strict=True):
        if row < 0:
            raise InputError(
                f"{train} {batch[i][0]}: positive passage {pid!r} is not among the passages "
                f"of {ranker.passages}"
            )
        rows[i] = row
    return rows


def _hit_rates(summary: dict[str, Any], spec: MineSpec) -> dict[str, float]:
    """Percentage of questions with an answer-bearing candidate among the window's first k
    (the ``answer_at_*`` counts taken out of ``summary``); empty when answers are not matched."""
    ranks: list[float] = []
    for key in [k for k in summary if k.startswith(ANSWER_AT)]:
        at = key[len(ANSWER_AT) :]
        ranks += [math.inf if at == "None" else int(at)] * summary.pop(key)
    if spec.rules.match is None or not ranks:
        return {}
    ks = tuple(k for k in HIT_KS if k <= spec.depth) or (spec.depth,)
    hits = hit_metrics(ranks, ks)
    return {f"top{k}": round(float(hits[f"top{k}"].mean()), 2) for k in ks}
