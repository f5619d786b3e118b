#!/usr/bin/env bash
# Here, before a GPU session: copy the MNIST .gz files into .gpu/mnist (git-ignored), the folder
# the device tool carries (carry [".gpu"]) and scripts/gpu_session.sh prepares the data from; then
# what every call will send, against the device tool's 64 MiB (scripts/gpu_travel.py: over it, exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
mirror="${CAPSNET_MNIST_MIRROR:-../shared/data/mnist}"
mkdir -p .gpu/mnist
cp "$mirror"/*-ubyte.gz .gpu/mnist/
ls -l .gpu/mnist
python3 scripts/gpu_travel.py
