"""The cross-fitted teacher study's saved state (:mod:`studies.saved`): its set-up steps' done
markers, the two training files its students read, its students' arms.

    python -m studies.squad_crossfit.saved save --out runs/squad_crossfit --saved DIR
    python -m studies.squad_crossfit.saved restore --saved DIR --out runs/squad_crossfit \\
        --passages data/squad/passages.tsv
"""

from __future__ import annotations

from studies import saved as state
from studies.saved import Layout

ARMS = ("control", "kl0", "kl05", "mse05", "cleaned")
FOLD_STEPS = ("weight/metrics.json", "mined.summary.json", "scored.summary.json")
FOLD_STEPS += ("bm25-scored.summary.json", "cleaned.summary.json")
LAYOUT = Layout(
    setup=(
        "dev-split/split.json",
        "folds/folds.json",
        *(f"teacher-{k}/{step}" for k in (1, 2) for step in FOLD_STEPS),
        "train.scored.keep.json",
        "train.cleaned.keep.json",
        "teacher/teacher.json",
        "teacher/margins.json",
    ),
    packed=("train.scored.jsonl", "train.cleaned.jsonl"),
    arms=ARMS,
)

if __name__ == "__main__":
    state.main(LAYOUT)
