#!/usr/bin/env bash
# A teacher that has not seen the questions it scores: the teachers study cross-fitted, on SQuAD
# (data/squad), on a CPU, with all-MiniLM-L6-v2. The training articles are split in two folds
# (dpr-cache data folds); round 1 trained on each fold (BM25's negatives, H = 1) mines the other
# fold's questions over its index with the answer rule only, its candidates followed by BM25's,
# and, fused with BM25 at a weight tuned on those questions, scores them (dpr-cache score
# --teacher hybrid) and cleans them (the same, with --teacher-relative). Five arms of students
# from the base model, the same recipe, the same updates, at seeds 1 to 3 each:
#   control  the contrastive loss on the candidates
#   kl0      distill_kl alone (train.distill_weight 0) on the teacher's scores
#   kl05     distill_kl mixed half and half with the contrastive loss
#   mse05    margin_mse mixed half and half with the contrastive loss
#   cleaned  the contrastive loss on the candidates the teacher's rule keeps
# Each student is evaluated alone and fused with BM25 (linear, its weight picked on the other half
# of the dev articles; and RRF). Every trained run goes through studies/squad_batch_size/run.sh
# (its recipe, its independent numbers check), so the arms differ only in the file and the loss.
# Method, choices and expected time: README.md beside this script.
#
#   studies/squad_crossfit/run.sh            # every step in order; done steps skipped
#   DRY_RUN=1 studies/squad_crossfit/run.sh  # toy data, tiny BERT, 2 steps a run (minutes)
#
# Knobs (environment): SEEDS, HARD, EPOCHS (the students'), TEACHER_EPOCHS (round 1's), CHUNK,
# PRECISION (train's autocast), MINE (the mining options), CLEAN (score's teacher rule), ARMS,
# OUT, CODE (a source tree to run, e.g. a git worktree pinned for the study), PY, SAVED (the
# folder the study's state is saved in after each step and restored from at the start, to
# commit: saved.py; "" for none; the real study's default studies/squad_crossfit/saved, a dry
# run's none).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
HARD=${HARD:-3}
EPOCHS=${EPOCHS:-2}
TEACHER_EPOCHS=${TEACHER_EPOCHS:-3}
CHUNK=${CHUNK:-32}
PRECISION=${PRECISION:-bf16}
MINE=${MINE:-"--negatives 30 --depth 100 --keep-bm25"}
CLEAN=${CLEAN:-"--teacher-relative 0.95"}
ARMS=${ARMS:-"control kl0 kl05 mse05 cleaned"}
BATCH_STUDY=studies/squad_batch_size/run.sh
STUDY=squad_crossfit
source studies/setup.sh
if [[ $DRY_RUN == 1 ]]; then
  SOURCE_TRAIN=data/toy/train.jsonl
  SAVED=${SAVED:-}
else
  SOURCE_TRAIN=data/squad/train.jsonl
  SAVED=${SAVED-studies/squad_crossfit/saved}
fi
run_name() { echo "gradcache-b$B-s$1"; }

