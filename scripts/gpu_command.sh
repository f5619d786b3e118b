#!/usr/bin/env bash
# Here, just after reading the device tool's `status`: the command of the GPU window's next call, with
# the numbers it needs typed in (a padded commit hash named the first H200 window's runs):
#   bash scripts/gpu_command.sh LEFT        (LEFT: status's budget_left_s)
# prints `CAPSNET_GPU_LEFT=LEFT CAPSNET_GPU_LEFT_AT=<now here> CAPSNET_GIT_COMMIT=<HEAD> bash scripts/gpu_plan.sh`
# for the device tool's run (carry [".gpu"]). Refuses, in one line (exit 1), a tree that is not HEAD
# (the device tool sends the working tree, and every run records HEAD as the code that trained it) and
# a tree without .gpu/mnist (scripts/gpu_fetch_mnist.sh copies it there).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ "${1:-}" =~ ^[0-9]+$ ]] || { echo "usage: $0 LEFT (the device tool's status budget_left_s, a number of seconds)" >&2; exit 2; }
changed=$(git status --porcelain | head -3 | cut -c4- | tr '\n' ' ')
if [ -n "$changed" ]; then
  echo "the tree differs from HEAD ($changed…): commit it first, since every run records HEAD $(git rev-parse --short HEAD) as the code that trained it" >&2
  exit 1
fi
ls .gpu/mnist/*-ubyte.gz >/dev/null 2>&1 || { echo ".gpu/mnist holds no MNIST files: run bash scripts/gpu_fetch_mnist.sh first" >&2; exit 1; }
echo "CAPSNET_GPU_LEFT=$1 CAPSNET_GPU_LEFT_AT=$(date +%s) CAPSNET_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_plan.sh"
