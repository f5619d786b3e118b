#!/usr/bin/env bash
# One array task of a cluster run: item INDEX of `capsnet stages` (its train and evaluate stages) in
# a clone of its own on local scratch, against a shared DVC remote (or a shared cache).
#
#   bash scripts/cluster/task.sh INDEX
#
# SLURM calls it from scripts/cluster/slurm_array.sbatch with $SLURM_ARRAY_TASK_ID, Kubernetes from
# scripts/cluster/k8s_indexed_job.yaml with $JOB_COMPLETION_INDEX. Environment:
#   CAPSNET_REPO     git URL or path every node can clone (required)
#   CAPSNET_REV      branch, tag or commit to run (default main); all tasks must run the same one
#   CAPSNET_SCRATCH  node-local scratch for the clone (default $SLURM_TMPDIR, $TMPDIR or /tmp)
#   CAPSNET_VENV     an environment with this project installed (default: `make venv` in the clone)
#   DVC_CACHE_DIR    a shared DVC cache instead of / beside the remote (optional)
#   MLFLOW_TRACKING_URI  the tracking server every node reaches, e.g. http://mlflow.example:5000;
#                    or CAPSNET_TRACKING_JOURNAL=DIR to journal runs for `capsnet track sync DIR`
# The stages' inputs come with `dvc repro -s --pull` (the prepare stage's outputs must be in the
# remote: run `dvc repro prepare && dvc push` once before the array); each finished stage goes to
# the remote with `dvc push --run-cache` (plus its uncached outputs: push_uncached.py), so the gather step (scripts/cluster/gather.sh) restores
# it from the run-cache instead of training it again.
set -euo pipefail
index="${1:?usage: task.sh INDEX (the array task id)}"
: "${CAPSNET_REPO:?set CAPSNET_REPO to the git URL or path every node can clone}"
rev="${CAPSNET_REV:-main}"
scratch="${CAPSNET_SCRATCH:-${SLURM_TMPDIR:-${TMPDIR:-/tmp}}}"
work="$scratch/capsnet-${SLURM_ARRAY_JOB_ID:-${JOB_NAME:-task}}-$index"
rm -rf "$work"
trap 'cd / && rm -rf "$work"' EXIT  # scratch is the node's: leave nothing behind, failed or not
git clone -q "$CAPSNET_REPO" "$work"
cd "$work"
git checkout -q "$rev"
if [ -n "${CAPSNET_VENV:-}" ]; then
  export PATH="$CAPSNET_VENV/bin:$PATH"
else
  make -s venv && export PATH="$work/.venv/bin:$PATH"
fi
export PYTHONPATH="$work${PYTHONPATH:+:$PYTHONPATH}"  # this clone's pipeline/, even from a shared venv
[ -z "${DVC_CACHE_DIR:-}" ] || dvc config --local cache.dir "$DVC_CACHE_DIR"
item=$(capsnet stages --index "$index")
stages=$(capsnet stages --index "$index" --kind stages)  # train, then evaluate per seed
# the pipeline/ the stages import: -P, as a console script, without the current folder first on the path
code=$(python -P -c 'import os, pipeline; print(os.path.dirname(pipeline.__file__))')
echo "task $index: $item on $(hostname), CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}, commit $(git rev-parse --short HEAD), code $code"
pull=()
[ -z "$(dvc remote list)" ] || pull=(--pull)
# shellcheck disable=SC2086  # one target per stage, in order, in one DVC process (as scripts/fanout.sh)
dvc repro -s "${pull[@]}" $stages
if [ -n "$(dvc remote list)" ]; then
  dvc push --run-cache
  # shellcheck disable=SC2086  # one word per stage
  python scripts/cluster/push_uncached.py $stages  # what push --run-cache leaves out
fi
echo "task $index: $item done"
