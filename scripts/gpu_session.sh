#!/usr/bin/env bash
# One self-contained GPU session on a machine with torch but no DVC or MLflow (the device tool's
# H100/H200). Prepares the data from the MNIST .gz files in .gpu/mnist, then, as asked:
#   --tests          the training fingerprint's pins on this host's CPU (fingerprint_pins.txt), then every
#                    CUDA-only test (marked cuda: tests/test_gpu.py's fast path vs eager fp32 per
#                    variant and layer, the CUDA generator on resume, MultiMNIST composed on the device),
#                    after the bench, beside the --train jobs (those wait for them before evaluating: a
#                    seed whose speed settings they do not prove trains again with the levers they do);
#                    not at all where an earlier window ran them under this code, torch, CUDA and GPU
#                    (reports/bench/<model>/cuda-tests/, kept by gpu_import.sh: scripts/gpu_proof.py)
#   --bench "V ..."  `capsnet bench` rows for these variants: the reference loop, then fp32, bf16 and
#                    bf16-compile, or the modes named as V@mode,mode (e.g. capsnet_r3_recon@bf16-graphs),
#                    with seeds stacked as V@mode#1,3 (one seed, then three stacked: bench --seeds;
#                    V@mode#1,3+loop+bmm also times the stack's loop and bmm layouts beside the fused one,
#                    V@mode#1,3+profile says where each configuration's step time goes: bench --profile-steps);
#                    a bench this warm machine already ran (logs/bench/), or an earlier window on this GPU
#                    model (reports/bench/<model>/, gpu_import.sh keeps them), is not run again; a bench
#                    starts only while this machine's benches have run under --bench-budget seconds
#                    (default 300) in all, over all its calls; the rest waits for the next window
#   --levers         after the bench and tests, train each benched model with the fastest bench mode that passed its
#                    CUDA tests (scripts/gpu_levers.py writes params.gpu.<model>.yaml, params.gpu.<model>-fp32.yaml
#                    for the precision check's fp32 twin; the others keep the profile)
#   --train "V:S ..." train + evaluate these (variant, seed) runs of the gpu profile ("V:0,1,2": three seeds
#                     stacked in one process, issue #23), --parallel at a time, waited for until --deadline
#                    (a run training then trains on: the same machine's next call waits for it; one stopped
#                    resumes from its checkpoint if the same machine runs it again); a job
#                    starts only when its estimate (scripts/gpu_queue.py --fit: its variant's jobs measured
#                    before on this GPU model, logs/jobs/ and reports/bench/<model>/jobs/, else the bench
#                    rows) fits the --window's seconds left, or with its first seeds only, the others next window
#   --params FILE    the params every job, bench and lever trains with (default: the gpu profile's, written
#                    as params.gpu.yaml; gpu_plan.sh gives the paper protocol's in a window that trains it)
#   --window S       seconds the lent window has left at this call's start (scripts/gpu_plan.sh works it
#                    out from the device tool's budget; default: --deadline); a job may outlast the call,
#                    training on in a process session of its own (setsid) that the next call waits for,
#                    never the window, whose end stops it (the machine goes back with it)
# Tracking is journalled (no MLflow there); everything comes back in $OUT, at most 8 files (the device
# tool's limit): runs-*.tar.gz split under 16 MiB, with the commit's fingerprint table that gpu_plan.sh
# wrote in fingerprints/; session.log; inductor-cache.tar.gz; checks.tar.gz, the checks' own files
# (bench.jsonl, gpu_tests.txt and gpu_tests.key, the key the import keeps it under, gpu_diffs.jsonl,
# fingerprint_pins.txt, fingerprint_probe.jsonl and .txt, fingerprint_trace.jsonl.gz and .txt, and
# fingerprint_trace-first-difference.pt where it parted from this AMD EPYC's).
# Here: `bash scripts/gpu_fetch_mnist.sh` once, then the device tool runs, with carry [".gpu"]:
#   bash scripts/gpu_session.sh --tests --bench "capsnet_r3_recon" --train "capsnet_r3_recon:0"
# Back here: `bash scripts/gpu_import.sh FOLDER` unpacks the runs, syncs MLflow and writes the report.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
TESTS=0 BENCH="" TRAIN="" PARALLEL=2 BUDGET=560 LEVERS=0 WINDOW="" BENCH_BUDGET=300 PARAMS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --params) PARAMS="$2"; shift ;;
    --tests) TESTS=1 ;;
    --levers) LEVERS=1 ;;
    --bench) BENCH="$2"; shift ;;
    --train) TRAIN="$2"; shift ;;
    --parallel) PARALLEL="$2"; shift ;;
    --deadline) BUDGET="$2"; shift ;;
    --window) WINDOW="$2"; shift ;;
    --bench-budget) BENCH_BUDGET="$2"; shift ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
