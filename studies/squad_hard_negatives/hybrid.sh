# BM25 fused with a model's dense ranking on dev: RRF, and DPR's linear fusion with its weight
# picked on the other half of the dev articles (OUT/dev-split), over each side's top 1000.
# Sourced by this study's run.sh and by studies/setup.sh (the teachers' studies' fuse), whose BIN,
# CFG, PASSAGES, DEV_QA, EXTRA and OUT it reads. The three evaluations go in the run folder, or in
# the folder given third (a study that fuses another study's runs); any arguments after it are
# settings for each of them (--set key=value, the run's own: a multi-vector model's, say).
hybrid() {  # run-folder model [into [settings...]]
  local dir=$1 model=$2 into=${3:-$1} common
  shift $(( $# < 3 ? $# : 3 ))
  common=(-c "$CFG" -q --set "output_dir=$dir" --set "data.passages=$PASSAGES" --model "$model"
    --set eval.fusion_depth=1000 "${EXTRA[@]}" "$@")
  [[ -f $into/eval-rrf/metrics.json ]] ||
    "${BIN[@]}" eval "${common[@]}" --set "data.dev_qa=$DEV_QA" --set eval.fusion=rrf \
      --out "$into/eval-rrf"
  for half in a b; do
    local other=b; [[ $half == b ]] && other=a
    [[ -f $into/eval-linear-$half/metrics.json ]] ||
      "${BIN[@]}" eval "${common[@]}" --set "data.dev_qa=$OUT/dev-split/dev-$half.qa.tsv" \
        --set eval.fusion=linear --set eval.fusion_weight=auto \
        --set "eval.fusion_tune_qa=$OUT/dev-split/dev-$other.qa.tsv" --out "$into/eval-linear-$half"
  done
}
