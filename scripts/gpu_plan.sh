#!/usr/bin/env bash
# Every lent GPU session's work (issue #36, was #24), as one command the device tool runs unchanged on each
# call of the session (carry [".gpu"]; fire each call within 30 s of the last so the machine stays warm),
# LEFT being the device tool's `status` budget_left_s read just before the call (free):
#   CAPSNET_GPU_LEFT=LEFT CAPSNET_GPU_LEFT_AT=T CAPSNET_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_plan.sh
# (T: `date +%s` here when LEFT was read; `bash scripts/gpu_command.sh LEFT` here prints the line). A window is 15 device-minutes, the machine's
# start and every transfer counted in: from LEFT the call works out the seconds it has (LEFT less the
# seconds since T, the start and the transfer in as measured, less 60 s after a cold start or 30 s after a
# warm one for what follows; without T, LEFT less 165 s on a cold machine, 75 s on a warm one),
# stops its work within them (560 s at most a call) and
# starts a training job only when its estimate fits them (scripts/gpu_queue.py --fit). Typically two
# calls: the first about 9 min, the second the 2-3 min left. Without CAPSNET_GPU_LEFT a call only knows
# its own deadline (the first argument, 560 s).
# Each call picks up where the last stopped: the commit's fingerprint table is written once per warm
# machine, before the queue is asked (15 capped CPU processes at once: 8-14 s each on this 2-core machine,
# not measured there; its seconds come out of the call's), then the tables of the published runs' commits
# that no table carries into this host's environment (fingerprints depend on the host's processor and C
# library: docs/gpu-sessions.md), the CUDA tests run once (beside the first
# jobs, which train with the profile's settings and train again where the tests fail them; not at all where
# an earlier window ran them at this code on this GPU: their log is kept, scripts/gpu_proof.py), a bench this
# machine or an earlier window on this GPU model already ran is skipped, a run already evaluated is
# skipped, a run still training since the last call (in a process session of its own, it outlasts the call)
# is waited for. A run the window's end cuts off is lost (the machine goes back with it), so none is started
# that the estimate says cannot finish.
# Afterwards, here: bash scripts/gpu_import.sh /work/.device/N [/work/.device/M ...], commit reports/.
#
# The queue, most needed first:
#  1. checks and speed: every CUDA-only test (per-layer gradient bounds, CUDA generator on resume,
#     three seeds stacked and compiled, the whole step captured as one CUDA graph against the eager
#     step), bench rows for stacked seeds (#23: one seed, then three, for capsnet_r3_recon and
#     baseline_cnn, in the fused, bmm and (the CNN) loop layouts, pytorch#73764) and the levers never
#     measured: the captured step (-capture, #37), compile's CUDA graphs, NHWC (-cl), and where the captured
#     step's time goes, one seed and three stacked (+profile: torch.profiler's kernels by category, what the
#     next speed lever should aim at: the paper protocol needs a step about 1.5x faster), three seeds stacked
#     each on a CUDA stream of its own (+streams: the captured step as parallel branches, in bf16 and in the
#     fp32 twin's mode, beside the fused stack timed again on the same machine); max-autotune is
#     left out since the H200 window of 2026-11-26 (no gain, 200 s to compile); a GPU model's rows in
#     reports/bench/<model>/ are not benched again; then --levers: each benched model trains with its fastest mode that passed its CUDA tests
#     (scripts/gpu_levers.py; params.gpu.<model>.yaml, recorded in every run's config.json);
#  2. the short protocol (gpu profile: 50 epochs with the paper's 640-epoch decay compressed into
#     them) for the five Table 1 rows and their four official twins, seeds 0-2, all at this commit,
#     then MultiMNIST's three variants, then the precision check's fp32 twin (capsnet_r3_recon_fp32: the
#     same short protocol with bf16 autocast off and TF32 off, #36 item 6, its levers picked among the fp32
#     bench rows of the last bench entry, one seed and three stacked: without a stacked row of its mode the
#     queue would price three stacked seeds at three times one seed's time, and on the H200 three bf16
#     captured seeds stacked ran at 0.48x one seed's speed (fp32 not measured), so a job started by that estimate could be cut off by the window's end), then §5.2's two: scripts/gpu_queue.py --stack lists what
#     reports/runs does not yet hold under this protocol and this commit's training fingerprint (its
#     table written first, fingerprints/<commit>.json), in that order, a variant's seeds stacked in
#     one process (`capsnet train V 0,1,2`), or one seed per process, one after another, where the
#     bench rows say stacking is slower (the H200: 0.48x; gpu_queue.stacking_pays);
#  3. the paper protocol (`make paper-gpu`, 640 epochs: at the H200's captured bf16 66k images/s one seed
#     trains in about 10 min, all of a window's training time, and a seed the window's end cuts off is
#     lost): one seed a window, alone (scripts/gpu_window.py: params.paper-gpu.yaml, --parallel 1), once
#     the queue above is done but §5.2 (capsnet_r3_recon_official's seeds, then capsnet_r3_recon's; the
#     other variants after §5.2), where the published precision check allows bf16 (in fp32 a seed is about
#     four windows) and the window runs no CUDA tests beside it (their log kept at this code on this GPU).
# A lever the bench shows faster trains this window only after the CUDA tests pass with it; it goes
# into the gpu profile itself by a commit, once reports/benchmarks.md holds its rows.
set -euo pipefail
cd "$(dirname "$0")/.."
PLAN_START=$(date +%s)
# the runs' commit is this tree's HEAD where the copy has .git (the device tool's does): a mistyped
# CAPSNET_GIT_COMMIT (2026-11-26: b8f3efe padded with zeros) would name a commit nobody can check out
if head=$(git rev-parse HEAD 2>/dev/null) && [ "${CAPSNET_GIT_COMMIT:-$head}" != "$head" ]; then
  echo "CAPSNET_GIT_COMMIT=$CAPSNET_GIT_COMMIT is not this tree's HEAD $head: the runs record $head" >&2
  export CAPSNET_GIT_COMMIT=$head