WINDOW=${WINDOW:-$BUDGET}
export DEADLINE=$((START + (BUDGET < WINDOW ? BUDGET : WINDOW))) WINDOW_END=$((START + WINDOW)) PARALLEL
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT" logs
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CAPSNET_TRACKING_JOURNAL=$PWD/journal
# inductor's compiled kernels, kept by the warm machine between calls (later compiles hit them) and come back as
# inductor-cache.tar.gz (unpacked from .gpu/ where one is carried in): not under .gpu/, which every call's carry
# replaces, removing the folder from under a job that trains on from the last call
export TORCHINDUCTOR_CACHE_DIR=$PWD/.gpu-cache/inductor
LOG="$OUT/session.log"
say() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
# torch installed without its bytecode, where PYTHONDONTWRITEBYTECODE is set or its folder is read-only, is compiled
# again by every process that imports it: 2,000 modules, 8-14 s an import against 4-5 s on this project's 2 cores
# (2026-12-03, docs/gpu-sessions.md). The first process writes them under .gpu-cache (the warm machine keeps it
# between calls) and the others read them there. The log's header says which (torch found without importing it).
bytecode=compiled
if ! python3 -c 'import importlib.util as u, os, sys
sys.exit(not os.path.exists(u.cache_from_source(u.find_spec(os.environ.get("CAPSNET_BYTECODE_OF", "torch")).origin)))' \
    2>/dev/null; then
  bytecode="not compiled"
  export PYTHONPYCACHEPREFIX=$PWD/.gpu-cache/pycache
  unset PYTHONDONTWRITEBYTECODE
  say "torch has no bytecode: it is written once under .gpu-cache/pycache for every process"
fi
CLI="python3 -m pipeline.cli"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  # the processor and C library the fingerprint pins run on (tests/test_fingerprint.py; the capped MKL's branch);
  # the versions and the fingerprint's environment from one process (one import of torch)
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores; $(ldd --version 2>&1 | head -1)"
  # and what the check above found of torch's bytecode, with the two settings every process of the session reads
  echo "torch bytecode $bytecode; PYTHONDONTWRITEBYTECODE ${PYTHONDONTWRITEBYTECODE:-unset}; PYTHONPYCACHEPREFIX ${PYTHONPYCACHEPREFIX:-unset}"
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, flush=True)
from pipeline.training.fingerprint import fingerprint_environment as f; print("fingerprint environment:", f())'
  git rev-parse HEAD 2>/dev/null || echo "commit unknown (no .git)"; } >>"$LOG" 2>&1
if [ -f .gpu/inductor-cache.tar.gz ] && [ ! -d .gpu-cache/inductor ]; then
  mkdir -p .gpu-cache && tar xzf .gpu/inductor-cache.tar.gz -C .gpu-cache && say "inductor cache unpacked"
fi
if [ -n "$PARAMS" ]; then  # the window's own (gpu_plan.sh: the paper protocol's), which every step below reads
  [ "$PARAMS" -ef params.gpu.yaml ] || cp "$PARAMS" params.gpu.yaml || exit 1
else
  python3 -m pipeline.profiles "${CAPSNET_GPU_PROFILE:-gpu}" --write params.gpu.yaml || exit 1  # another: a rehearsal
fi
if [ ! -f data/prepared/train.safetensors ]; then
  CAPSNET_MNIST_MIRROR=$PWD/.gpu/mnist $CLI download data/raw/mnist >>"$LOG" 2>&1 || { say "download failed"; exit 1; }
  $CLI prepare data/raw/mnist data/prepared --figures reports/figures --params params.gpu.yaml >>"$LOG" 2>&1 \
    || { say "prepare failed"; exit 1; }
fi
say "data ready"

