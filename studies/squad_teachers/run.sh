#!/usr/bin/env bash
# A stronger ranker's scores taught to the dense model under GradCache, on SQuAD (data/squad), on
# a CPU, with all-MiniLM-L6-v2. Round 1 (the batch-size study's GradCache B=128 recipe on BM25's
# negatives) mines the training questions' candidates over its own index; the teacher, BM25 +
# weight x round 1 (the linear hybrid eval fuses, its weight picked on the training questions),
# scores each question's positive and candidates (dpr-cache score) and, in the third arm, drops
# the candidates it scores near the positive (dpr-cache mine --teacher). Three students from the
# base model, the same recipe and updates, H hard negatives a question drawn each epoch:
#   control  the contrastive loss on the mined candidates                  seeds 1-3
#   distill  distill_kl on the teacher's scores, mixed with the contrastive  seeds 1-3 if best
#   cleaned  the contrastive loss on the teacher-cleaned candidates          seeds 1-3 if best
# The better of distill and cleaned at seed 1 (MRR@10) is "the best arm", run at seeds 2 and 3.
# Each student is evaluated alone and fused with BM25 (linear, its weight picked on the other half
# of the dev articles; and RRF). Every trained run goes through studies/squad_batch_size/run.sh
# (its recipe, its independent numbers check), so the arms differ only in the file and the loss.
# Method, choices and expected time: README.md beside this script.
#
#   studies/squad_teachers/run.sh            # every step in order; done steps skipped
#   DRY_RUN=1 studies/squad_teachers/run.sh  # toy data, tiny BERT, 2 steps a run (minutes)
#
# Knobs (environment): SEEDS, HARD, DISTILL_WEIGHT (the contrastive share of the mix),
# CLEAN (mine's teacher rule), MINE (the mining options), OUT, CODE (a source tree to run, e.g. a
# git worktree pinned for the whole study), PY, SAVED (the folder the study's state is saved in
# after each step and restored from at the start, to commit: saved.py; "" for none; the real
# study's default studies/squad_teachers/saved, a dry run's none).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
HARD=${HARD:-3}
DISTILL_WEIGHT=${DISTILL_WEIGHT:-0.5}
MINE=${MINE:-"--negatives 30 --depth 100 --relative-margin 0.05"}
CLEAN=${CLEAN:-"--teacher-relative 0.95"}
BATCH_STUDY=studies/squad_batch_size/run.sh
STUDY=squad_teachers
source studies/setup.sh
if [[ $DRY_RUN == 1 ]]; then
  RATE=(--questions 4 --base "$BASE")
  SAVED=${SAVED:-}
else
  RATE=(--questions 200 --base "$BASE")
  SAVED=${SAVED-studies/squad_teachers/saved}
fi
run_name() { echo "gradcache-b$B-s$1"; }

# One arm of trained runs by the batch-size study's script: its recipe, its numbers check.
arm() {  # out-folder training-file hard-negatives settings run-names
  OUT=$1 TRAIN=$2 HARD=$3 SETS=$4 ONLY=$5 CODE=${CODE:-} DRY_RUN=$DRY_RUN PY=$PY PAGE=0 \
    SEEDS=$SEEDS SEEDS_DRY=$SEEDS KEEP_OUT=1 bash "$BATCH_STUDY"
}

# -- what earlier sessions saved, then round 1 and BM25 -----------------------------------------
if [[ $DRY_RUN != 1 && ! -f data/squad/train.jsonl ]]; then "${BIN[@]}" data squad; fi
[[ -z $SAVED ]] ||
  "$PY" -m studies.squad_teachers.saved restore --saved "$SAVED" --out "$OUT" --passages "$PASSAGES"

arm "$OUT/round1$SUFFIX" "$BM25_TRAIN" 1 "" "$(run_name "${seeds[0]}")"
arm "$OUT/references$SUFFIX" "$BM25_TRAIN" 1 "" "bm25"
ROUND1=$OUT/round1$SUFFIX/$(run_name "${seeds[0]}")
done_or "$OUT/dev-split/split.json" ||  # the dev halves each linear fusion's weight is tuned on
  "$PY" -m studies.squad_hard_negatives.split_dev --dev "$DEV" --qa "$DEV_QA" --out "$OUT/dev-split"
fuse "$ROUND1"
RANKER=(--model "$ROUND1/model" --index "$ROUND1/index")

# -- the candidates: round 1's own, mined over its index ----------------------------------------
# shellcheck disable=SC2086  # MINE and CLEAN hold several options
done_or "$OUT/train.mined.summary.json" ||
  "${BIN[@]}" mine "${RANKER[@]}" --train "$BM25_TRAIN" --out "$OUT/train.mined.jsonl" $MINE -q \
    "${CACHE[@]}" | tee "$OUT/train.mined.txt"
done_or "$OUT/train.candidates.keep.json" ||
  "$PY" -m studies.squad_teachers.teacher keep --hard "$HARD" --by "$OUT/train.mined.jsonl" \
    --train "$OUT/train.mined.jsonl" --out "$OUT/train.candidates.jsonl"

