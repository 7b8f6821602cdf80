# dpr-cache: install into a local venv, torch first (a CPU build by default).
# GPU users:  make install TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126"
VENV   ?= .venv
PYTHON ?= python3
TORCH  ?= torch==2.13.0
EXTRAS ?= dev
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
TORCH_ASKED = $(VENV)/.torch-asked
TORCH_DONE  = $(VENV)/.torch-installed
CODE    = dpr_cache tests scripts studies benchmarks

.PHONY: install test lint demo clean FORCE

install: $(STAMP)

# A TORCH given (a CUDA build after the CPU one, say) replaces the torch the venv holds, which
# pip would otherwise keep (torch==2.13.0 is met by 2.13.0+cpu): the spec asked is kept in a
# file rewritten only when it changes, which makes the install again, and the spec last
# installed in another, which says whether to replace (the first TORCH given on a venv always
# does). pip's reinstall puts the old torch back if the new one fails. Without TORCH the venv's
# torch stays whatever build it is.
ifneq ($(origin TORCH),file)
export TORCH
TORCH_GIVEN = 1
$(STAMP): $(TORCH_ASKED)
$(TORCH_ASKED): FORCE
	@mkdir -p $(VENV)
	@printf '%s\n' "$$TORCH" | cmp -s - $@ || printf '%s\n' "$$TORCH" > $@
endif

$(STAMP): pyproject.toml
	@rm -f $(STAMP)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifdef TORCH_GIVEN
	@if [ "$$(cat $(TORCH_DONE) 2>/dev/null)" != "$$TORCH" ] \
	  && $(PY) -m pip show -q torch 2>/dev/null; then \
	  echo "replacing the venv's torch with $$TORCH"; \
	  $(PY) -m pip install -q --force-reinstall --no-deps $(TORCH); fi
endif
	$(PY) -m pip install -q $(TORCH)
ifdef TORCH_GIVEN
	@printf '%s\n' "$$TORCH" > $(TORCH_DONE)
endif
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

FORCE:

# Two test processes (a file each at a time), then the memory bounds alone on a quiet machine.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not serial" --durations=15
	$(PY) -m pytest -q -m serial

lint: $(STAMP)
	$(PY) -m ruff check $(CODE)
	$(PY) -m ruff format --check $(CODE)

# The demo starts afresh each time: runs/toy (an earlier demo's model, checkpoints, index) goes.
demo: $(STAMP)
	rm -rf runs/toy
	$(VENV)/bin/dpr-cache train --config configs/toy.yaml
	$(VENV)/bin/dpr-cache index --config configs/toy.yaml
	$(VENV)/bin/dpr-cache eval  --config configs/toy.yaml

# Everything the demo, the README's examples and the tests write in the checkout: runs/, and
# `dpr-cache data squad`'s files (and mine's, with their locks) beside the shipped SQuAD JSON.
# Kept: the venv, and data/nq (DPR's downloaded files, about 20 GB).
clean:
	rm -rf runs .pytest_cache
	rm -f data/squad/*.jsonl data/squad/*.tsv data/squad/*.summary.json data/squad/.*.lock
