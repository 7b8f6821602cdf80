"""The late-interaction study's saved state (:mod:`studies.saved`): its dev halves, BM25 on dev
and each student's fusions with BM25 (``OUT/<arm>/<run>``, finished once its three fused
evaluations and its run.json are there). The students themselves are the loss study's, saved in
that study's own state.

    python -m studies.squad_multivector.saved save --out runs/squad_multivector --saved DIR
    python -m studies.squad_multivector.saved restore --saved DIR --out runs/squad_multivector \\
        --passages data/squad/passages.tsv
"""

from __future__ import annotations

from studies import saved as state
from studies.saved import Layout

ARMS = ("control", "multi")
LAYOUT = Layout(setup=("dev-split/split.json",), packed=(), arms=ARMS)

if __name__ == "__main__":
    state.main(LAYOUT)
