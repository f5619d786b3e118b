"""The CUDA tests' shared step (tests/test_gpu.py, tests/test_capture_gpu.py), scripts/grad_diffs.py's too: a
variant's run config at the profiles' batch, an augmented batch as the training loop builds it, one step's
loss and per-parameter gradients, and the per-layer gradient bounds of the fast path against eager fp32
(tests/test_gpu.py's docstring says how each was measured). Runs on any device; holds no test."""

import torch

from conftest import REPO, experiment_of, synthetic_digits
from pipeline.core.params import load_params
from pipeline.experiments import multimnist as mm
from pipeline.training.config import run_config
from pipeline.training.train import loss_function, to_float

PARAMS = load_params(REPO / "params.yaml")
BATCH = 128  # the batch the profiles train with


def config(variant: str, **changes):
    return run_config(PARAMS, variant, 0, device="cuda", batch_size=BATCH, deterministic=False, **changes)


def augment(cfg, images, generator):
    """The training augmentation of cfg's experiment family (shift at 28×28, placement at 40×40)."""
    data = {"train_images": images, "train_labels": torch.zeros(len(images)), "test_images": images,
            "test_labels": torch.zeros(len(images))}
    return experiment_of(cfg, data, images.device).augment(images, generator)


def batch(cfg, seed: int = 0, device: str = "cuda", size: int = BATCH):
    """An augmented batch (B, 1, S, S) on ``device``, its labels and reconstruction targets (None but
    for MultiMNIST: (B, 2) labels, (B, 2, 1, S, S) digits alone), as the training loop builds them."""
    images, labels = synthetic_digits(size, seed=seed)
    images, labels = images.to(device), labels.to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    if cfg.experiment_name == "multimnist":
        pairs, shifts = mm.sample_pairs(mm.class_index(labels), size, cfg.max_shift, generator)
        merged, digits = mm.compose(images, pairs, shifts)  # (B, 36, 36), (B, 2, 36, 36)
        return to_float(merged), labels.long()[pairs], digits.unsqueeze(2).float() / 255
    x = to_float(augment(cfg, images, generator))  # (B, 1, S, S)
    return x, labels.long(), None


def loss_and_grads(model, cfg, x, y, targets, amp: bool, device: str = "cuda"):
    """One step's loss and every parameter's gradient, bf16 autocast on ``device`` where ``amp``
    (scripts/grad_diffs.py measures its bounds with it)."""
    fn = loss_function(model, cfg)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        total, _, _ = fn(x, y, targets)
    model.zero_grad(set_to_none=True)
    total.backward()
    return total.detach().float(), {name: p.grad.float() for name, p in model.named_parameters()}


def family(name: str) -> str:
    """A parameter's layer family: its name with layer indices as '#' ('decoder.layers.2.weight' ->
    'decoder.layers.#.weight'), the unit the per-layer bounds are measured in."""
    return ".".join("#" if part.isdigit() else part for part in name.split("."))


FP32_LAYER_BOUND = 1e-2  # the whole gradient: measured up to 2.5e-3 (tests/test_gpu.py's docstring)
BF16_LAYER_BOUNDS = {  # 3× the larger of the CPU and H200 bf16 measurements per family (tests/test_gpu.py's docstring), floor 0.01
    "conv1.bias": 0.113,  # measured CPU 0.038, H200 0.011
    "conv1.weight": 0.216,  # measured CPU 0.072, H200 0.030
    "conv2.bias": 0.108,  # measured CPU 0.036, H200 0.010
    "conv2.weight": 0.116,  # measured CPU 0.039, H200 0.012
    "convs.#.bias": 0.394,  # measured CPU 0.114, H200 0.131
    "convs.#.weight": 0.364,  # measured CPU 0.105, H200 0.121
    "decoder.net.#.bias": 0.052,  # measured CPU 0.016, H200 0.017
    "decoder.net.#.weight": 0.06,  # measured CPU 0.020, H200 0.017
    "digits.W": 0.028,  # measured CPU 0.009, H200 0.008
    "digits.bias": 0.01,  # measured CPU 0.001, H200 0.001
    "fc1.bias": 0.374,  # measured CPU 0.107, H200 0.125
    "fc1.weight": 0.284,  # measured CPU 0.085, H200 0.095
    "fc2.bias": 0.392,  # measured CPU 0.054, H200 0.131
    "fc2.weight": 0.222,  # measured CPU 0.040, H200 0.074
    "out.bias": 0.066,  # measured CPU 0.008, H200 0.022
    "out.weight": 0.057,  # measured CPU 0.009, H200 0.019
    "primary.bias": 0.06,  # measured CPU 0.020, H200 0.003
    "primary.conv.bias": 0.021,  # measured CPU 0.007, H200 0.006
    "primary.conv.weight": 0.049,  # measured CPU 0.016, H200 0.007
}