CUDA_TEST_FILES=$(python3 scripts/gpu_proof.py files)  # the test files holding CUDA-only tests
pick_levers() {
  [ "$LEVERS" = 1 ] || return 0
  python3 scripts/gpu_levers.py --bench logs/bench --tests logs/gpu_tests.txt --params params.gpu.yaml 2>&1 \
    | while read -r line; do say "levers: $line"; done
}
kept_tests() {  # 0 where an earlier window ran the CUDA tests under this code, torch, CUDA and GPU (the import
  # keeps every finished log in reports/bench/<model>/cuda-tests/: scripts/gpu_proof.py): their log stands for
  # this window's, and the jobs have the GPU to themselves
  local kept
  if [ -f logs/tests.kept ]; then kept=$(cat logs/tests.kept)  # gpu_plan.sh's answer (once a machine: torch's import)
  else kept=$(python3 scripts/gpu_proof.py find reports/bench 2>>"$LOG") || return 1; fi
  [ -n "$kept" ] && [ -f "$kept" ] || return 1
  tail -n +2 "$kept" >logs/gpu_tests.txt
  say "CUDA tests not run: an earlier window ran them under this code, torch and GPU ($kept: $(tail -1 logs/gpu_tests.txt))"
}
cuda_tests() {  # then the levers they prove; logs/gpu_tests.pending is gone when both are done
  rm -f "$OUT/gpu_diffs.jsonl"
  python3 scripts/gpu_proof.py key >"$OUT/gpu_tests.key" 2>>"$LOG"  # what the import keeps the log under
  # the fingerprint pins on this host's CPU, beside the CUDA tests (about a minute of one core): torch 2.11's
  # were computed on the project's AMD EPYC, so a pass is the measurement that the capped fingerprint is
  # the same on another processor
  # Then that variant's every ATen operation under the fingerprint's own cap, in order, with its outputs' hash
  # (scripts/fingerprint_trace.py, about 25 s of one core): gpu_import.sh names the first that computes otherwise
  # than on the AMD EPYC, and the trace keeps that operation's inputs and outputs (fingerprint_trace-first-difference.pt)
  # to compute again here. After the pins, not beside them, so as not to add to their load; their bound is 300 s:
  # on the rehearsal's 2 loaded cores their tests took 143-167 s (2026-11-27; 180 s cut them twice), on the
  # H200 host's 16 cores 91 s
  { timeout 300 python3 -m pytest tests/test_fingerprint.py -k pinned -p no:cacheprovider -q >"$OUT/fingerprint_pins.txt" 2>&1
    say "fingerprint pins on this host's CPU, exit $?: $(tail -1 "$OUT/fingerprint_pins.txt")"
    timeout 180 python3 scripts/fingerprint_trace.py "$OUT/fingerprint_trace.jsonl.gz" --against reports/fingerprint-probe \
      >"$OUT/fingerprint_trace.txt" 2>&1
    say "fingerprint trace exit $?: $(tail -1 "$OUT/fingerprint_trace.txt" | cut -c1-300)"; } &
  local pins=$!
  # and one variant's fingerprint under other caps (scripts/fingerprint_probe.py): which one, if any, this
  # host computes as the project's AMD EPYC does (reports/fingerprint-probe/, gpu_import.sh compares)
  { timeout 180 python3 scripts/fingerprint_probe.py "$OUT/fingerprint_probe.jsonl" >"$OUT/fingerprint_probe.txt" 2>&1
    say "fingerprint probe exit $?: $(paste -sd' ' "$OUT/fingerprint_probe.txt" | cut -c1-300)"; } &
  local probe=$!
  workers=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 8")  # pytest-xdist is on the GPU image; else one by one
  # shellcheck disable=SC2086
  CAPSNET_GPU_REPORT="$OUT/gpu_diffs.jsonl" timeout $(( DEADLINE - $(date +%s) > 1 ? DEADLINE - $(date +%s) : 1 )) python3 -m pytest -m cuda \
    $CUDA_TEST_FILES $workers -p no:cacheprovider -v >"$OUT/gpu_tests.txt" 2>&1
  say "gpu tests exit $?: $(tail -1 "$OUT/gpu_tests.txt")"
  cp "$OUT/gpu_tests.txt" logs/gpu_tests.txt  # the jobs' proofs and the warm machine's later calls read it
  pick_levers
  rm -f logs/gpu_tests.pending logs/running/cuda-tests
  wait "$pins" "$probe"  # the jobs go on meanwhile; the session waits for this function before packing
}
alive() {  # pid: 0 while that process runs (a zombie, ended and not yet reaped, has ended; no pid, none runs:
  # /proc//stat is /proc/stat)
  [[ $1 =~ ^[0-9]+$ ]] && [ -r "/proc/$1/stat" ] && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}
