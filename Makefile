# The README's commands. Every target creates/updates .venv from uv.lock first.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export CAPSNET_MNIST_MIRROR ?= $(if $(wildcard ../shared/data/mnist),$(abspath ../shared/data/mnist),)
export UV_PYTHON_DOWNLOADS := never

# The smoke profile: tiny deterministic subsets, 1 epoch, one seed, CPU. DVC's own overrides.
# One affNIST-style transform per test digit instead of 32.
SMOKE := -S base.profile=smoke -S prepare.train_subset=512 -S prepare.test_subset=256 \
         -S prepare.affnist_transforms=1 -S train.epochs=1 -S train.batch_size=32 -S train.device=cpu \
         -S train.log_every=4 -S 'ablation.seeds=[0]'

# The GPU profile: 50 epochs (the length popular re-runs use), bf16 autocast, 3 seeds, on CUDA.
GPU := -S base.profile=gpu -S train.epochs=50 -S train.amp=true -S train.device=cuda

.PHONY: venv test smoke gpu repro
venv: $(BIN)/capsnet
$(BIN)/capsnet: pyproject.toml uv.lock
	@python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install -q 'uv==0.13.9'
	python3 -m uv sync --frozen
	@touch $@

test: venv  ## the test suite (what CI runs)
	$(BIN)/python -m pytest

smoke: venv  ## the whole DVC pipeline in the smoke profile, on CPU (minutes)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc exp run $(SMOKE)

gpu: venv  ## the whole DVC pipeline in the GPU profile (needs CUDA)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc exp run $(GPU)

repro: venv  ## the whole DVC pipeline with params.yaml as it is (the paper profile when committed)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc repro
