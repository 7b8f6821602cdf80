#!/usr/bin/env bash
# DPR's second round on SQuAD (data/squad), on a CPU, with all-MiniLM-L6-v2: round 1 is the
# batch-size study's GradCache B=128 recipe on BM25's negatives; its seed-1 model mines hard
# negatives over its own index (dpr-cache mine); round 2 trains the base model again, the same
# recipe and updates, on (b) the mined negatives beside BM25's, at every seed, and on (a) the
# mined ones alone, at the first; BM25 and the untrained model are scored on the same questions,
# and BM25 fused with each model (linear, its weight picked on the other half of the dev articles;
# and RRF). Every trained run goes through studies/squad_batch_size/run.sh (its recipe, its
# independent numbers check), so the rounds differ in the training file only.
# Method, choices and expected time: README.md beside this script.
#
#   studies/squad_hard_negatives/run.sh            # every step in order; done steps skipped
#   DRY_RUN=1 studies/squad_hard_negatives/run.sh  # toy data, tiny BERT, 2 steps a run (minutes)
#
# Knobs (environment): SEEDS, OUT, CODE (a source tree to run, e.g. a git worktree pinned for
# the whole study), MINE (the mining options), PY.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
MINE=${MINE:-"--negatives 30 --depth 100 --relative-margin 0.05"}
BATCH_STUDY=studies/squad_batch_size/run.sh
STUDY=squad_hard_negatives
source studies/setup.sh
names=""
for seed in "${seeds[@]}"; do names+=" gradcache-b$B-s$seed"; done

# One arm of trained runs by the batch-size study's script: its recipe, its numbers check.
arm() {  # out-folder training-file run-names
  OUT=$1 TRAIN=$2 ONLY=$3 CODE=${CODE:-} DRY_RUN=$DRY_RUN PY=$PY PAGE=0 SEEDS=$SEEDS \
    SEEDS_DRY=$SEEDS bash "$BATCH_STUDY"
}

# -- round 1, the references, the mined files -----------------------------------------------------
arm "$OUT/round1$SUFFIX" "$BM25_TRAIN" "$names"
arm "$OUT/references$SUFFIX" "$BM25_TRAIN" "off-the-shelf bm25"
MINER=$OUT/round1$SUFFIX/gradcache-b$B-s${seeds[0]}
for kind in mined both; do
  file=$OUT/train.$kind.jsonl
  [[ -f $file ]] && { echo "== $file: done, skipped"; continue; }
  keep=(); [[ $kind == both ]] && keep=(--keep-bm25)
  # shellcheck disable=SC2086  # MINE holds several options
  "${BIN[@]}" mine --model "$MINER/model" --index "$MINER/index" --train "$BM25_TRAIN" \
    --out "$file" $MINE "${keep[@]}" -q "${CACHE[@]}" | tee "$OUT/train.$kind.txt"
done

# -- round 2: (b) mined + BM25 at every seed, (a) the mined alone at the first --------------------
arm "$OUT/round2-both$SUFFIX" "$OUT/train.both.jsonl" "$names"
arm "$OUT/round2-mined$SUFFIX" "$OUT/train.mined.jsonl" "gradcache-b$B-s${seeds[0]}"

# -- BM25 fused with each model: linear (weight picked on the other half of the dev articles)
#    and RRF, over each side's top 1000 --------------------------------------------------------
"$PY" -m studies.squad_hard_negatives.split_dev --dev "$DEV" --qa "$DEV_QA" --out "$OUT/dev-split"
source studies/squad_hard_negatives/hybrid.sh
hybrid "$OUT/references$SUFFIX/off-the-shelf" "$BASE"
for seed in "${seeds[@]}"; do
  for round in round1 round2-both; do
    dir=$OUT/$round$SUFFIX/gradcache-b$B-s$seed
    hybrid "$dir" "$dir/model"
  done
done
dir=$OUT/round2-mined$SUFFIX/gradcache-b$B-s${seeds[0]}
hybrid "$dir" "$dir/model"

# -- the filter checked on a sample, then the page ---------------------------------------------
"$PY" -m studies.squad_hard_negatives.filter_check --mined "$OUT/train.mined.jsonl" \
  --out "$OUT/filter_check.json"
"$PY" -m studies.squad_hard_negatives.table --runs "$OUT" --suffix="$SUFFIX" "${TABLE[@]}"
