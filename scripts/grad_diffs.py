"""Per-parameter gradient differences of bf16 autocast (eager) against fp32, one training step of
each variant from the same weights and batch: what bounds tests/test_gpu.py's per-layer check.

    .venv/bin/python scripts/grad_diffs.py [--device cpu|cuda] [--batch 128] [VARIANT ...] > diffs.jsonl

Prints one JSON line per variant: the loss's relative difference and, per parameter, the
relative norm difference ‖g_bf16 − g_fp32‖ / ‖g_fp32‖. On CPU, autocast's bf16 kernels are
oneDNN's, not cuBLAS/cuDNN's: a proxy for the GPU until a GPU session reruns it with --device cuda.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import REPO  # noqa: E402
from gpu_step import batch, loss_and_grads  # noqa: E402  (the GPU tests' batch and step, on any device)
from pipeline.core.params import load_params  # noqa: E402
from pipeline.training.config import run_config  # noqa: E402
from pipeline.training.train import build_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="*")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    params = load_params(REPO / "params.yaml")
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    for variant in args.variants or sorted(params.variants):
        cfg = run_config(params, variant, 0, device=args.device, batch_size=args.batch, compile=False)
        torch.manual_seed(0)
        reference = build_model(cfg).to(args.device).eval()  # dropout off: both steps see the same network
        fast = copy.deepcopy(reference)
        x, y, targets = batch(cfg, 0, args.device, args.batch)
        ref_loss, ref_grads = loss_and_grads(reference, cfg, x, y, targets, False, args.device)
        loss, grads = loss_and_grads(fast, cfg, x, y, targets, True, args.device)
        print(json.dumps({"variant": variant, "device": args.device, "batch": args.batch,
                          "loss_rel_diff": float(abs(loss - ref_loss) / abs(ref_loss)),
                          "grad_rel_diff": {k: float((grads[k] - g).norm() / g.norm()) for k, g in ref_grads.items()}}),
              flush=True)


if __name__ == "__main__":
    main()
