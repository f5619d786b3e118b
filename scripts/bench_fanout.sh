#!/usr/bin/env bash
# Wall clock of `make gpus`' fan-out on this machine: the same 4 smoke-profile (variant, seed) items
# (train + evaluate each) with 1 slot (one after another) and with 4 slots, each in a fresh clone of
# HEAD with its own DVC cache (so nothing is restored from a run-cache). Prints both fan-out phases.
#
#   bash scripts/bench_fanout.sh [SLOTS ...]     (default: 1 4)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="$PWD/.venv/bin"
export CAPSNET_MNIST_MIRROR="${CAPSNET_MNIST_MIRROR:-$(cd .. && pwd)/shared/data/mnist}"
work=$(mktemp -d)
log_dir="${LOG_DIR:-logs/bench_fanout}"  # each run's whole output, kept
mkdir -p "$log_dir" && log_dir=$(cd "$log_dir" && pwd)
trap 'rm -rf "$work"' EXIT
for slots in ${@:-1 4}; do
    clone="$work/slots$slots"
    git clone -q . "$clone"
    (cd "$clone"
     "$BIN/python" -m pipeline.profiles smoke --write params.yaml >/dev/null
     "$BIN/python" - <<'PY'
import yaml
p = yaml.safe_load(open("params.yaml"))
p["ablation"] = {"seeds": [0], "stacked": [], "separate": ["capsnet_r1", "capsnet_r1_recon", "capsnet_r3", "capsnet_r3_recon"]}
yaml.safe_dump(p, open("params.yaml", "w"), sort_keys=False)
PY
     PATH="$BIN:$PATH" dvc repro -q prepare >/dev/null  # not timed: the fan-out starts after it
     GPUS="$(seq -s ' ' 0 $((slots - 1)))" BIN="$BIN" MLFLOW_TRACKING_URI="sqlite:///$clone/mlflow.db" \
       bash scripts/fanout.sh >"$log_dir/slots$slots.log" 2>&1 || echo "slots $slots: fanout.sh failed" >&2
     grep -E "^fan-out phase|FAILED" "$log_dir/slots$slots.log")
done
