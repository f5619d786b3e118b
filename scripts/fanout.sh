#!/usr/bin/env bash
# One node, several GPUs (`make gpus`): every item of params.yaml's ablation (a stacked variant, or a
# separate variant's seed: `capsnet stages`) trains and evaluates through its own DVC stage
# processes, one item per GPU, then one `dvc repro` finishes the pipeline.
#
#   GPUS="0 1 2 3" bash scripts/fanout.sh     # device indices; default: every GPU nvidia-smi lists
#
# xargs keeps one process per slot (--process-slot-var) and each slot sets CUDA_VISIBLE_DEVICES to
# its GPU, so training uses cuda:0 of the one GPU it sees. DVC runs the stages (`dvc --wait-for-lock
# repro -s`: the repository lock is held only between stages, never while one trains), records each
# in dvc.lock and the run-cache; the final `dvc repro` reruns none of them. Nothing else schedules:
# `capsnet stages` only lists the items. Each item's output goes to logs/fanout/<item>.log.
# On a machine without CUDA the slots are only labels (training runs on the CPU): the tests fan out
# that way with GPUS="0 1 2 3", and `make smoke` with GPUS="cpu0 cpu1" and FANOUT_FINISH=0 (the
# stages of every item only: its `dvc exp run` then restores them from the run-cache and reports).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-$PWD/.venv/bin}"
export PATH="$BIN:$PATH"
gpus="${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ' || true)}"
read -r -a slots <<<"$gpus"
if [ ${#slots[@]} -eq 0 ]; then
  echo "no GPU found (nvidia-smi lists none): set GPUS to the device indices to use, e.g. GPUS=\"0 1\"" >&2
  exit 2
fi
export FANOUT_SLOTS="${slots[*]}"
# each slot's stages get an equal share of the cores (torch's CPU threads: data handling on a GPU,
# all the work on a CPU slot), unless OMP_NUM_THREADS says otherwise: 2 stages of 2 threads each
# on 2 cores spend about a third of their time contending (see README, Profiles)
cores=$(nproc 2>/dev/null || echo 1)
export FANOUT_THREADS="${OMP_NUM_THREADS:-$(( cores / ${#slots[@]} > 0 ? cores / ${#slots[@]} : 1 ))}"
mkdir -p logs/fanout

# the list read whole first: `dvc … | grep -q` under pipefail fails when grep stops reading early and
# dvc dies of SIGPIPE, which skipped prepare in one CI run (every item then failed on missing data)
stage_list=$(dvc stage list --name-only)
if grep -qx prepare <<<"$stage_list"; then
  dvc --wait-for-lock repro prepare  # the upstream stages (download, prepare), once
fi

run_item() {  # one item in xargs slot $SLOT: its DVC stages (train, then evaluate per seed), in order
  local stages=$1 slots gpu start item
  read -r -a slots <<<"$FANOUT_SLOTS"
  gpu=${slots[$SLOT]}
  item=${stages%% *}
  item=${item#*@}  # train@<variant>-<seed> or train_stacked@<variant>
  start=$(date +%s)
  # one DVC process for the item's stages: `repro -s A B C` runs them in that order, stops at the first
  # that fails and releases the lock while each command runs, as a call per stage did, without a DVC
  # start (about 1.5 s of CPU) per stage
  # shellcheck disable=SC2086  # $stages: the item's stage names, one target each
  if ! CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=$FANOUT_THREADS dvc --wait-for-lock repro -s $stages >"logs/fanout/$item.log" 2>&1; then
    # DVC's last line names the stage that failed and why
    echo "$item: FAILED in slot $gpu after $(( $(date +%s) - start )) s: $(tail -n 1 "logs/fanout/$item.log"); see logs/fanout/$item.log" >&2
    return 1
  fi
  echo "$item: done in slot $gpu in $(( $(date +%s) - start )) s"
}
export -f run_item

listed=$(capsnet stages --kind stages)  # an assignment: a failing listing stops the script (set -e)
mapfile -t items <<<"$listed"
echo "fanning out ${#items[@]} items (stacked variants, (variant, seed) pairs) over ${#slots[@]} slot(s): ${slots[*]} ($FANOUT_THREADS CPU thread(s) each)"
status=0
fanout_start=$(date +%s%N)
printf '%s\n' "${items[@]}" | xargs -P "${#slots[@]}" --process-slot-var=SLOT -I{} bash -c 'run_item "$1"' _ {} || status=$?
if [ "$status" -ne 0 ]; then
  echo "some items failed (xargs status $status); the others are in dvc.lock and the run-cache. Fix and rerun: done items are skipped" >&2
  exit 1
fi
ms=$(( ($(date +%s%N) - fanout_start) / 1000000 ))
echo "fan-out phase: $((ms / 1000)).$((ms % 1000 / 100)) s for ${#items[@]} item(s) over ${#slots[@]} slot(s)"
if [ "${FANOUT_FINISH:-1}" = 1 ]; then
  dvc --wait-for-lock repro  # what is left (the report); every fanned-out stage is up to date
fi
