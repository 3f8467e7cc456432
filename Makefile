# servesim: `make run` and `make test` work on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv run test bench validate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: static vs continuous batching on one workload, a sweep of arrival rates with each policy's
# capacity under the SLO, and the HTML report (reports/convoy/index.html).
run: $(STAMP)
	$(BIN)/sim run scenarios/convoy.toml
	$(BIN)/sim sweep scenarios/convoy.toml --find-capacity
	$(BIN)/sim report reports/convoy

test: $(STAMP)
	$(BIN)/ruff check sim tests benchmarks
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_vllm.py
	$(BIN)/python benchmarks/bench_sweep.py

# Queueing theory (M/D/1, M/G/1, Little's law), the vLLM scheduler conformance cases, and the cost model
# against the real vLLM measurements (reports/fidelity/fidelity.csv and fidelity.html).
validate: $(STAMP)
	$(BIN)/pytest -q tests/test_engine.py tests/test_replay.py tests/test_vllm.py
	$(BIN)/sim validate ground-truth --scale 0.25 --jobs 2 --out reports/fidelity

clean:
	rm -rf $(VENV) reports/*
