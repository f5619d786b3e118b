#!/usr/bin/env bash
# The next GPU session's work, as one command the device tool runs unchanged on every call of the
# session (carry [".gpu"]; fire each call within 30 s of the last so the machine stays warm):
#   bash scripts/gpu_plan.sh
# Each call picks up where the last stopped: a bench this machine already ran is skipped, a run
# already evaluated is skipped, a run the deadline stopped resumes from its 5-epoch checkpoint.
# Afterwards, here: bash scripts/gpu_import.sh /work/.device/N [/work/.device/M ...]
#
# What is left of issue 11 after the 2026-11-23 session (README "GPU sessions"), most needed first:
#  1. bench rows for the six variants without one (the four official-recipe twins train what their
#     paper twins do at the same shapes; the MultiMNIST CNN runs eager bf16 in the gpu profile, and
#     its compiled row says whether that holds for it too), and the two levers never measured: CUDA
#     graphs (bf16-graphs) and NHWC convolutions (-cl, train.channels_last);
#  2. the nine MultiMNIST runs (3 variants × seeds 0, 1, 2), five at a time, seed 0 first.
# A lever the bench shows faster goes into the gpu profile only after `gpu_session.sh --tests` passes
# with it (tests/test_gpu.py checks channels_last against eager fp32 for every variant).
# Edit this list when the plan changes; gpu_session.sh's header explains the arguments.
set -euo pipefail
BENCH="capsnet_r3_recon@bf16-compile,bf16-compile-cl,bf16-graphs baseline_cnn@bf16,bf16-cl
       multimnist_baseline@bf16,bf16-cl,bf16-compile multimnist_r1_recon@bf16-compile
       capsnet_r1_official@bf16-compile capsnet_r1_recon_official@bf16-compile
       capsnet_r3_official@bf16-compile capsnet_r3_recon_official@bf16-compile"
TRAIN=""
for seed in 0 1 2; do
  for variant in multimnist_r3_recon multimnist_r1_recon multimnist_baseline; do TRAIN+="$variant:$seed "; done
done
exec bash "$(dirname "$0")/gpu_session.sh" --bench "$BENCH" --train "$TRAIN" --parallel 5 --deadline "${1:-560}"
