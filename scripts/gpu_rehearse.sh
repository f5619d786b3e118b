#!/usr/bin/env bash
# A GPU window rehearsed here, on the CPU, before a real one spends its minutes on a broken script:
#   bash scripts/gpu_rehearse.sh [SCRATCH]     (default /tmp/gpu-rehearsal; 7-14 min on 2 cores)
# It runs what a lent window runs, as the device tool runs it, on the smoke profile's tiny data:
#  1. "device" calls: the working tree as the device tool sends it (tracked and untracked files that
#     git does not ignore, plus .gpu with the MNIST files) is copied into SCRATCH/device, which keeps
#     its ignored outputs between calls as the warm machine does, and scripts/gpu_plan.sh runs there
#     unchanged but for CAPSNET_GPU_PROFILE=smoke and a CPU-sized bench (CAPSNET_GPU_BENCH, _ARGS), under a python3
#     that cannot import mlflow or dvc (the GPU machine has neither), once with a deadline that cuts
#     the queue (240 s) and once more to finish it, each call with an empty $OUT of its own and the
#     device budget a 15-minute window would have left (CAPSNET_GPU_LEFT, read at CAPSNET_GPU_LEFT_AT), so jobs start by their
#     estimates from the bench's rows; each call in a process session of its own, whose processes are ended
#     when it returns but for those in a session of their own (a job that outlasts its call trains on);
#  2. the import: scripts/gpu_import.sh on both calls' $OUT in SCRATCH/home, a copy of the tree with
#     its own MLflow store, which replays the journals, publishes the runs and writes the report.
# It fails (exit 1, naming the step) if a call does not end, a queued run has no metrics when the
# second call is done, or the import does not publish every run and a report. The CUDA tests are
# skipped on a CPU, so no lever is proven and the levers step runs on an empty proof; the captured
# step runs uncaptured. Nothing in this checkout is written.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SCRATCH=$(mkdir -p "${1:-/tmp/gpu-rehearsal}" && cd "${1:-/tmp/gpu-rehearsal}" && pwd)
VENV_PY=$REPO/.venv/bin/python
[ -x "$VENV_PY" ] || { echo "no .venv here: run 'make venv' first" >&2; exit 2; }
# the "device" side's interpreter: this environment's, or CAPSNET_REHEARSE_PYTHON, e.g. the GPU machine's
# torch from scripts/torch_floor.sh (.venv-torch-floor/bin/python); the import always runs in .venv
DEVICE_PY=$(realpath -s "${CAPSNET_REHEARSE_PYTHON:-$VENV_PY}")  # -s: a venv's python is a link it needs
[ -x "$DEVICE_PY" ] || { echo "CAPSNET_REHEARSE_PYTHON=$DEVICE_PY is not an interpreter (scripts/torch_floor.sh makes .venv-torch-floor)" >&2; exit 2; }
MIRROR="${CAPSNET_MNIST_MIRROR:-$REPO/../shared/data/mnist}"
ls "$MIRROR"/*-ubyte.gz >/dev/null 2>&1 || { echo "no MNIST .gz files in $MIRROR: set CAPSNET_MNIST_MIRROR" >&2; exit 2; }
fail() { echo "rehearsal FAILED: $*" >&2; exit 1; }
# one rehearsal per scratch folder: the lock's descriptor is inherited by every process the calls
# start, so it is held until the last of them ends (a rehearsal stopped with Ctrl-C may leave some)
exec 9>"$SCRATCH/.lock"
flock -n 9 || { echo "a rehearsal (or what is left of one) still runs in $SCRATCH: wait, or pkill -f 'pipeline.cli'" >&2; exit 2; }
START=$(date +%s)
say() { echo "[rehearsal $(( $(date +%s) - START ))s] $*"; }

rm -rf "$SCRATCH/device" "$SCRATCH/home" "$SCRATCH"/out-* "$SCRATCH/bin" "$SCRATCH/absent" "$SCRATCH/import.started"
mkdir -p "$SCRATCH/device/.gpu/mnist" "$SCRATCH/bin" "$SCRATCH/absent/mlflow" "$SCRATCH/absent/dvc"
cp "$MIRROR"/*-ubyte.gz "$SCRATCH/device/.gpu/mnist/"
# The GPU machine's python3: DEVICE_PY's torch, but no MLflow or DVC to import.
for pkg in mlflow dvc; do
  echo "raise ImportError('$pkg is not on the GPU machine: the GPU scripts journal, gpu_import.sh replays')" \
    >"$SCRATCH/absent/$pkg/__init__.py"
done
cat >"$SCRATCH/bin/python3" <<EOF
#!/usr/bin/env bash
export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}$SCRATCH/absent"
exec "$DEVICE_PY" "\$@"
EOF
chmod +x "$SCRATCH/bin/python3"

send_tree() {  # what the device tool sends (tracked and not-ignored untracked files, .gpu), over what is there
  python3 scripts/gpu_travel.py --list | xargs -0 -r cp -f --parents -t "$1"
}
COMMIT=$(git rev-parse HEAD)
# the models gpu_levers picks for, and the smoke profile's own fp32 that the jobs' estimates read
BENCH="capsnet_r3_recon@fp32,bf16-capture#1,3+bmm+streams baseline_cnn@fp32,bf16-capture#1 capsnet_r1@fp32#1+profile"  # the last: CPU-sized
left=900  # the device tool's budget_left_s before the call
for call in 1 2; do
  deadline=$([ $call = 1 ] && echo 240 || echo 560)
  called=$(date +%s)
  send_tree "$SCRATCH/device"
  mkdir -p "$SCRATCH/out-$call"
  say "call $call: gpu_plan.sh with a ${deadline}s deadline"
  # as the device tool runs a call: in a process session of its own, whose processes are ended when the call
  # returns, all but those that began a session of their own (a job outlasting the call: gpu_session.sh)
  (cd "$SCRATCH/device" && exec env PATH="$SCRATCH/bin:$PATH" OUT="$SCRATCH/out-$call" CAPSNET_GIT_COMMIT=$COMMIT CAPSNET_GPU_LEFT=$left CAPSNET_GPU_LEFT_AT=$called \
     CAPSNET_GPU_PROFILE=smoke CAPSNET_GPU_BENCH="$BENCH" CAPSNET_GPU_BENCH_ARGS="--batch 16 --steps 2 --warmup 1 --no-reference" \
     setsid timeout 600 bash scripts/gpu_plan.sh "$deadline") &
  session=$! status=0
  wait "$session" || status=$?
  pkill -KILL -s "$session" 2>/dev/null || true
  [ "$status" = 0 ] || fail "call $call exited $status (its log: $SCRATCH/out-$call/session.log)"
  say "call $call came back with: $(ls "$SCRATCH/out-$call" | tr '\n' ' ')"
  left=$(( left - ($(date +%s) - called) - 30 ))  # and the wait before the next call
done
grep -q "gpu tests exit" "$SCRATCH/out-1/session.log" || fail "call 1 did not run the CUDA tests"
grep -q "fingerprint pins on this host's CPU, exit 0" "$SCRATCH/out-1/session.log" \
  || fail "the fingerprint pins failed on this CPU, their own ($SCRATCH/out-1/checks.tar.gz's fingerprint_pins.txt)"
grep -q "gpu tests exit" "$SCRATCH/out-2/session.log" && fail "call 2 ran the CUDA tests again on the warm machine"
for call in 1 2; do
  [ "$(ls "$SCRATCH/out-$call" | wc -l)" -le 8 ] || fail "call $call's \$OUT holds over 8 files, the device tool's limit"
done
rows=$(for f in "$SCRATCH"/out-*/checks.tar.gz; do tar xzf "$f" -O bench.jsonl 2>/dev/null || true; done)
grep -q . <<<"$rows" || fail "no bench rows came back (checks.tar.gz's bench.jsonl)"
grep -q '"profile": {' <<<"$rows" || fail "no profiled bench row came back (the +profile entry)"
# by its estimate in either call: on 2 cores, call 1's 240 s go to the fingerprint table (110 s with an empty
# cache), the data and the first two jobs, which a busy machine may stop at the deadline (2026-11-27, 96 s)
grep -q "s estimated of" "$SCRATCH"/out-*/session.log || fail "no call started a job by its estimate"
say "call 1 left $(grep -c "not started" "$SCRATCH/out-1/session.log" || true) items unstarted and $(grep -c "trains on past this call" "$SCRATCH/out-1/session.log" || true) training on past its deadline"
wanted=$(cd "$SCRATCH/device" && python3 scripts/gpu_queue.py --params params.gpu.yaml --runs "$REPO/reports/runs")
missing=""
for item in $wanted; do
  [ -f "$SCRATCH/device/gpu_results/${item%%:*}/seed${item##*:}/metrics.json" ] || missing="$missing $item"