fi
# CAPSNET_GPU_PROFILE and CAPSNET_GPU_BENCH are for scripts/gpu_rehearse.sh (this window rehearsed on a CPU)
python3 -m pipeline.profiles "${CAPSNET_GPU_PROFILE:-gpu}" --write params.gpu.yaml
mkdir -p logs fingerprints
# the paper protocol as a window would train it (#36 item 5): in bf16 autocast where the published report's
# precision check allows it (reports/effects.csv: scripts/gpu_window.py --paper-amp says why), its step captured
# (the profile's own train.cuda_graph)
PAPER_AMP=$(python3 scripts/gpu_window.py --params params.gpu.yaml --paper-amp 2>>logs/queue.log) || PAPER_AMP=false
python3 -m pipeline.profiles paper-gpu --set "train.amp=$PAPER_AMP" --write params.paper-gpu.yaml
BENCH=${CAPSNET_GPU_BENCH:-"capsnet_r3_recon@bf16-compile,bf16-compile-capture,bf16-capture#1,3+bmm capsnet_r3_recon@bf16-compile-capture#1,3+profile baseline_cnn@bf16,bf16-capture#1,3+loop+bmm capsnet_r3_recon@bf16-compile-cl,bf16-graphs baseline_cnn@bf16-cl capsnet_r3_recon@fp32,compile,capture,compile-capture#1,3 capsnet_r3_recon@bf16-compile-capture,compile-capture#3+streams"}
# the fingerprint table of the code that trains, before the queue, which lists again what other training
# code trained (a commit since changed training; an older, uncapped fingerprint): every variant in its own
# capped CPU process, as many at a time as there are cores, once per warm machine; gpu_session.sh packs it,
# the report bridges rows of two windows' commits through it (capsnet report --fingerprints)
FP_TABLE="fingerprints/${CAPSNET_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}.json" QUEUE_ARGS=()
if [ ! -s "$FP_TABLE" ] && [ "$FP_TABLE" != fingerprints/unknown.json ]; then
  python3 -m pipeline.cli fingerprint "$FP_TABLE" --params params.gpu.yaml >>logs/fingerprints.log 2>&1 \
    || echo "fingerprint table failed (logs/fingerprints.log: $(tail -1 logs/fingerprints.log)): the queue goes by protocol only"
