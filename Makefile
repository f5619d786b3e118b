# The README's commands. Every target creates/updates .venv from uv.lock first.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export CAPSNET_MNIST_MIRROR ?= $(if $(wildcard ../shared/data/mnist),$(abspath ../shared/data/mnist),)
export UV_PYTHON_DOWNLOADS := never
# Compile the environment's bytecode at install (~45 s once): where PYTHONDONTWRITEBYTECODE=1 (as on
# this project's machines) every stage process otherwise compiles torch/mlflow afresh: 13 s
# instead of 5 s of imports per stage (README, "Set-up", has the command that measures it).
export UV_COMPILE_BYTECODE := 1

# Profiles (smoke, gpu) are DVC's own -S overrides, defined once in pipeline/profiles.py.
PROFILE := PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pipeline.profiles

.PHONY: help venv test coverage smoke gpu paper-gpu gpus repro ui
help:  ## this list (what a bare `make` prints)
	@awk -F':[^#]*## ' '/^[a-z-]+:[^#]*## /{printf "  make %-10s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))

venv: $(BIN)/capsnet  ## create or update .venv from uv.lock (every target below does it first)
$(BIN)/capsnet: pyproject.toml uv.lock
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install -q 'uv==0.13.9'
	python3 -m uv sync --frozen
	@touch $@

# The suite's time is mostly processes starting and small single-threaded models: one pytest worker
# per core (at most 4), each with torch on one thread, a test file to a worker (its module fixtures,
# the DVC repositories and tracking servers, built once). 2 cores: 7 min 40 s against 11 min 12 s in
# one process (2026-11-26); docs/performance.md has the times since. TEST_WORKERS=1 for one worker.
# --durations: every run, CI's too, ends with its slowest tests, so the loop's time is read where it goes.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))
test: venv  ## the test suite (what CI runs), TEST_WORKERS processes at a time
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15

coverage: venv  ## which lines of pipeline/ the suite runs, its subprocesses' too (about 13 min on 2 cores; not in CI)
	TEST_WORKERS=$(TEST_WORKERS) bash scripts/coverage.sh

smoke: venv  ## the whole DVC pipeline in the smoke profile, on CPU (minutes; JOBS stages at a time, default one per core; stage processes fork from a warm interpreter, WARM=0: each starts cold); params.yaml, dvc.lock and reports/ stay as they were, its report goes to smoke-report/
	$(PROFILE) smoke $(if $(filter 0,$(WARM)),,--warm) --prefill $(or $(JOBS),$(shell nproc 2>/dev/null || echo 2)) --exec dvc exp run

gpu: venv  ## the whole DVC pipeline in the GPU profile (needs CUDA); refuses a params.yaml with other profiles' values
	$(PROFILE) gpu --exec dvc exp run

paper-gpu: venv  ## the paper protocol (640 epochs) with the GPU fast path (needs CUDA; hours per variant)
	$(PROFILE) paper-gpu --exec dvc exp run

ui: venv  ## the published runs (and any local ones) in the MLflow UI on 127.0.0.1:5000 (PORT=…); Ctrl-C stops it
	$(BIN)/capsnet ui --port $(or $(PORT),5000)

repro: venv  ## the whole DVC pipeline in the paper profile; refuses a params.yaml that differs from the committed one
	$(PROFILE) paper --check
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc repro

gpus: venv  ## one node, several GPUs: every (variant, seed) its own DVC stage process on its own GPU (GPUS="0 1 2 3"; default all), then dvc repro
	$(PROFILE) paper --check
	BIN=$(abspath $(BIN)) bash scripts/fanout.sh
