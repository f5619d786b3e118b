"""Speed levers change how fast a step runs, never what it computes: train.channels_last (the step and a
run) and train.compile_mode (it reaches torch.compile and is no part of the checkpoint key). The
capturable step: tests/test_steps.py; the compiled step: tests/test_wiring.py."""

import copy
import dataclasses

import pytest
import torch

from conftest import REPO, experiment_of, synthetic_digits, tiny_config, tiny_data


from pipeline.training import train as train_module
from pipeline.training.config import run_config
from pipeline.training.train import train


NHWC_CPU_BOUND = 1e-2  # per parameter, relative to float64; see the test's docstring


@pytest.mark.parametrize("variant", ["baseline_cnn", "capsnet_r3_recon", "cnn_affnist", "multimnist_baseline",
                                     "multimnist_r3_recon"])
def test_channels_last_step_computes_the_same_step(variant):
    """train.channels_last changes the memory layout, not the step: from the same weights and batch
    the loss and every parameter's gradient match a float64 step, with the conv weights really in NHWC.

    Measured on this project's CPU (oneDNN, AVX2, fp32): the NCHW step is within 2.5e-6 of float64
    everywhere, but oneDNN's NHWC weight-gradient kernels accumulate less exactly: multimnist_baseline's
    conv1.weight gradient is 3.4e-3 off (conv2 9e-4), the other models' under 1e-4. Hence the looser
    NHWC_CPU_BOUND for NHWC; on CUDA tests/test_gpu.py compares cuDNN's NHWC step with eager fp32."""
    from pipeline.experiments import multimnist as mm
    from pipeline.core.params import load_params

    cfg = run_config(load_params(REPO / "params.yaml"), variant, 0, device="cpu", batch_size=8)
    images, labels = synthetic_digits(8, seed=4)
    generator = torch.Generator().manual_seed(0)
    targets = None
    if cfg.experiment_name == "multimnist":
        pairs, shifts = mm.sample_pairs(mm.class_index(labels), 8, cfg.max_shift, generator)
        merged, digits = mm.compose(images, pairs, shifts)
        x, y, targets = train_module.to_float(merged), labels.long()[pairs], digits.unsqueeze(2).float() / 255
    else:
        x = train_module.to_float(experiment_of(cfg, tiny_data(), torch.device("cpu")).augment(images, generator))
        y = labels.long()
    torch.manual_seed(0)
    model = train_module.build_model(cfg).eval()  # eval: the CNNs' dropout off, so no step draws masks

    def step(channels_last: bool, dtype: torch.dtype) -> tuple[float, dict[str, torch.Tensor]]:
        placed = train_module.place_model(copy.deepcopy(model).to(dtype),
                                          dataclasses.replace(cfg, channels_last=channels_last), torch.device("cpu"))
        convs = [p for p in placed.parameters() if p.dim() == 4 and p.shape[1] > 1]  # one in-channel: both layouts
        assert convs and all(p.is_contiguous(memory_format=torch.channels_last) == channels_last for p in convs)
        loss, _, _ = train_module.compute_loss(placed, x.to(dtype), y, train_module.loss_recipe(cfg),
                                               None if targets is None else targets.to(dtype))
        loss.backward()
        return loss.item(), {name: p.grad.double() for name, p in placed.named_parameters()}

    exact_loss, exact = step(False, torch.float64)
    for channels_last, bound in ((False, 1e-4), (True, NHWC_CPU_BOUND)):
        loss, grads = step(channels_last, torch.float32)
        assert loss == pytest.approx(exact_loss, rel=1e-5)
        worst = max((float((grads[n] - g).norm() / g.norm()), n) for n, g in exact.items() if g.norm() > 0)
        assert worst[0] < bound, f"channels_last={channels_last}: {worst[1]} gradient {worst[0]:.2e} off float64"
    assert cfg.digest() == dataclasses.replace(cfg, channels_last=True).digest()  # a layout, not another run


def test_a_channels_last_run_trains_and_saves_like_the_default(tmp_path):
    data = tiny_data()
    plain = train(tiny_config(epochs=1), data, tmp_path / "a.pt")
    nhwc = train(tiny_config(epochs=1, channels_last=True), data, tmp_path / "b.pt")
    assert nhwc.history[0]["train_loss"] == pytest.approx(plain.history[0]["train_loss"], rel=1e-4)
    for name, weight in nhwc.model.state_dict().items():  # Adam's normalised steps: compare norms, not elements
        expected = plain.model.state_dict()[name]
        assert float((weight - expected).norm() / expected.norm()) < 1e-4, name  # measured ≤ 1.4e-5 (3 steps)
    assert nhwc.model.primary.conv.weight.is_contiguous(memory_format=torch.channels_last)


def test_the_compile_mode_reaches_torch_compile_and_is_not_part_of_the_checkpoint_key(tmp_path, monkeypatch):
    modes = []

    def compile_spy(module, mode="default"):  # records the mode and trains eagerly
        modes.append(mode)
        return module

    monkeypatch.setattr(train_module.torch, "compile", compile_spy)
    cfg = tiny_config(epochs=1, compile=True, compile_mode="max-autotune-no-cudagraphs")
    train(cfg, tiny_data(), tmp_path / "c.pt")
    assert modes == ["max-autotune-no-cudagraphs"]
    assert cfg.digest() == dataclasses.replace(cfg, compile_mode="reduce-overhead").digest()  # a speed lever
