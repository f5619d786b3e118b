"""On CUDA only (skipped elsewhere): the captured step (train.cuda_graph) computes what the eager step
computes. Two stacks from the same initial weights, generators and data train side by side for
STEPS steps across an epoch boundary, one with the eager step (`EagerStep`: host integers,
LambdaLR), one captured once as a CUDA graph and replayed (`CapturedStep`); after every step each
parameter's gradient is compared, and at the end the weights:
- exactly equal: every generator's state (the replays drew what eager steps draw and advanced the
  generators as far), every Adam step count, the scheduler's position and rate, and the capture
  happened (no fallback warning);
- within bounds, per parameter (relative norm of the difference): the gradients within the fast
  path's own per-layer bounds of tests/test_gpu.py (FP32_LAYER_BOUND, BF16_LAYER_BOUNDS, in tests/gpu_step.py), the
  weights after STEPS steps within WEIGHT_BOUNDS. The two sides run the same kernels but for the
  learning rate, a float32 device tensor under capture (fused Adam reads it so) and a double
  otherwise, and cuDNN's autotuned kernels need not be deterministic; the bounds are provisional
  until a GPU session measures them (CAPSNET_GPU_REPORT=FILE appends the measured differences).
In the streams layout (each seed on a CUDA stream of its own, run side by side) the eager side runs
the loop layout, the same seeds one after another on one stream: a missing wait between the streams,
a seed reading another's half-written buffers, shows as a difference there.
scripts/gpu_session.sh --tests runs this module; scripts/gpu_levers.py reads its ids (PROOFS, LAYOUT_PROOFS).
"""

import dataclasses
import json
import os
import warnings

import pytest
import torch
from conftest import synthetic_digits
from gpu_step import BF16_LAYER_BOUNDS, FP32_LAYER_BOUND, config, family

from pipeline.experiments import multimnist as mm
from pipeline.training import steps
from pipeline.training.train import build_group, compiled, configure_backends, schedule

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

STEPS_PER_EPOCH, EPOCHS = 10, 2
STEPS = STEPS_PER_EPOCH * EPOCHS
WEIGHT_BOUNDS = {"fp32": 1e-3, "bf16": 1e-2}


def side(cfg, seeds: tuple[int, ...], device: torch.device):
    """One side's stack, its loss (compiled when cfg.compile), optimiser, scheduler and generators, as
    `train_group` builds them."""
    stack, optimizer, scheduler, generators = build_group([dataclasses.replace(cfg, seed=s) for s in seeds], device)
    return stack, (compiled(stack) if cfg.compile else stack), optimizer, scheduler, generators


def training_data(cfg) -> dict[str, torch.Tensor]:
    n = cfg.batch_size * STEPS_PER_EPOCH
    images, labels = synthetic_digits(n, seed=3)
    data = {"train_images": images, "train_labels": labels, "test_images": images, "test_labels": labels}
    if cfg.experiment_name == "multimnist":
        recipes = mm.test_recipes(labels, 1, cfg.max_shift, seed=0)
        data.update(test_pairs=recipes["pairs"], test_shifts=recipes["shifts"])
    return data


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def case(variant: str, precision: str, compiled: bool, layout: str, seeds: tuple[int, ...]):
    """A parameter set whose id scripts/gpu_levers.py reads: variant-precision-eager|compiled-layout-Nseed."""
    return pytest.param(variant, precision, compiled, layout, seeds,
                        id=f"{variant}-{precision}-{'compiled' if compiled else 'eager'}-{layout}-{len(seeds)}seed")


