"""The teacher study's set-up steps, from the training questions only (dev stays unseen):

    python -m studies.squad_teachers.teacher keep --hard 3 --by MINED --train FILE --out FILE
    python -m studies.squad_teachers.teacher qa --train FILE --out TSV
    python -m studies.squad_teachers.teacher temperature --hybrid FILE... --bm25 FILE... \
        --weight W... --out JSON
    python -m studies.squad_teachers.teacher margins --hybrid FILE... --bm25 FILE... \
        --weight W... --out JSON
    python -m studies.squad_teachers.teacher best --runs DIR --seed 1 --out JSON

``keep``: the records of a training file whose question has at least ``--hard`` candidates in
the mined file ``--by`` (the distillation loss learns the teacher's scores of H of a question's own
candidates, so a question with fewer cannot be in it), with what was dropped in
``<out stem>.keep.json``: every arm's file keeps the same questions, in the same order, so the
arms' updates hold the same questions.

``qa``: the training questions as a qas file, for picking the hybrid teacher's weight with
``dpr-cache eval`` on them. ``temperature``: the teacher's softmax temperature, chosen so that the
teacher's scores divided by it spread within a question's group (its positive and its mined
candidates) as much as round 1's own scores at the training temperature do; round 1's dense score
is read off as ``(hybrid - bm25) / weight`` from the same file scored by both teachers.
``margins``: from the same files, the teacher's margins split into BM25's part and round 1's.
``best``: the better of the two treatment arms at the first seed (MRR@10 on dev), fixed once
written, so the study's later seeds run the arm it picked.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpr_cache.data.qas import record_question_id
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

TREATMENTS = ("distill", "cleaned")
TRAIN_TEMPERATURE = 0.05  # the batch-size study's recipe (studies/squad_batch_size/run.sh)


def keep(by: Path, hard: int, train: Path, out: Path) -> dict[str, Any]:
    """``train``'s records whose question has ``hard`` or more candidates in ``by``."""
    enough = {
        record_question_id(r, n)
        for n, r in enumerate(_records(by))
        if len(r["hard_negative_ctxs"]) >= hard
    }
    kept = dropped = short = 0
    tmp = out.with_name(out.name + ".tmp")
    with train.open(encoding="utf-8") as f, tmp.open("w", encoding="utf-8") as g:
        for n, line in enumerate(line for line in f if line.strip()):
            record = json.loads(line)
            if record_question_id(record, n) in enough:
                g.write(line)
                kept += 1
                short += len(record.get("hard_negative_ctxs") or []) < hard
            else:
                dropped += 1
    tmp.replace(out)
    record = {
        "hard": hard,
        "by": str(by),
        "train": str(train),
        "kept": kept,
        "dropped": dropped,
        "kept_short": short,  # kept, with fewer than ``hard`` in ``train`` itself (filled)
    }
    write_json_atomic(out.with_suffix(".keep.json"), record)
    return record


def write_qa(train: Path, out: Path) -> int:
    """The training file's questions and answers as a DPR qas file; the number written."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
    n = 0
    for record in _records(train):
        writer.writerow([record["question"], json.dumps(record["answers"], ensure_ascii=False)])
        n += 1
    write_text_atomic(out, buffer.getvalue())
    return n


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """A JSON Lines file's records, one at a time."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _groups(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Each record's id and its teacher scores: the positive's, then its hard negatives'."""
    for n, record in enumerate(_records(path)):
        ctxs = record["positive_ctxs"][:1] + record["hard_negative_ctxs"]
        yield (
            record_question_id(record, n),
            np.array([c["teacher_score"] for c in ctxs], dtype=np.float64),
        )


def paired_groups(hybrid: Path, bm25: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each question's teacher scores in the same candidates file scored by the hybrid teacher
    and by BM25 (the positive's, then its candidates'), question by question; files that differ
    in a question or its candidates stop with an error."""
    pairs = itertools.zip_longest(_groups(hybrid), _groups(bm25), fillvalue=(None, None))
    for (qid, h), (qid_b, b) in pairs:
        if qid is None or qid_b is None or qid != qid_b or h.shape != b.shape:
            raise SystemExit(f"error: {hybrid} and {bm25} differ at question {qid or qid_b!r}")
        yield h, b


def spread(groups: list[np.ndarray]) -> float:
    """The pooled within-group standard deviation: sqrt(mean over groups of the variance of
    each group's scores about its own mean)."""
    return math.sqrt(float(np.mean([g.var() for g in groups if g.size > 1])))


def positive_first(groups: list[np.ndarray]) -> float:
    """The share (%) of groups whose positive (first) outscores every candidate."""
    return 100.0 * float(np.mean([g[0] > g[1:].max() for g in groups if g.size > 1]))


