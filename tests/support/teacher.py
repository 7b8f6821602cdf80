"""The toy training file with a teacher's scores, written deterministically for the tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.fixtures import TOY

__all__ = ["overlap_score", "write_scored_toy"]


def overlap_score(question: str, ctx: dict) -> float:
    """A stand-in teacher: the words a passage shares with the question, plus a tie-breaker from
    the passage's length (a float with a fraction, as a cross-encoder's logit is)."""
    words = set(re.findall(r"\w+", question.lower()))
    text = re.findall(r"\w+", f"{ctx.get('title', '')} {ctx['text']}".lower())
    return float(len(words.intersection(text))) + len(text) / 1000.0


def write_scored_toy(
    path: Path, *, unscored: int | None = None, bad: str | None = None, extra: int = 0
) -> Path:
    """data/toy/train.jsonl with ``teacher_score`` on every positive and hard negative; every
    other key kept. ``unscored``: that record's (0-based) second hard negative is left without
    a score; ``bad``: the first record's positive gets the JSON literal ``bad`` as its score;
    ``extra``: each record gets the positives of the next ``extra`` records (of other titles)
    as further hard negatives (the toy has 2 a question)."""
    records = [json.loads(x) for x in (TOY / "train.jsonl").read_text("utf-8").splitlines()]
    lines = []
    for n, record in enumerate(records):
        own = record["positive_ctxs"][0]
        others = (records[(n + k) % len(records)]["positive_ctxs"][0] for k in range(1, 60))
        others = [c for c in others if c["title"] != own["title"]][:extra]
        record["hard_negative_ctxs"] = record["hard_negative_ctxs"] + [dict(c) for c in others]
        for key in ("positive_ctxs", "hard_negative_ctxs"):
            for ctx in record[key]:
                ctx["teacher_score"] = overlap_score(record["question"], ctx)
        if n == unscored:
            del record["hard_negative_ctxs"][1]["teacher_score"]
        text = json.dumps(record, ensure_ascii=False)
        if bad is not None and n == 0:
            score = record["positive_ctxs"][0]["teacher_score"]
            text = text.replace(f'"teacher_score": {score}', f'"teacher_score": {bad}', 1)
        lines.append(text)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