# One arm of trained runs by the batch-size study's script: its recipe, its numbers check.
arm() {  # out-folder training-file hard-negatives epochs settings run-names
  OUT=$1 TRAIN=$2 HARD=$3 EPOCHS=$4 SETS=$5 ONLY=$6 CHUNK=$CHUNK PRECISION=$PRECISION \
    CODE=${CODE:-} DRY_RUN=$DRY_RUN PY=$PY PAGE=0 SEEDS=$SEEDS SEEDS_DRY=$SEEDS KEEP_OUT=1 \
    bash "$BATCH_STUDY"
}
json_key() {  # file key
  "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

# -- what earlier sessions saved, BM25's negatives and BM25 on dev ------------------------------
if [[ $DRY_RUN != 1 && ! -f data/squad/train.jsonl ]]; then "${BIN[@]}" data squad; fi
[[ -z $SAVED ]] ||
  "$PY" -m studies.squad_crossfit.saved restore --saved "$SAVED" --out "$OUT" --passages "$PASSAGES"
[[ -f $BM25_TRAIN ]] ||
  "${BIN[@]}" mine --ranker bm25 --train "$SOURCE_TRAIN" --passages "$PASSAGES" --out "$BM25_TRAIN" \
    -q "${CACHE[@]}"
arm "$OUT/references$SUFFIX" "$BM25_TRAIN" 1 "$TEACHER_EPOCHS" "" "bm25"
done_or "$OUT/dev-split/split.json" ||  # the dev halves each linear fusion's weight is tuned on
  "$PY" -m studies.squad_hard_negatives.split_dev --dev "$DEV" --qa "$DEV_QA" --out "$OUT/dev-split"

# -- the cross-fitted teacher: two folds of articles, round 1 on each scoring the other ----------
# (written again where the saved state restored folds.json without the fold files: a round 1
# that trains again must find its fold's file, never the whole training set in its place)
[[ -f $OUT/folds/fold-1/train.jsonl && -f $OUT/folds/fold-2/train.jsonl ]] ||
  "${BIN[@]}" data folds --train "$BM25_TRAIN" --out "$OUT/folds" --folds 2
WEIGHTS=()
for k in 1 2; do
  held=$OUT/folds/fold-$k
  teacher=$OUT/teacher-$k
  arm "$OUT/round1-fold$k$SUFFIX" "$held/train.jsonl" 1 "$TEACHER_EPOCHS" "" \
    "$(run_name "${seeds[0]}")"
  round1=$OUT/round1-fold$k$SUFFIX/$(run_name "${seeds[0]}")
  ranker=(--model "$round1/model" --index "$round1/index")
  # the weight: linear fusion with BM25 tuned on the held questions (dev: the figures it gives)
  done_or "$teacher/weight/metrics.json" ||
    "${BIN[@]}" eval -c "$CFG" -q --set "output_dir=$round1" --set "data.passages=$PASSAGES" \
      --set "data.dev_qa=$DEV_QA" --model "$round1/model" --set eval.fusion_depth=1000 \
      "${EXTRA[@]}" --set eval.fusion=linear --set eval.fusion_weight=auto \
      --set "eval.fusion_tune_qa=$held/held.qa.tsv" --out "$teacher/weight"
  weight=$(json_key "$teacher/weight/fusion.json" weight)
  WEIGHTS+=("$weight")
  # shellcheck disable=SC2086  # MINE and CLEAN hold several options
  done_or "$teacher/mined.summary.json" ||
    "${BIN[@]}" mine "${ranker[@]}" --train "$held/held.jsonl" --out "$teacher/mined.jsonl" $MINE \
      -q "${CACHE[@]}" | tee "$teacher/mined.txt"
  done_or "$teacher/scored.summary.json" ||
    "${BIN[@]}" score --teacher hybrid "${ranker[@]}" --fusion-weight "$weight" \
      --train "$teacher/mined.jsonl" --out "$teacher/scored.jsonl" -q "${CACHE[@]}" |
      tee "$teacher/scored.txt"
  done_or "$teacher/bm25-scored.summary.json" ||  # BM25's share, to read round 1's off
    "${BIN[@]}" score --teacher bm25 --passages "$PASSAGES" --train "$teacher/mined.jsonl" \
      --out "$teacher/bm25-scored.jsonl" -q "${CACHE[@]}" | tee "$teacher/bm25-scored.txt"
  # shellcheck disable=SC2086
  done_or "$teacher/cleaned.summary.json" ||
    "${BIN[@]}" score --teacher hybrid "${ranker[@]}" --fusion-weight "$weight" $CLEAN \
      --train "$teacher/mined.jsonl" --out "$teacher/cleaned.jsonl" -q "${CACHE[@]}" |
      tee "$teacher/cleaned.txt"
done
joined() {  # kind: the two folds' files, fold 1's questions then fold 2's
  cat "$OUT/teacher-1/$1.jsonl" "$OUT/teacher-2/$1.jsonl" > "$OUT/train.$1-all.jsonl.tmp"
  mv "$OUT/train.$1-all.jsonl.tmp" "$OUT/train.$1-all.jsonl"
}
keep() {  # kind: its questions with H candidates before cleaning, in the scored file's order
  "$PY" -m studies.squad_teachers.teacher keep --hard "$HARD" --by "$OUT/train.scored-all.jsonl" \
    --train "$OUT/train.$1-all.jsonl" --out "$OUT/train.$1.jsonl"
}
done_or "$OUT/train.scored.keep.json" || { joined scored && keep scored; }
done_or "$OUT/train.cleaned.keep.json" || { joined cleaned && keep cleaned; }
done_or "$OUT/teacher/teacher.json" ||
  "$PY" -m studies.squad_teachers.teacher temperature \
    --hybrid "$OUT"/teacher-{1,2}/scored.jsonl --bm25 "$OUT"/teacher-{1,2}/bm25-scored.jsonl \
    --weight "${WEIGHTS[@]}" --out "$OUT/teacher/teacher.json"
done_or "$OUT/teacher/margins.json" ||  # BM25's part of the teacher's margins and round 1's
  "$PY" -m studies.squad_teachers.teacher margins \
    --hybrid "$OUT"/teacher-{1,2}/scored.jsonl --bm25 "$OUT"/teacher-{1,2}/bm25-scored.jsonl \
    --weight "${WEIGHTS[@]}" --out "$OUT/teacher/margins.json"
T=$(json_key "$OUT/teacher/teacher.json" teacher_temperature)
save_state

# -- the students: every arm at seed 1, then at seed 2, then at seed 3 --------------------------
student() {  # arm seed: trained, evaluated, fused with BM25, saved
  local file=$OUT/train.scored.jsonl sets=""
  case $1 in
    control) ;;
    kl0) sets="train.loss=distill_kl train.distill_weight=0 train.teacher_temperature=$T" ;;
    kl05) sets="train.loss=distill_kl train.distill_weight=0.5 train.teacher_temperature=$T" ;;
    mse05) sets="train.loss=margin_mse train.distill_weight=0.5" ;;
    cleaned) file=$OUT/train.cleaned.jsonl ;;
    *) echo "error: ARMS: unknown arm $1" >&2; exit 2 ;;
  esac
  arm "$OUT/$1$SUFFIX" "$file" "$HARD" "$EPOCHS" "$sets" "$(run_name "$2")"
  fuse "$OUT/$1$SUFFIX/$(run_name "$2")"
  save_state
}
for seed in "${seeds[@]}"; do
  for name in $ARMS; do student "$name" "$seed"; done
done
save_state

# -- the page ------------------------------------------------------------------------------------
"$PY" -m studies.squad_crossfit.table --runs "$OUT" --suffix="$SUFFIX" "${TABLE[@]}"