# -- the teacher: BM25 + weight x round 1, the weight picked on half the training articles -------
done_or "$OUT/teacher/train.qa.tsv" ||
  "$PY" -m studies.squad_teachers.teacher qa --train "$OUT/train.candidates.jsonl" \
    --out "$OUT/teacher/train.qa.tsv"
done_or "$OUT/teacher/split/split.json" ||
  "$PY" -m studies.squad_hard_negatives.split_dev --dev "$OUT/train.candidates.jsonl" \
    --qa "$OUT/teacher/train.qa.tsv" --out "$OUT/teacher/split"
done_or "$OUT/teacher/weight/metrics.json" ||
  "${BIN[@]}" eval -c "$CFG" -q --set "output_dir=$ROUND1" --set "data.passages=$PASSAGES" \
    --model "$ROUND1/model" --set eval.fusion_depth=1000 "${EXTRA[@]}" \
    --set "data.dev_qa=$OUT/teacher/split/dev-a.qa.tsv" --set eval.fusion=linear \
    --set eval.fusion_weight=auto --set "eval.fusion_tune_qa=$OUT/teacher/split/dev-b.qa.tsv" \
    --out "$OUT/teacher/weight"
WEIGHT=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["weight"])' \
  "$OUT/teacher/weight/fusion.json")
done_or "$OUT/train.scored.summary.json" ||
  "${BIN[@]}" score --teacher hybrid "${RANKER[@]}" --fusion-weight "$WEIGHT" \
    --train "$OUT/train.candidates.jsonl" --out "$OUT/train.scored.jsonl" -q "${CACHE[@]}" \
    | tee "$OUT/train.scored.txt"
done_or "$OUT/train.bm25-scored.summary.json" ||  # BM25's share, to read the dense share off
  "${BIN[@]}" score --teacher bm25 --passages "$PASSAGES" --train "$OUT/train.candidates.jsonl" \
    --out "$OUT/train.bm25-scored.jsonl" -q "${CACHE[@]}" | tee "$OUT/train.bm25-scored.txt"
done_or "$OUT/teacher/teacher.json" ||
  "$PY" -m studies.squad_teachers.teacher temperature --hybrid "$OUT/train.scored.jsonl" \
    --bm25 "$OUT/train.bm25-scored.jsonl" --weight "$WEIGHT" \
    --out "$OUT/teacher/teacher.json"
T=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["teacher_temperature"])' \
  "$OUT/teacher/teacher.json")
# shellcheck disable=SC2086
done_or "$OUT/train.cleaned-all.summary.json" ||
  "${BIN[@]}" mine "${RANKER[@]}" --train "$BM25_TRAIN" --out "$OUT/train.cleaned-all.jsonl" \
    $MINE --teacher hybrid --fusion-weight "$WEIGHT" $CLEAN -q "${CACHE[@]}" \
    | tee "$OUT/train.cleaned-all.txt"
done_or "$OUT/train.cleaned.keep.json" ||  # the control's questions, in the same order
  "$PY" -m studies.squad_teachers.teacher keep --hard "$HARD" --by "$OUT/train.mined.jsonl" \
    --train "$OUT/train.cleaned-all.jsonl" --out "$OUT/train.cleaned.jsonl"

# -- score's rate with a cross-encoder of all-MiniLM-L6-v2's size, for NQ's projection -----------
done_or "$OUT/score-rate/rate.json" ||
  "$PY" -m studies.squad_teachers.score_rate --train "$OUT/train.candidates.jsonl" "${RATE[@]}" \
    --out "$OUT/score-rate" "${CACHE[@]}"
save_state

# -- the students: seed 1 of each arm, the best arm picked, then seeds 2 and 3 -------------------
DISTILL="train.loss=distill_kl train.distill_weight=$DISTILL_WEIGHT train.teacher_temperature=$T"
student() {  # arm seed: trained, evaluated, fused with BM25, saved
  case $1 in
    control) arm "$OUT/control$SUFFIX" "$OUT/train.scored.jsonl" "$HARD" "" "$(run_name "$2")" ;;
    distill) arm "$OUT/distill$SUFFIX" "$OUT/train.scored.jsonl" "$HARD" "$DISTILL" \
      "$(run_name "$2")" ;;
    cleaned) arm "$OUT/cleaned$SUFFIX" "$OUT/train.cleaned.jsonl" "$HARD" "" "$(run_name "$2")" ;;
  esac
  fuse "$OUT/$1$SUFFIX/$(run_name "$2")"
  save_state
}
for name in control distill cleaned; do student "$name" "${seeds[0]}"; done
"$PY" -m studies.squad_teachers.teacher best --runs "$OUT" --suffix="$SUFFIX" \
  --seed "${seeds[0]}" --out "$OUT/best.json"
BEST=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["arm"])' "$OUT/best.json")
for seed in "${seeds[@]:1}"; do
  student control "$seed"
  student "$BEST" "$seed"
done

# -- every run fused with BM25 (done already for the runs made above) -------------------------
for dir in "$OUT"/{round1,control,distill,cleaned}"$SUFFIX"/gradcache-b"$B"-s*; do
  fuse "$dir"
done
save_state

# -- the page ------------------------------------------------------------------------------------
"$PY" -m studies.squad_teachers.table --runs "$OUT" --suffix="$SUFFIX" "${TABLE[@]}"