done
# a queue the two calls left unfinished is a failure too, but only after the import has run on what they
# trained, as it would after a real window: one rehearsal then says both whether the scripts work and whether
# this machine's two calls hold the smoke queue (a machine twice as slow as usual did not, 2026-11-27)
queued=$(wc -w <<<"$wanted")
trained=$(( queued - $(wc -w <<<"$missing") ))
[ "$trained" -gt 0 ] || fail "no queued run has metrics after call 2 (logs: $SCRATCH/device/logs)"
say "$trained of $queued queued runs trained and evaluated${missing:+; no metrics for:$missing}"

mkdir -p "$SCRATCH/home" && send_tree "$SCRATCH/home"
touch "$SCRATCH/import.started"
ln -s "$REPO/.venv" "$SCRATCH/home/.venv"
rm -rf "$SCRATCH/home/reports/runs"
say "import: gpu_import.sh in a copy of the tree with its own MLflow store"
(cd "$SCRATCH/home" && PYTHONPATH="$SCRATCH/home" MLFLOW_TRACKING_URI="sqlite:///$SCRATCH/home/mlflow.db" \
   CAPSNET_GPU_PROFILE=smoke bash scripts/gpu_import.sh "$SCRATCH/out-1" "$SCRATCH/out-2" >"$SCRATCH/import.log" 2>&1) \
  || fail "gpu_import.sh exited $? (its log: $SCRATCH/import.log)"
