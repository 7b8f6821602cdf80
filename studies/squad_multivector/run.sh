#!/usr/bin/env bash
# Late interaction on SQuAD (data/squad), on a CPU, with all-MiniLM-L6-v2, in the cross-fitted
# study's data: a vector a token scored by MaxSim (model.vectors multi) against one vector a
# passage, the same data, negatives, batch and updates, and BM25, each alone and fused with BM25.
# The students are the loss study's: its control and its multi arm, at seeds 1 to 3, trained by
# studies/squad_losses/run.sh into its folder (so a control it has trained is not trained again);
# each is then fused with BM25 on dev as the cross-fitted study fuses its students (RRF, and
# linear with its weight tuned on the other half of the dev articles), and BM25 is evaluated on
# the same questions. Method, choices and expected time: README.md beside this script.
#
#   studies/squad_multivector/run.sh            # every step in order; done steps skipped
#   DRY_RUN=1 studies/squad_multivector/run.sh  # toy data, tiny BERT, 2 steps a run (minutes)
#
# Knobs (environment): SEEDS, OUT (this study's folder: BM25, the dev halves, the fused
# evaluations; the students live in the loss study's folder beside it, OUT/../squad_losses, or
# squad_losses-dry in a dry run), CODE (a source tree to run, e.g. a git worktree pinned for the
# study), PY, SAVED (the folder this study's state is saved in after each seed and restored from
# at the start: saved.py; "" for none), LOSSES_SAVED (the loss study's, for the students: its
# SAVED), CROSSFIT (where the loss study restores its training file from), ARMS (default
# "control multi"; ARMS=control SEEDS=N fuses the control the loss study has just trained at seed
# N, on the machine that trained it, while its model is there), KEEP_OUT=1 (a dry run keeps the
# OUT and the students it finds: for a test that calls it one arm at a time); HARD, EPOCHS, CHUNK
# and PRECISION reach the loss study as they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
ARMS=${ARMS:-"control multi"}
[[ -n ${ARMS// /} ]] || { echo "error: ARMS: no arm named (control, multi)" >&2; exit 2; }
for name in $ARMS; do
  [[ $name == control || $name == multi ]] ||
    { echo "error: ARMS: unknown arm $name (control, multi)" >&2; exit 2; }
done
LOSSES_STUDY=studies/squad_losses/run.sh
STUDY=squad_multivector
source studies/setup.sh
LOSSES=$(dirname "$OUT")/squad_losses$SUFFIX  # the loss study's OUT: where table.py reads them
if [[ $DRY_RUN == 1 ]]; then
  SAVED=${SAVED:-}
  LOSSES_SAVED=${LOSSES_SAVED:-}
  [[ ${KEEP_OUT:-0} == 1 ]] || rm -rf "$LOSSES"  # afresh; the loss study keeps it seed to seed
else
  SAVED=${SAVED-studies/squad_multivector/saved}
  LOSSES_SAVED=${LOSSES_SAVED-studies/squad_losses/saved}
fi
run_name() { echo "gradcache-b$B-s$1"; }

# The loss study's control and multi arms at one seed: trained, indexed, evaluated, saved there.
students() {  # seed
  ARMS=$ARMS SEEDS=$1 OUT=$LOSSES SAVED=$LOSSES_SAVED CODE=${CODE:-} PY=$PY DRY_RUN=$DRY_RUN \
    PAGE=0 KEEP_OUT=1 bash "$LOSSES_STUDY"
}

# A student fused with BM25 on dev (hybrid.sh: RRF, and linear on each half of dev with its weight
# tuned on the other), with the settings the student was indexed with, into OUT/arm/run; then
# run.json there (the student it fused and its index's size) marks it done. The student's model
# and index must be there: a run restored from the loss study's saved state has neither.
fused() {  # arm seed
  local name
  name=$(run_name "$2")
  local run=$LOSSES/$1$SUFFIX/$name into=$OUT/$1$SUFFIX/$name item items sets=()
  done_or "$into/run.json" && return 0
  if [[ ! -d $run/model || ! -f $run/index/meta.json ]]; then
    echo "error: $run: no model or index (restored from a saved state?): fusing needs them;" \
      "move $run aside to train it again" >&2
    exit 2
  fi
  read -r -a items <<< "$(json_key "$run/run.json" sets)"
  for item in "${items[@]}"; do sets+=(--set "$item"); done
  hybrid "$run" "$run/model" "$into" "${sets[@]}"
  "$PY" -c '
import sys
from pathlib import Path
from dpr_cache.runtime.atomic import write_json_atomic
from studies.squad_multivector.collect import fused_record
out, student, arm, seed = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
write_json_atomic(out, fused_record(student, arm, seed))' "$into/run.json" "$run" "$1" "$2"
}
json_key() {  # file key
  "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# -- what earlier sessions saved, BM25 on dev, the dev halves ----------------------------------
if [[ $DRY_RUN != 1 && ! -f data/squad/train.jsonl ]]; then "${BIN[@]}" data squad; fi
[[ -z $SAVED ]] ||
  "$PY" -m studies.squad_multivector.saved restore --saved "$SAVED" --out "$OUT" \
    --passages "$PASSAGES"
done_or "$OUT/references$SUFFIX/bm25/run.json" ||
  "$PY" -m studies.squad_batch_size.bm25_eval -c "$CFG" --out "$OUT/references$SUFFIX/bm25" \
    --set "data.passages=$PASSAGES" --set "data.dev_qa=$DEV_QA" "${EXTRA[@]}"
done_or "$OUT/dev-split/split.json" ||  # the dev halves each linear fusion's weight is tuned on
  "$PY" -m studies.squad_hard_negatives.split_dev --dev "$DEV" --qa "$DEV_QA" --out "$OUT/dev-split"
save_state

# -- each seed: the two students, then each fused with BM25 ---------------------------------------
for seed in "${seeds[@]}"; do
  students "$seed"
  for name in $ARMS; do fused "$name" "$seed"; done
  save_state
done

# -- the page ------------------------------------------------------------------------------------
"$PY" -m studies.squad_multivector.table --runs "$OUT" --suffix="$SUFFIX" "${TABLE[@]}"