training_on() {  # the variants whose training an earlier call of this machine started and that still train
  # (run_job: in a session of their own, they outlast the call)
  local job tag
  for job in logs/detached/*.job; do
    [ -f "$job" ] && [ ! -f "${job%.job}.rc" ] && alive "$(cat "${job%.job}.pid" 2>/dev/null)" \
      && tag=${job##*/} && echo "${tag%%-*}"
  done
}
mkdir -p logs/bench
if [ -n "$BENCH" ]; then
  # this GPU model's rows from earlier windows (reports/bench/<model>/, committed by gpu_import.sh) count as
  # run on this machine: the levers read them, and a window's minutes go to training, not the same bench again
  slug=$(cat logs/bench/.device 2>/dev/null) || { slug=$(python3 -c 'from pipeline.training.bench import device_name, device_slug, resolve_device
print(device_slug(device_name(resolve_device("auto"))))' 2>>"$LOG") && echo "$slug" >logs/bench/.device; }  # once a machine
  for kept in reports/bench/"${slug:-none}"/*.jsonl; do
    [ -f "$kept" ] && [ ! -s "logs/bench/${kept##*/}" ] && cp "$kept" logs/bench/ && say "bench ${kept##*/}: rows of an earlier window on this GPU model ($kept)"
  done
  kept=reports/bench/"${slug:-none}"/jobs/seconds.jsonl  # the jobs earlier windows measured on it (gpu_queue.py --record)
  if [ -s "$kept" ] && [ ! -e logs/jobs/seconds.jsonl ]; then
    mkdir -p logs/jobs && cp "$kept" logs/jobs/seconds.jsonl && say "$(wc -l <"$kept") jobs measured by earlier windows on this GPU model ($kept)"
  fi
fi
benched() { cat logs/bench/.seconds 2>/dev/null || echo 0; }  # the seconds this machine's benches ran, all calls
for entry in $BENCH; do
  spec=${entry%%#*} seeds=1 layouts=fused
  [[ $entry == *#* ]] && seeds=${entry#*#}
  if [[ $seeds == *+* ]]; then layouts="fused ${seeds#*+}" seeds=${seeds%%+*}; layouts=${layouts//+/ }; fi
  profile=()  # +profile: ten more steps of each configuration under torch.profiler (pipeline/training/profile.py)
  if [[ " $layouts " == *" profile "* ]]; then profile=(--profile-steps 10) layouts=${layouts// profile/}; fi
  variant=${spec%%@*} modes=fp32,bf16,bf16-compile
  [[ $spec == *@* ]] && modes=${spec#*@}
  done_file="logs/bench/$entry.jsonl"
  if [ -s "$done_file" ]; then say "bench $entry done before on this machine (its rows came back then)"; continue; fi
  if [ $((DEADLINE - $(date +%s))) -lt 120 ]; then say "bench $entry not started: under 120 s left"; continue; fi
  if [ -n "$(training_on)" ]; then  # its rows would time a GPU shared with them
    say "bench $entry not started: $(training_on | paste -sd' ') trains on this GPU since an earlier call; the next window runs it"; continue
  fi
  # the seconds benches ran, not since the first began: a call's tests, training and the gap between calls
  # are not benching (2026-12-03: call 2 refused the two benches call 1's deadline had left it, 105 s benched)
  if [ "$(benched)" -ge "$BENCH_BUDGET" ]; then
    say "bench $entry not started: benching had its ${BENCH_BUDGET} s on this machine ($(benched) s benched); the next window runs it"; continue
  fi
  mode_args=()
  for mode in ${modes//,/ }; do mode_args+=(--mode "$mode"); done
  for s in ${seeds//,/ }; do mode_args+=(--seeds "$s"); done
  for layout in $layouts; do mode_args+=(--stack "$layout"); done
  mode_args+=(${profile[@]+"${profile[@]}"})
  # stopped at the deadline like a training run: rows stream out, so one cut short keeps what it
  # measured and runs again on the next call; CAPSNET_GPU_BENCH_ARGS: a rehearsal's smaller bench
  began=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$((DEADLINE - began))" $CLI bench --variant "$variant" "${mode_args[@]}" --steps 40 --warmup 5 \
    --params params.gpu.yaml ${CAPSNET_GPU_BENCH_ARGS:-} >"$done_file.tmp" 2>>"$LOG"
  status=$?
  took=$(( $(date +%s) - began ))
  echo $(( $(benched) + took )) >logs/bench/.seconds
  cat "$done_file.tmp" >>"$OUT/bench.jsonl"
  [ "$status" = 0 ] && mv "$done_file.tmp" "$done_file"
  say "bench $entry exit $status after $took s"
done

rm -f params.gpu.*.yaml
rm -rf logs/running && mkdir -p logs/running
for variant in $(training_on); do touch "logs/running/$variant"; done  # they share the GPU with this call's jobs
TESTS_PID=""
if [ "$TESTS" = 1 ] && kept_tests; then
  pick_levers
elif [ "$TESTS" = 1 ] && [ -n "$TRAIN" ]; then
  # beside the first jobs, not before them (about 130 s of a 15-minute window on the H200): those train
  # with the profile's settings, and a seed whose settings the tests then do not prove is trained again
  # with the levers they do prove (run_job's proofs); the tests count as a process sharing the GPU
  touch logs/gpu_tests.pending logs/running/cuda-tests
  cuda_tests &
  TESTS_PID=$!
  say "CUDA tests beside the first jobs"
elif [ "$TESTS" = 1 ]; then
  cuda_tests
else
  pick_levers
fi

# Evaluations go to gpu_results/ (git-ignored), packed as results/: the device tool re-sends the
# working tree each call and deletes files there that are not git-ignored, which the committed
# results/**/metrics.json are (a 2026-11-23 session lost every earlier call's metrics.json that way).
job() {  # one variant's seeds "V:S" or "V:S1,S2,S3" (stacked in one process): train, then evaluate each seed
  touch "logs/running/${1%%:*}"  # the jobs in flight share the GPU: each one's estimate counts them
  while run_job "$1"; [ $? = 3 ]; do :; done  # 3: some of its seeds trained and were evaluated, ask again for the rest
  rm -f "logs/running/${1%%:*}"
}
evaluate() {  # variant, seeds "S1,S2", log: each seed's evaluation into gpu_results/, stopped at the deadline
  local s status=0
  for s in ${2//,/ }; do
    timeout $(( DEADLINE - $(date +%s) > 1 ? DEADLINE - $(date +%s) : 1 )) python3 -m pipeline.cli \
      evaluate "models/$1/seed$s" data/prepared "gpu_results/$1/seed$s" >>"$3" 2>&1 || status=$?
  done
  return $status
}
proofs() {  # variant, seeds "S1,S2": 0 where the CUDA tests of this window prove the speed settings each
  # seed's config.json recorded (waiting for tests still running beside it; no tests, no check), else 3
  # after removing the unproven seeds, so that the job asks again and trains them with the proven levers
  local s why bad=""
  while [ -f logs/gpu_tests.pending ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 2; done
  [ -f logs/gpu_tests.txt ] || return 0
  for s in ${2//,/ }; do
    why=$(python3 scripts/gpu_levers.py --tests logs/gpu_tests.txt --check-run "models/$1/seed$s/config.json" 2>&1) && continue
    echo "$1:$s trained with settings its CUDA tests do not prove, removed to train again: $why"
    rm -rf "models/$1/seed$s" && bad="${bad:+$bad,}$s"
  done
  [ -z "$bad" ] && return 0
  rm -f "checkpoints/$1"/seed*.pt  # its resume state is of those settings too
  # asked again once: the levers picked after the tests are proven (scripts/gpu_levers.py)
  if [ "$LEVERS" = 1 ] && [ ! -f "logs/$1.retrained" ]; then touch "logs/$1.retrained"; return 3; fi
  echo "$1:$bad not trained again (no proven levers to switch to)"
  return 1
}
run_job() {
  local variant=${1%%:*} left=$((DEADLINE - $(date +%s))) s seeds="" trained="" job
  for job in logs/detached/"$variant"-*.job; do  # started by an earlier call and training on: waited for, not started again
    [ -f "$job" ] && { finish_job "$1" "$(basename "$job" .job)"; return $?; }
  done
  for s in $(tr , ' ' <<<"${1##*:}"); do
    if [ -f "gpu_results/$variant/seed$s/metrics.json" ]; then continue; fi
    if [ -f "models/$variant/seed$s/config.json" ]; then trained="${trained:+$trained,}$s"  # its evaluation was cut
    else seeds="${seeds:+$seeds,}$s"; fi
  done
  if [ -z "$seeds$trained" ]; then echo "$1 done before"; return 0; fi
  # up to the call's deadline, not a minute before it: a job that outlasts its call trains on (below)
  if [ "$left" -le 0 ]; then echo "$1 not started: this call's deadline has passed"; return 0; fi
  if [ -n "$trained" ]; then  # trained by an earlier call of this window (config.json is written last): evaluate only
    local evaluated=0
    proofs "$variant" "$trained" || return $?
    evaluate "$variant" "$trained" "logs/$variant-evaluate.log" || evaluated=$?
    echo "$variant:$trained trained before, evaluated: exit $evaluated"
    [ "$evaluated" = 0 ] && [ -n "$seeds" ] && return 3  # a failed evaluation is not asked again (it would loop)
    return 0
  fi
  local key params=params.gpu.yaml  # or the levers scripts/gpu_levers.py picked for the variant's model
  key=$(python3 scripts/gpu_levers.py --params params.gpu.yaml --key "$variant")  # at its precision: capsnet-fp32
  [ -f "params.gpu.$key.yaml" ] && params="params.gpu.$key.yaml"
  # a job an earlier call of this window stopped resumes; else the seeds whose estimate fits the window
  local shared
  shared=$(ls logs/running | wc -l)
  seeds=$(python3 scripts/gpu_queue.py --fit "$variant:$seeds" --left $((WINDOW_END - $(date +%s))) --params "$params" \
            --bench logs/bench --parallel "$shared" --checkpoints "checkpoints/$variant" --jobs "$JOBS" \
            2>"logs/$variant.fit")
  cat "logs/$variant.fit"
  seeds=${seeds##*:}
  [ -n "$seeds" ] || return 0
  local tag="$variant-${seeds//,/-}" resumed=0
  [ -f "checkpoints/$variant/seed${seeds//,/-}.pt" ] && resumed=1  # a resumed job's time is not a whole job's
  # Trained in a process session of its own (setsid), stopped at the window's end, not the call's: the device
  # tool ends a call's processes when it returns, but not such a one, so a job that outlasts the call trains on
  # through the gap between calls, and the next call (within 30 s, on the warm machine) waits for it rather than
  # start it again from its checkpoint (which cost a process start, the epochs since the checkpoint and the gap).
  # Its streams go to its log alone: one held open would keep this call's output, and the call, from ending.
  # It names its own process in logs/detached/<tag>.pid (setsid forks first where its caller leads a process
  # group, so $! may be gone at once), and its exit status lands whole (renamed into place) in <tag>.rc.
  mkdir -p logs/detached
  echo "$(date +%s) $shared $resumed $params" >"logs/detached/$tag.job"
  setsid bash -c 'echo $$ >"logs/detached/$5.pid"
      timeout "$1" python3 -m pipeline.cli train "$2" "$3" data/prepared "models/$2/seed{seed}" \
      --checkpoint "checkpoints/$2/seed${3//,/-}.pt" --params "$4"; echo $? >"logs/detached/$5.status"
      mv "logs/detached/$5.status" "logs/detached/$5.rc"' \
    _ $((WINDOW_END - $(date +%s))) "$variant" "$seeds" "$params" "$tag" </dev/null >>"logs/$tag.log" 2>&1 &
  finish_job "$1" "$tag"
}
finish_job() {  # item, tag: the tag's training (run_job) waited for until it ends or the call's deadline (then it
  # trains on, and the next call's run_job comes back here), then proven, evaluated and measured
  local variant=${1%%:*} tag=$2 s began shared resumed params status trained_at evaluated_from now_shared
  local seeds=${tag#"$variant"-} pid
  seeds=${seeds//-/,}
  read -r began shared resumed params <"logs/detached/$tag.job"
  until [ -f "logs/detached/$tag.rc" ]; do
    pid=$(cat "logs/detached/$tag.pid" 2>/dev/null)
    # ended without its exit status (killed with its session: as a kill at the deadline), past the seconds it
    # may take to name itself
    if ! alive "$pid" && [ $(( $(date +%s) - began )) -ge 5 ]; then
      [ -f "logs/detached/$tag.rc" ] || echo 137 >"logs/detached/$tag.rc"
      break
    fi
    if [ "$(date +%s)" -ge "$DEADLINE" ]; then
      echo "$variant:$seeds trains on past this call's deadline (process $pid, its own session): a next call waits for it," \
        "or the window's end stops it"
      return 0
    fi
    sleep 1
  done
  status=$(cat "logs/detached/$tag.rc")
  trained_at=$(stat -c %Y "logs/detached/$tag.rc")  # when it ended, between two calls too
  rm -f "logs/detached/$tag".*
  if [ "$status" = 0 ]; then proofs "$variant" "$seeds" || return $?; fi
  evaluated_from=$(date +%s)  # the proofs' wait for the CUDA tests is not the job's own time
  [ "$status" = 0 ] && { evaluate "$variant" "$seeds" "logs/$tag.log" || status=$?; }
  # its measured seconds price its variant's next seeds, here and in later windows on this GPU model
  now_shared=$(ls logs/running | wc -l)
  [ "$status" = 0 ] && [ "$resumed" = 0 ] && { python3 scripts/gpu_queue.py --record "$variant:$seeds" --params "$params" \
    --seconds $(( trained_at - began + $(date +%s) - evaluated_from )) --jobs "$JOBS" --commit "${CAPSNET_GIT_COMMIT:-}" \
    --parallel $(( now_shared > shared ? now_shared : shared )) || true; }
  echo "$variant:$seeds exit $status after $(( $(date +%s) - began ))s: $(tail -1 "logs/$tag.log")"
  local rest=",${1##*:},"
  for s in ${seeds//,/ }; do rest=${rest/,$s,/,}; done
  [ "$status" = 0 ] && [ "$rest" != , ] && return 3  # seeds left that this process did not train: ask again
  return 0
}
export -f job evaluate proofs alive run_job finish_job
export LEVERS JOBS=logs/jobs/seconds.jsonl
if [ -n "$TRAIN" ]; then
  say "training $TRAIN, $PARALLEL at a time, until $((DEADLINE - START))s"
  printf '%s\n' $TRAIN | xargs -P "$PARALLEL" -I{} bash -c 'job "$1"' _ {} | tee -a "$LOG"
fi

if [ -n "$TESTS_PID" ]; then wait "$TESTS_PID"; fi
say "packing"
shopt -s nullglob
runs=(models/*/seed*/config.json models/*/seed*/history.csv models/*/seed*/learning_curve.png)
for dir in gpu_results journal logs fingerprints; do [ -d "$dir" ] && runs+=("$dir"); done
if [ ${#runs[@]} -gt 0 ]; then
  tar czf - --transform "s,^gpu_results,results," "${runs[@]}" params.gpu.yaml | split -b 15m - "$OUT/runs-$START.tar.gz.part-"
fi
tar czf "$OUT/inductor-cache.tar.gz" -C .gpu-cache inductor 2>/dev/null
[ "$(stat -c %s "$OUT/inductor-cache.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ] && rm -f "$OUT/inductor-cache.tar.gz"
# every other file in $OUT as one, the checks' (bench.jsonl, the CUDA tests' log and diffs, the fingerprint
# pins and probe, and any a later check adds): the device tool brings back at most 8 files a call, and they
# were six beside session.log, the inductor cache and the runs' parts (2026-11-27's first call: 7 of 8 without a bench)
checks=()
for f in "$OUT"/*; do
  case ${f##*/} in session.log|inductor-cache.tar.gz|runs-*|checks.tar.gz) ;; *) checks+=("${f##*/}") ;; esac
done
if [ ${#checks[@]} -gt 0 ] && tar czf "$OUT/checks.tar.gz" -C "$OUT" "${checks[@]}"; then (cd "$OUT" && rm -f "${checks[@]}"); fi
[ "$(ls "$OUT" | wc -l)" -le 8 ] || say "over 8 files in \$OUT: the device tool leaves the rest behind"
say "done: $(ls "$OUT" | tr '\n' ' ')"
