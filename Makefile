# Two entry points: `make run` (set up + main job) and `make test` (set up + test suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/schedport: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

.PHONY: setup run test bench
setup: $(BIN)/schedport

run: setup
	$(BIN)/schedport example --out out/example-trace.csv
	$(BIN)/schedport simulate --trace out/example-trace.csv --scheduler vllm-fcfs --load 0.95 --out out/example-run

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/python benchmarks/bench_engine.py
