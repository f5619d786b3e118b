#!/usr/bin/env bash
# The test suite under the oldest torch the package supports (pyproject.toml's torch>=X and
# torchvision>=Y: the GPU machine's versions), every other package as uv.lock pins it, in a venv of
# its own (.venv-torch-floor, git-ignored; made once, about 5 GB):
#   bash scripts/torch_floor.sh [pytest arguments]
# Not in CI (the suite under the lock's torch is); run it after changing what calls torch.
set -euo pipefail
cd "$(dirname "$0")/.."
floor() { sed -n "s/^ *\"$1>=\([0-9.]*\)\",.*/\1/p" pyproject.toml; }
torch_floor=$(floor torch) vision_floor=$(floor torchvision)
: "${torch_floor:?pyproject.toml names no torch>= floor}" "${vision_floor:?pyproject.toml names no torchvision>= floor}"
venv=.venv-torch-floor
# compiled at install, as the Makefile's .venv is: where PYTHONDONTWRITEBYTECODE is set (this project's machines),
# a venv without .pyc compiles torch's 2,141 modules in every process that imports it: `import torch, torchvision,
# pipeline.cli` took 8.1 s against 3.3-3.6 s compiled on 2 idle cores, 13-30 s beside a rehearsal (the torch 2.11
# rehearsals' 4-5 min more than the lock's, 2026-12-03: docs/testing.md)
export UV_COMPILE_BYTECODE=1
python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install -q 'uv==0.13.9'
if ! "$venv/bin/python" -c "import importlib.util, os, sys, torch
sys.exit(not torch.__version__.startswith('$torch_floor.') or not os.path.exists(importlib.util.cache_from_source(torch.__file__)))" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m uv venv -q "$venv" --python python3
  reqs=$(mktemp)
  trap 'rm -f "$reqs"' EXIT
  # the lock's pins but torch's own (its CUDA libraries, triton, setuptools bound): the floor brings its own
  python3 -m uv export --frozen --no-hashes --all-groups --no-emit-project | grep -v '^#\|^ ' \
    | grep -v -i '^torch\|^nvidia\|^triton\|^cuda\|^setuptools' > "$reqs"
  python3 -m uv pip install -q --python "$venv/bin/python" -r "$reqs" "torch==$torch_floor.*" "torchvision==$vision_floor.*"
  python3 -m uv pip install -q --python "$venv/bin/python" --no-deps -e .
fi
"$venv/bin/python" -c "import torch, torchvision; print(f'torch {torch.__version__}, torchvision {torchvision.__version__}')"
exec "$venv/bin/python" -m pytest "$@"
