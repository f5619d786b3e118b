#!/usr/bin/env bash
# Here, before a GPU session: copy the MNIST .gz files into .gpu/mnist (git-ignored), the folder
# the device tool carries (carry [".gpu"]) and scripts/gpu_session.sh prepares the data from; then
# what every call will send, against the device tool's 64 MiB (scripts/gpu_travel.py: over it, exit 1).
set -euo pipefail
cd "$(dirname "$0")/.."
mirror="${CAPSNET_MNIST_MIRROR:-../shared/data/mnist}"
found=$(find "$mirror" -maxdepth 1 -name '*-ubyte.gz' 2>/dev/null | wc -l)
if [ "$found" -ne 4 ]; then
  echo "$mirror holds $found of MNIST's four *-ubyte.gz files: set CAPSNET_MNIST_MIRROR to a folder that holds them all" >&2
  exit 1
fi
mkdir -p .gpu/mnist
cp -f "$mirror"/*-ubyte.gz .gpu/mnist/  # -f: over the read-only copies a mirror like ../shared leaves
ls -l .gpu/mnist
python3 scripts/gpu_travel.py