published=$(ls -d "$SCRATCH"/home/reports/runs/models/*/seed* | wc -l)
[ "$published" = "$trained" ] || fail "$published runs published, $trained trained"
[ "$SCRATCH/home/reports/ablation.md" -nt "$SCRATCH/import.started" ] || fail "no report written (reports/ablation.md)"
grep -q "fingerprint pins on the GPU host's CPU ($SCRATCH/out-1): .*passed" "$SCRATCH/import.log" \
  || fail "the import did not read call 1's fingerprint pins (checks.tar.gz)"
grep -q "fingerprint trace of .* kept in" "$SCRATCH/import.log" || fail "the import filed no fingerprint trace (checks.tar.gz)"
grep -q "^call 2 (.*): \[plan\] LEFT [0-9]* s, read [0-9]* s before" "$SCRATCH/import.log" \
  || fail "the import gave no account of call 2's window (gpu_plan.sh's [plan] line in its session.log)"
# the CUDA tests' log under its key (scripts/gpu_proof.py): kept where pytest finished it, else said not kept
grep -qE "kept as the proof|not kept as a proof" "$SCRATCH/import.log" || fail "the import did not read the CUDA tests' key (checks.tar.gz)"
say "the trace against the committed ones: $(grep -A3 "fingerprint trace of" "$SCRATCH/import.log" | grep against | tr -s ' ' | paste -sd';')"
ls "$SCRATCH"/home/reports/runs/fingerprints/"$COMMIT".json >/dev/null 2>&1 || fail "no fingerprint table of $COMMIT imported"
slug=$(cat "$SCRATCH/device/logs/bench/.device")  # this CPU's folder: the committed GPU models' folders are there too
kept=$(ls "$SCRATCH/home/reports/bench/$slug"/*.jsonl 2>/dev/null | wc -l)
[ "$kept" = "$(wc -w <<<"$BENCH")" ] || fail "$kept bench entries kept in reports/bench/$slug/, $(wc -w <<<"$BENCH") benched"
measured=$(cat "$SCRATCH/home/reports/bench/$slug/jobs/seconds.jsonl" 2>/dev/null | wc -l)
[ "$measured" -gt 0 ] || fail "no measured job kept in reports/bench/$slug/jobs/ (gpu_queue.py --record)"
[ -z "$missing" ] || fail "the import passed on the $published runs trained, but no metrics after call 2 for:$missing: this \
machine's two calls did not hold the smoke queue (logs: $SCRATCH/device/logs; a slow or busy machine, or a scheduling bug)"
say "rehearsal passed: $published runs published, the report in $SCRATCH/home/reports"
