# Two entry points: `make run` (set up + main job) and `make test` (set up + test suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,ray]'
	touch $@

.PHONY: setup run quick test bench
setup: $(STAMP)

# The study: build the corpus if needed, run 13 schedulers x 120 windows x 6 regions, analyse, report.
run: setup
	$(BIN)/schedport run

# First contact: a small documented subset, about a minute.
quick: setup
	$(BIN)/schedport run --quick --out results-quick

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_corpus.py
	$(BIN)/python benchmarks/bench_sweep.py
