#!/usr/bin/env bash
# Every lent GPU session's work (issue #36, was #24), as one command the device tool runs unchanged on each
# call of the session (carry [".gpu"]; fire each call within 30 s of the last so the machine stays warm):
#   CAPSNET_GIT_COMMIT=$(git rev-parse HEAD) bash scripts/gpu_plan.sh
# Each call picks up where the last stopped: the CUDA tests run once per warm machine, a bench this
# machine already ran is skipped, a run already evaluated is skipped, a run the deadline stopped
# resumes from its 5-epoch checkpoint. A run cut off by the session's end is redone next session.
# Afterwards, here: bash scripts/gpu_import.sh /work/.device/N [/work/.device/M ...], commit reports/.
#
# The queue, most needed first:
#  1. checks and speed: every CUDA-only test (per-layer gradient bounds, CUDA generator on resume,
#     three seeds stacked and compiled, the whole step captured as one CUDA graph against the eager
#     step), bench rows for stacked seeds (#23: one seed, then three, for capsnet_r3_recon and
#     baseline_cnn, in the fused, bmm and (the CNN) loop layouts, pytorch#73764) and the levers never
#     measured: the captured step (-capture, #37), compile's CUDA graphs and autotuning, NHWC (-cl);
#     then --levers: each benched model trains with its fastest mode that passed its CUDA tests
#     (scripts/gpu_levers.py; params.gpu.<model>.yaml, recorded in every run's config.json);
#  2. the short protocol (gpu profile: 50 epochs with the paper's 640-epoch decay compressed into
#     them) for the five Table 1 rows and their four official twins, seeds 0-2, all at this commit,
#     then MultiMNIST's three variants, then §5.2's two: scripts/gpu_queue.py --stack lists what
#     reports/runs does not yet hold under this protocol, in that order, a variant's seeds stacked in
#     one process (`capsnet train V 0,1,2`);
#  3. not queued yet: the paper protocol (`make paper-gpu`, 640 epochs), until the stacked bench rows say
#     how long 3 seeds take, and the bf16-vs-fp32 precision check (gpu profile, capsnet_r3_recon,
#     3 seeds each), which waits until item 2 is done.
# A lever the bench shows faster trains this window only after the CUDA tests pass with it; it goes
# into the gpu profile itself by a commit, once reports/benchmarks.md holds its rows.
set -euo pipefail
cd "$(dirname "$0")/.."
# CAPSNET_GPU_PROFILE and CAPSNET_GPU_BENCH are for scripts/gpu_rehearse.sh (this window rehearsed on a CPU)
python3 -m pipeline.profiles "${CAPSNET_GPU_PROFILE:-gpu}" --write params.gpu.yaml
BENCH=${CAPSNET_GPU_BENCH:-"capsnet_r3_recon@bf16-compile,bf16-compile-capture,bf16-capture#1,3+bmm baseline_cnn@bf16,bf16-capture#1,3+loop+bmm capsnet_r3_recon@bf16-compile-cl,bf16-graphs,bf16-autotune baseline_cnn@bf16-cl"}
TRAIN=$(python3 scripts/gpu_queue.py --params params.gpu.yaml --stack)
TESTS=()
mkdir -p logs
[ -f logs/gpu_tests.done ] || TESTS=(--tests)
bash scripts/gpu_session.sh "${TESTS[@]}" --bench "$BENCH" --levers --train "$TRAIN" --parallel 4 --deadline "${1:-560}"
touch logs/gpu_tests.done
