"""The loss-options study's saved state (:mod:`studies.saved`): its students' arms, the control's
and Matryoshka's with their evaluations at every smaller dim, and the multi-vector arm that
studies/squad_multivector trains here (not on this study's page). Its training file is the
cross-fitted study's, restored from that study's own saved state.

    python -m studies.squad_losses.saved save --out runs/squad_losses --saved DIR
    python -m studies.squad_losses.saved restore --saved DIR --out runs/squad_losses \\
        --passages data/squad/passages.tsv
"""

from __future__ import annotations

from studies import saved as state
from studies.saved import Layout

ARMS = ("control", "symmetric", "hardness", "guided", "matryoshka", "multi")
AT_DIMS = ("eval-dims",)  # run.sh's marker: every smaller dim evaluated
LAYOUT = Layout(
    setup=(),
    packed=(),
    arms=ARMS,
    run_steps=(),
    arm_steps=(("control", AT_DIMS), ("matryoshka", AT_DIMS)),
)

if __name__ == "__main__":
    state.main(LAYOUT)