fi
[ -s "$FP_TABLE" ] && QUEUE_ARGS=(--fingerprints "$FP_TABLE")
# the tables of the published runs' own commits on this host (its processor and C library decide
# fingerprints: a table computed elsewhere does not carry its runs here), each commit's code in its own
# worktree (scripts/fingerprint_at.py), all at once, once per warm machine (then the queue knows them
# from fingerprints/); a table that fails or runs past BRIDGE_SECONDS leaves its runs queued again
if [ -s "$FP_TABLE" ]; then
  ENV_TAG=$(python3 -c 'import json, sys; from pipeline.core.lineage import environment_tag
print(environment_tag(json.load(open(sys.argv[1]))["environment"]))' "$FP_TABLE")
  mapfile -t BRIDGES < <(python3 scripts/gpu_queue.py --params params.gpu.yaml --bridges "${QUEUE_ARGS[@]}" 2>>logs/queue.log)
  for line in "${BRIDGES[@]}"; do
    read -r commit variants <<<"$line"
    ( timeout "${BRIDGE_SECONDS:-150}" python3 scripts/fingerprint_at.py "$commit" "fingerprints/$commit-$ENV_TAG.json" \
        --variants $variants >>logs/fingerprints.log 2>&1 && echo "[$(( $(date +%s) - PLAN_START ))s] fingerprint table of ${commit:0:7} on this host: $variants" \
      || echo "fingerprint table of ${commit:0:7} on this host failed (logs/fingerprints.log: $(tail -1 logs/fingerprints.log)): its runs are queued again" ) &
  done
  wait
fi
# whether the CUDA tests run this window: not where an earlier window ran them at this code on this GPU (their
# kept log, scripts/gpu_proof.py), asked once per warm machine (each call must plan the same window)
[ -f logs/tests.kept ] || { python3 scripts/gpu_proof.py find reports/bench 2>>logs/queue.log || true; } >logs/tests.kept
if [ -s logs/tests.kept ] && [ ! -s logs/bench/.device ]; then  # its folder names this GPU's model (reports/bench/<model>/):
  mkdir -p logs/bench && basename "$(dirname "$(dirname "$(cat logs/tests.kept)")")" >logs/bench/.device  # gpu_session.sh's
fi  # folder of bench rows, which it would otherwise import torch again to name
TESTS=() WINDOW=()
SPENT=$(( $(date +%s) - PLAN_START ))  # the table and the queue, out of this call's time
[ -f logs/gpu_tests.done ] || TESTS=(--tests)
if [ -n "${CAPSNET_GPU_LEFT:-}" ]; then
  # what LEFT (read before the call) loses besides this call's work. With CAPSNET_GPU_LEFT_AT (the
  # clock there when LEFT was read: the device's files come back stamped within a second of it) the
  # machine's start, a failed try and the transfer in are measured, and AFTER is allowed for what
  # follows: this call's files back, the wait for the next call and its transfer in, the give-back (all
  # of it, start included, took 45 s in each of two H200 windows of two calls, 2026-11-26/27, and 30 s
  # for the first call of a third: 60 s allowed after a cold start and 30 s after a warm one, about
  # twice the measured less what T measures); a clock difference outside 0-600 s is not
  # believed. Without it, allowances for the whole: 165 s on a cold machine (its start is in LEFT
  # too), 75 s on a warm one
  overhead=165 after=60
  [ -f logs/gpu_tests.done ] && overhead=75 after=30
  since=-1
  [[ "${CAPSNET_GPU_LEFT_AT:-}" =~ ^[0-9]+$ ]] && since=$(( PLAN_START - CAPSNET_GPU_LEFT_AT ))
  if [ "$since" -ge 0 ] && [ "$since" -le 600 ]; then overhead=$(( since + after )); fi
  WINDOW=(--window $(( CAPSNET_GPU_LEFT - overhead - SPENT )))
  [ "${WINDOW[1]}" -ge 60 ] || { echo "the window has ${WINDOW[1]} s left: give the machine back (device tool give_back)"; exit 0; }
fi
CHOICE=()  # the window's choice: a paper seed only where no CUDA tests share the GPU and, the window known, it fits
[ -s logs/tests.kept ] || CHOICE=(--tests-run)
if [ ${#WINDOW[@]} -gt 0 ] && [ -s logs/bench/.device ]; then  # priced as its job will be: this GPU's rows and jobs
  slug=$(cat logs/bench/.device)
  CHOICE+=(--left "${WINDOW[1]}" --bench "reports/bench/$slug"
           --jobs "reports/bench/$slug/jobs/seconds.jsonl" --jobs logs/jobs/seconds.jsonl)
fi
# what this window trains: the gpu profile's queue, or the paper protocol's next seed alone (its own params), which
# needs the GPU to itself: never beside the CUDA tests; where that choice fails, the gpu profile's queue
PLAN=$(python3 scripts/gpu_window.py --params params.gpu.yaml --paper params.paper-gpu.yaml ${CHOICE[@]+"${CHOICE[@]}"} \
  ${QUEUE_ARGS[@]+"${QUEUE_ARGS[@]}"} 2> >(tee -a logs/queue.log >&2)) \
  || PLAN="gpu $(python3 scripts/gpu_queue.py --params params.gpu.yaml --stack ${QUEUE_ARGS[@]+"${QUEUE_ARGS[@]}"} 2> >(tee -a logs/queue.log >&2))"
read -r KIND TRAIN <<<"$PLAN"
late=$(( $(date +%s) - PLAN_START - SPENT ))  # the choice's seconds, after the window was counted
SPENT=$(( SPENT + late ))
[ ${#WINDOW[@]} -eq 0 ] || WINDOW[1]=$(( WINDOW[1] - late ))
# the call's account, first in its session.log (gpu_import.sh prints it): what the window lost before this plan
# (the machine's start, any failed try, the transfer in: the allowances above are estimates) and what is left
mkdir -p "${OUT:-$PWD/gpu_out}"
echo "[plan] LEFT ${CAPSNET_GPU_LEFT:-unknown} s, read $([ "${since:--1}" -ge 0 ] && echo "$since s" || echo "an unknown time") before this plan;" \
  "the plan took $SPENT s from $PLAN_START (epoch s, this machine's clock); the session has ${WINDOW[1]:-an unknown number of} s of window, $(( ${1:-560} - SPENT )) s of call; $KIND ${TRAIN:-(nothing)}" \
  >>"${OUT:-$PWD/gpu_out}/session.log"
ALONGSIDE=(--parallel 2)
[ "$KIND" = paper ] && ALONGSIDE=(--params params.paper-gpu.yaml --parallel 1)
bash scripts/gpu_session.sh "${TESTS[@]}" --bench "$BENCH" --levers --train "$TRAIN" "${ALONGSIDE[@]}" --deadline "$(( ${1:-560} - SPENT ))" \
  ${WINDOW[@]+"${WINDOW[@]}"}
touch logs/gpu_tests.done
