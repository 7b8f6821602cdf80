"""The teacher study's saved state (:mod:`studies.saved`): its set-up steps' done markers, the
two training files its students read, its students' arms.

    python -m studies.squad_teachers.saved save --out runs/squad_teachers --saved DIR
    python -m studies.squad_teachers.saved restore --saved DIR --out runs/squad_teachers \\
        --passages data/squad/passages.tsv
"""

from __future__ import annotations

from pathlib import Path

from studies import saved as state
from studies.saved import Layout, load_passages, pack, unpack
from studies.squad_teachers.collect import ARMS

__all__ = ["LAYOUT", "SETUP", "load_passages", "pack", "restore", "save", "unpack"]

SETUP = (  # the set-up steps' done markers (run.sh)
    "train.mined.summary.json",
    "train.candidates.keep.json",
    "teacher/train.qa.tsv",
    "teacher/split/split.json",
    "teacher/weight/metrics.json",
    "train.scored.summary.json",
    "train.bm25-scored.summary.json",
    "teacher/teacher.json",
    "train.cleaned-all.summary.json",
    "train.cleaned.keep.json",
    "score-rate/rate.json",
)
LAYOUT = Layout(setup=SETUP, packed=("train.scored.jsonl", "train.cleaned.jsonl"), arms=tuple(ARMS))


def save(out: Path, saved: Path, suffix: str = "", passages_file: Path | None = None) -> list:
    return state.save(LAYOUT, out, saved, suffix, passages_file)


def restore(saved: Path, out: Path, passages_file: Path) -> list:
    return state.restore(LAYOUT, saved, out, passages_file)


if __name__ == "__main__":
    state.main(LAYOUT)
