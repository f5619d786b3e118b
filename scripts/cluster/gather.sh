#!/usr/bin/env bash
# After a cluster array (scripts/cluster/task.sh): bring every finished stage into this checkout
# from the DVC remote's run-cache (nothing is trained again), run what is left (the report) and
# commit dvc.lock with the metrics.
#
#   bash scripts/cluster/gather.sh [--commit]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="${BIN:-$PWD/.venv/bin}:$PATH"
if [ -n "$(dvc remote list)" ]; then
  dvc repro --pull  # fetches the run-cache first, then each stage's outputs as it restores it
else
  dvc repro  # a shared cache (cache.dir) holds the run-cache already
fi
dvc status
if [ "${1:-}" = "--commit" ]; then
  git add dvc.lock
  for tracked in results reports; do [ ! -e "$tracked" ] || git add -- "$tracked"; done  # the metrics, the report
  git commit -qm "Cluster run: dvc.lock and metrics of $(capsnet stages --count) fanned-out items"
  git log --oneline -1
fi