@pytest.mark.parametrize("variant,precision,compiled,layout,seeds", [
    case("capsnet_r3_recon", "fp32", False, "fused", (0, 1, 2)),
    case("capsnet_r3_recon", "fp32", True, "fused", (0,)),  # the precision check's fp32 twin, compiled and captured
    case("capsnet_r3_recon", "bf16", False, "fused", (0, 1, 2)),
    case("capsnet_r3_recon", "bf16", True, "fused", (0, 1, 2)),  # the gpu profile's CapsNet step, captured
    case("capsnet_r3_recon", "bf16", True, "fused", (0,)),
    case("capsnet_r3_recon", "bf16", False, "bmm", (0, 1, 2)),
    case("capsnet_r3_recon", "bf16", True, "streams", (0, 1, 2)),  # seeds side by side, against the loop on one stream
    case("capsnet_r3_recon", "bf16", False, "streams", (0, 1, 2)),
    case("capsnet_r3_recon", "fp32", True, "streams", (0, 1, 2)),  # the precision check's fp32 twin, streams
    case("baseline_cnn", "bf16", False, "fused", (0, 1, 2)),  # dropout masks from each seed's generator
    case("cnn_affnist", "bf16", False, "fused", (0, 1, 2)),  # §5.2's 40×40 canvas
    case("multimnist_r1_recon", "bf16", False, "fused", (0, 1, 2)),  # pairs drawn on the device
])
def test_the_captured_step_replays_what_the_eager_step_computes(variant, precision, compiled, layout, seeds, tf32_off):
    amp = precision == "bf16"
    cfg = dataclasses.replace(config(variant, amp=amp, compile=compiled, stack_layout=layout, lr_decay_steps=1,
                                     lr_decay_rate=0.9), multimnist_epoch_size=128 * STEPS_PER_EPOCH)
    device = torch.device("cuda")
    configure_backends(cfg, device)  # cuDNN autotuning, as the gpu profile trains
    data = training_data(cfg)
    exp = cfg.experiment_module().Training(cfg, data, device)
    assert exp.steps_per_epoch == STEPS_PER_EPOCH
    reference = dataclasses.replace(cfg, stack_layout="loop") if layout == "streams" else cfg
    stack_e, loss_e, opt_e, sched_e, gens_e = side(reference, seeds, device)
    stack_c, loss_c, opt_c, sched_c, gens_c = side(cfg, seeds, device)
    eager = steps.EagerStep(exp, stack_e, loss_e, opt_e, sched_e, gens_e, amp, STEPS_PER_EPOCH, device)
    captured = steps.CapturedStep(exp, stack_c, loss_c, opt_c, sched_c, gens_c, amp, STEPS_PER_EPOCH, device,
                                  schedule(cfg, STEPS))
    active = torch.ones(len(seeds), device=device)
    grad_diffs: dict[str, float] = {}
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(EPOCHS):
            eager.begin_epoch(epoch, [exp.epoch_order(g) for g in gens_e], active)
            captured.begin_epoch(epoch, [exp.epoch_order(g) for g in gens_c], active)
            for _ in range(STEPS_PER_EPOCH):
                eager()
                captured()
                for name, w_e, w_c in zip(stack_e.names, stack_e.weights, stack_c.weights):
                    grad_diffs[name] = max(grad_diffs.get(name, 0.0), relative(w_c.grad, w_e.grad))
            losses.append((captured.sums.clone(), eager.sums.clone()))
            eager.end_epoch((epoch + 1) * STEPS_PER_EPOCH)
            captured.end_epoch((epoch + 1) * STEPS_PER_EPOCH)
    torch.cuda.synchronize()
    weight_diffs = {name: relative(w_c, w_e) for name, w_e, w_c in zip(stack_e.names, stack_e.weights, stack_c.weights)}
    loss_diffs = [relative(c, e) for c, e in losses]
    if os.environ.get("CAPSNET_GPU_REPORT"):
        with open(os.environ["CAPSNET_GPU_REPORT"], "a") as f:
            f.write(json.dumps({"kind": "captured_vs_eager", "variant": variant, "precision": precision,
                                "compiled": compiled, "stack_layout": layout, "seeds": len(seeds), "steps": STEPS,
                                "captured": captured.graph is not None, "loss_rel_diff": loss_diffs,
                                "grad_rel_diff_per_layer": grad_diffs, "weight_rel_diff_per_layer": weight_diffs}) + "\n")
    failed = [str(w.message) for w in caught if "cuda_graph" in str(w.message)]
    assert not failed and captured.graph is not None, failed
    for g_e, g_c in zip(gens_e, gens_c):
        assert torch.equal(g_c.get_state(), g_e.get_state()), "the replays drew other random numbers than eager steps"
    for p_e, p_c in zip(stack_e.weights, stack_c.weights):
        assert float(opt_c.state[p_c]["step"]) == float(opt_e.state[p_e]["step"]) == STEPS
    assert sched_c.last_epoch == sched_e.last_epoch == STEPS and sched_c.get_last_lr() == sched_e.get_last_lr()
    grad_bound = (lambda name: BF16_LAYER_BOUNDS[family(name)]) if amp else (lambda name: FP32_LAYER_BOUND)
    assert not {n: d for n, d in grad_diffs.items() if d >= grad_bound(n)}, grad_diffs
    assert not {n: d for n, d in weight_diffs.items() if d >= WEIGHT_BOUNDS[precision]}, weight_diffs
    assert max(loss_diffs) < WEIGHT_BOUNDS[precision], loss_diffs
