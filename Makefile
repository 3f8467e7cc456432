# servesim: `make run` and `make test` work on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv run test bench validate papers clean

$(STAMP): pyproject.toml
	@echo "Setting up $(VENV) (first run only, about a minute): creating it and installing servesim"
	@echo "and its dependencies with pip; nothing is printed until pip is done."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)
	@echo "$(VENV) is ready: run the simulator as $(BIN)/sim (or activate it: . $(BIN)/activate)."

venv: $(STAMP)

# The main job: static vs continuous batching on one workload, a sweep of arrival rates with each policy's
# capacity under the SLO, and the HTML report (reports/convoy/index.html).
run: $(STAMP)
	$(BIN)/sim run scenarios/convoy.toml
	$(BIN)/sim sweep scenarios/convoy.toml --find-capacity
	$(BIN)/sim report reports/convoy

# Lint, the layers' import contracts (pyproject.toml, docs/architecture.md), then the tests, one worker per
# core, at most 8 (pytest-xdist).
test: $(STAMP)
	$(BIN)/ruff check sim tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/pytest -n auto --maxprocesses 8

# Engine and vllm-policy speed in process, the sweep's speed-up, then whole `sim run` processes against both
# floors at 20k, 100k and 200k requests: the bare SimPy loop (benchmarks/floor.py) and each run's own steps and
# arrivals through such a loop (benchmarks/same_steps_floor.py), with the ratio to each; then a 32-replica fleet
# of 100k requests; and the recorder's ITL quantiles on a run's own windows (docs/performance.md,
# docs/fleet.md; several minutes in all).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_vllm.py
	$(BIN)/python benchmarks/bench_itl_quantiles.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_fleet.py
	$(BIN)/python benchmarks/bench_cluster.py

# Queueing theory (M/D/1, M/G/1, Little's law), the vLLM scheduler conformance cases, and the cost model
# against the real vLLM measurements (reports/fidelity/fidelity.csv and fidelity.html).
validate: $(STAMP)
	$(BIN)/pytest -q tests/test_engine.py tests/test_replay.py tests/test_vllm.py
	$(BIN)/sim validate ground-truth --scale 0.25 --jobs 2 --out reports/fidelity

# The published comparisons in scenarios/papers/: per cell the paper's figure, the simulator's, their ratio
# and the tolerance, and reports/papers/index.html (docs/papers.md); about a minute and a half on 2 cores.
# `sim papers --quick` is the reduced form.
papers: $(STAMP)
	$(BIN)/sim papers --jobs 2

clean:
	rm -rf $(VENV) reports/*
