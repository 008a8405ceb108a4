# Quick start: `make demo` and `make test`. Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0

.PHONY: demo test test-fast lint bench clean venv

venv: $(STAMP)

# torch goes in first, from the CPU build (a local wheel where pip's find-links has one, else
# PyTorch's CPU index, asked once without retries); otherwise `triton`/`torch` from PyPI pull several GB of CUDA packages.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || \
	  $(BIN)/pip install -q "torch==$(TORCH_VERSION)+cpu" --find-links /opt/wheels 2>/dev/null || \
	  $(BIN)/pip install -q --retries 0 --timeout 10 "torch==$(TORCH_VERSION)" --index-url https://download.pytorch.org/whl/cpu \
	    --extra-index-url https://pypi.org/simple || \
	  $(BIN)/pip install -q "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -e ".[profiler,dev,ray]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tlora-sim compare --trace synthetic:default --cluster 4x8xH100 \
	  --policies independent-backfill,mlora,tlora --seed 0 --out runs/demo --force

test: $(STAMP)
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -n 2 tests

# The iteration lane: no torch, no Triton interpreter, no Ray, no notebooks (tests/conftest.py hides them),
# no long end-to-end tests (marked slow).
test-fast: $(STAMP)
	TLORA_TEST_FAST=1 $(BIN)/python -m pytest -n 2 -m "not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) runs .pytest_cache
