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


def write_scored_toy(path: Path, *, unscored: int | None = None, bad: str | None = None) -> Path:
    """data/toy/train.jsonl with ``teacher_score`` on every positive and hard negative; every
    other key kept. ``unscored``: that record's (0-based) second hard negative is left without
    a score; ``bad``: that record's positive gets the JSON literal ``bad`` as its score."""
    lines = []
    for n, line in enumerate((TOY / "train.jsonl").read_text(encoding="utf-8").splitlines()):
        record = json.loads(line)
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