def teacher_temperature(parts: Sequence[tuple[Path, Path, float]]) -> dict[str, Any]:
    """The temperature that gives the teacher's scores round 1's spread, and what it rests on.
    ``parts``: (hybrid-scored file, bm25-scored file, the hybrid's weight) each, their groups
    pooled (a cross-fitted teacher: one part a fold, each with its own round 1 and weight)."""
    teacher, lexical, student = [], [], []
    for hybrid, bm25, weight in parts:
        for h, b in paired_groups(hybrid, bm25):
            teacher.append(h)
            lexical.append(b)
            student.append((h - b) / weight / TRAIN_TEMPERATURE)
    t_spread, s_spread = spread(teacher), spread(student)
    return {
        "teacher_temperature": round(t_spread / s_spread, 4),
        "weight": parts[0][2] if len(parts) == 1 else [w for _, _, w in parts],
        "train_temperature": TRAIN_TEMPERATURE,
        "groups": len(teacher),
        "candidates_a_group": float(np.mean([g.size - 1 for g in teacher])),
        "spread": {"teacher": t_spread, "round1": s_spread},
        "positive_first": {
            "teacher": positive_first(teacher),
            "round1": positive_first(student),
            "bm25": positive_first(lexical),
        },
    }


def margin_parts(parts: Sequence[tuple[Path, Path, float]]) -> dict[str, Any]:
    """The teacher's margins (the positive's score minus a candidate's) split into BM25's part
    and round 1's (the weight x round 1's cosine gap), over every (positive, candidate) pair of
    ``parts`` (as :func:`teacher_temperature` takes them): the questions and pairs, each part's
    mean, round 1's mean cosine gap, and each part's variance as a share (%) of the margins'."""
    lexical, dense, cosine = [], [], []
    for hybrid, bm25, weight in parts:
        for h, b in paired_groups(hybrid, bm25):
            round1 = h - b
            lexical.append(b[0] - b[1:])
            dense.append(round1[0] - round1[1:])
            cosine.append(dense[-1] / weight)
    bm25_part, round1_part = np.concatenate(lexical), np.concatenate(dense)
    margins = bm25_part + round1_part
    return {
        "questions": len(lexical),
        "pairs": len(margins),
        "bm25": float(bm25_part.mean()),
        "round1": float(round1_part.mean()),
        "round1_cosine": float(np.concatenate(cosine).mean()),
        "bm25_variance": float(100 * bm25_part.var() / margins.var()),
        "round1_variance": float(100 * round1_part.var() / margins.var()),
    }


def best_arm(runs: Path, suffix: str, seed: int) -> dict[str, Any]:
    """The treatment arm with the higher MRR@10 at ``seed`` (distill on a tie)."""
    figures = {}
    for arm in TREATMENTS:
        matches = sorted((runs / f"{arm}{suffix}").glob(f"gradcache-b*-s{seed}/eval/metrics.json"))
        if not matches:
            raise SystemExit(f"error: {runs}/{arm}{suffix}: no finished run at seed {seed}")
        figures[arm] = json.loads(matches[0].read_text())["mrr@10"]
    arm = max(TREATMENTS, key=lambda a: (figures[a], a == "distill"))
    return {"arm": arm, "by": "mrr@10", "seed": seed, "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    kept = sub.add_parser("keep")
    kept.add_argument("--hard", type=int, required=True)
    kept.add_argument("--by", type=Path, required=True)
    kept.add_argument("--train", type=Path, required=True)
    kept.add_argument("--out", type=Path, required=True)
    qa = sub.add_parser("qa")
    qa.add_argument("--train", type=Path, required=True)
    qa.add_argument("--out", type=Path, required=True)
    for step in ("temperature", "margins"):
        scored = sub.add_parser(step)
        scored.add_argument("--hybrid", type=Path, nargs="+", required=True)
        scored.add_argument("--bm25", type=Path, nargs="+", required=True)
        scored.add_argument("--weight", type=float, nargs="+", required=True)
        scored.add_argument("--out", type=Path, required=True)
    best = sub.add_parser("best")
    best.add_argument("--runs", type=Path, required=True)
    best.add_argument("--suffix", default="")
    best.add_argument("--seed", type=int, required=True)
    best.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    done = args.out.with_suffix(".keep.json") if args.step == "keep" else args.out
    if done.is_file() and args.step != "qa":  # keep: its record, written after its file
        print(f"== {args.out}: done, skipped")
        return
    if args.step == "keep":
        record = keep(args.by, args.hard, args.train, args.out)
        print(
            f"{args.out}: {record['kept']} questions kept, {record['dropped']} with fewer than "
            f"{args.hard} candidates dropped"
        )
    elif args.step == "qa":
        print(f"{write_qa(args.train, args.out)} questions written to {args.out}")
    elif args.step in ("temperature", "margins"):
        parts = list(zip(args.hybrid, args.bm25, args.weight, strict=True))
        compute = teacher_temperature if args.step == "temperature" else margin_parts
        write_json_atomic(args.out, compute(parts))
        print(f"written to {args.out}")
    else:
        chosen = best_arm(args.runs, args.suffix, args.seed)
        write_json_atomic(args.out, chosen)
        print(f"best arm at seed {args.seed}: {chosen['arm']} ({chosen['figures']})")


if __name__ == "__main__":
    main()
