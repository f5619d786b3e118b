"""The official recipe (what the authors' TensorFlow code computes, PAPER.md) beside the paper's
text: loss scale, PrimaryCaps scaling, DigitCaps bias, initialisation, parameter counts, and a
regression check that the paper recipe is unchanged by the official one's existence."""

import math

import pytest
import torch

from conftest import REPO
from pipeline.core.params import load_params
from pipeline.models.baseline import MultiMNISTCNN
from pipeline.models.capsnet import CapsNet, CapsNetOutput, PrimaryCaps, capsnet_loss, dynamic_routing, squash
from pipeline.training.config import ADAM_EPS, run_config
from pipeline.training.train import make_optimizer, schedule


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_official_loss_is_eq4_over_20_plus_scaled_sse_by_hand():
    # 10 classes, label 0 at length 0.8, class 1 at 0.3, the rest below m⁻ = 0.1 (no cost):
    # Eq. 4 = (0.9 − 0.8)² + 0.5 · (0.3 − 0.1)² = 0.01 + 0.02 = 0.03.
    # Official code: mean over the 10 classes of 0.5·T·(…)² + 0.5·0.5·(1 − T)·(…)² = (0.005 + 0.01) / 10.
    lengths = torch.tensor([[0.8, 0.3] + [0.05] * 8])
    # reconstruction (1, 1, 2, 2) against the image: SSE = 1² + 0.5² = 1.25 → 0.0005 · 1.25 = 0.000625
    images = torch.tensor([[[[1.0, 0.0], [0.0, 0.5]]]])
    out = CapsNetOutput(lengths, torch.zeros(1, 10, 16), torch.zeros(1, 1, 2, 2))
    labels = torch.tensor([0])
    total, margin, recon = capsnet_loss(out, images, labels, recipe="official")
    torch.testing.assert_close(margin, torch.tensor((0.005 + 0.01) / 10))
    torch.testing.assert_close(margin, torch.tensor(0.03 / 20))
    torch.testing.assert_close(recon, torch.tensor(0.000625))
    torch.testing.assert_close(total, torch.tensor(0.0015 + 0.000625))
    total, margin, recon = capsnet_loss(out, images, labels, recipe="paper")
    torch.testing.assert_close(total, torch.tensor(0.03 + 0.000625))
    with pytest.raises(ValueError, match="recipe must be one of"):
        capsnet_loss(out, images, labels, recipe="keras")


def test_official_primary_caps_is_squash_of_conv_over_types_plus_bias():
    # 1×1 conv from one input channel, 2 types × 2 components; weights 1, 2, 3, 4 (channel = type·D + component)
    layer = PrimaryCaps(1, types=2, dim=2, kernel_size=1, stride=1, official=True)
    assert layer.conv.bias is None and layer.bias.shape == (2, 2)
    assert torch.equal(layer.bias, torch.full((2, 2), 0.1))
    with torch.no_grad():
        layer.conv.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]).view(4, 1, 1, 1))
    out = layer(torch.ones(1, 1, 1, 1))  # conv = (1, 2, 3, 4); /2 + 0.1 = (0.6, 1.1), (1.6, 2.1)
    expected = []
    for s in ([0.6, 1.1], [1.6, 2.1]):
        norm2 = s[0] ** 2 + s[1] ** 2
        expected.append([norm2 / (1 + norm2) * c / math.sqrt(norm2) for c in s])
    torch.testing.assert_close(out, torch.tensor([expected]))


def test_official_primary_bias_is_shared_over_grid_positions():
    layer = PrimaryCaps(1, types=2, dim=2, kernel_size=1, stride=1, official=True)
    with torch.no_grad():
        layer.conv.weight.zero_()
        layer.bias.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    out = layer(torch.rand(1, 1, 3, 3))  # (1, 2·9, 2): zero conv, so every position is squash(bias of its type)
    torch.testing.assert_close(out[0, :9], squash(torch.tensor([1.0, 0.0])).expand(9, 2))
    torch.testing.assert_close(out[0, 9:], squash(torch.tensor([0.0, 2.0])).expand(9, 2))


def routing_by_hand(u_hat, iterations, bias, bias_every_iteration=True):
    b = torch.zeros(u_hat.shape[:3])
    for r in range(iterations):
        c = torch.softmax(b, dim=2)
        s = (c.unsqueeze(-1) * u_hat).sum(dim=1)
        if bias_every_iteration or r == iterations - 1:
            s = s + bias
        v = squash(s)
        b = b + (u_hat * v.unsqueeze(1)).sum(-1)
    return v


def test_digit_caps_bias_enters_s_in_every_routing_iteration():
    torch.manual_seed(0)
    u_hat, bias = torch.randn(2, 5, 3, 4), torch.randn(3, 4)  # (B, N_in, N_out, D), (N_out, D)
    v, _ = dynamic_routing(u_hat, 3, bias)
    torch.testing.assert_close(v, routing_by_hand(u_hat, 3, bias))
    # the test can tell: adding the bias only after the last iteration gives other outputs
    assert not torch.allclose(v, routing_by_hand(u_hat, 3, bias, bias_every_iteration=False), atol=1e-3)
    # one iteration with u_hat = 0: s_j is the bias alone
    v1, _ = dynamic_routing(torch.zeros(1, 5, 3, 4), 1, bias)
    torch.testing.assert_close(v1[0], squash(bias))


def test_parameter_counts_of_both_recipes():
    assert n_params(CapsNet(reconstruction=True, recipe="official")) == 8_215_728  # the official code's count
    assert n_params(CapsNet(reconstruction=False, recipe="official")) == 6_804_224 + 160
    assert n_params(CapsNet(reconstruction=True, recipe="paper")) == 8_215_568
    with pytest.raises(ValueError, match="recipe must be one of"):
        CapsNet(recipe="keras")


TRUNCATED_STD = math.sqrt(1 - 2 * 2 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(2 / math.sqrt(2)))  # ≈ 0.880


def test_official_initialisation_statistics():
    """Truncated normal cut at ±2σ (TF's truncated_normal): its std is 0.880σ; no value beyond 2σ."""
    torch.manual_seed(0)
    model = CapsNet(3, True, recipe="official")
    for name, weight, std in [("digits.W", model.digits.W, 0.1), ("primary.conv", model.primary.conv.weight, 0.1),
                              ("conv1", model.conv1.weight, 5e-2), ("decoder.0", model.decoder.net[0].weight, 0.1),
                              ("decoder.4", model.decoder.net[4].weight, 0.1)]:
        assert abs(weight.std().item() - std * TRUNCATED_STD) < 0.1 * std * TRUNCATED_STD, name
        assert weight.abs().max().item() <= 2 * std + 1e-7, name
        assert abs(weight.mean().item()) < 0.05 * std, name
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    assert len(biases) == 6  # conv1, PrimaryCaps (32, 8), DigitCaps (10, 16), three decoder layers
    assert all(torch.equal(b, torch.full_like(b, 0.1)) for b in biases)


def test_the_multimnist_cnn_starts_as_the_official_code_does():
    """conv_model.py's variables: truncated normal cut at ±2σ, std 5e-2 for the convs and 0.1 for the
    fully connected layers; every bias 0.1."""
    torch.manual_seed(0)
    model = MultiMNISTCNN(36)
    for name, layer, std in [("conv1", model.conv1, 5e-2), ("conv2", model.conv2, 5e-2), ("fc1", model.fc1, 0.1),
                             ("out", model.out, 0.1)]:
        weight = layer.weight
        assert abs(weight.std().item() - std * TRUNCATED_STD) < 0.1 * std * TRUNCATED_STD, name
        assert weight.abs().max().item() <= 2 * std + 1e-7, name
        assert torch.equal(layer.bias, torch.full_like(layer.bias, 0.1)), name


def test_paper_recipe_is_unchanged():
    """Seed 0's paper-recipe model, outputs and losses as they were before the official recipe existed
    (recorded at commit 2027614): same random draws, same initialisation, same loss."""
    torch.manual_seed(0)
    model = CapsNet(3, True, 28)
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([3, 7])
    out = model(x, y)
    assert sum(p.double().sum().item() for p in model.parameters()) == pytest.approx(-2.456273085683243, rel=1e-6)
    assert sum(p.double().abs().sum().item() for p in model.parameters()) == pytest.approx(58789.65466848025, rel=1e-6)
    torch.testing.assert_close(out.lengths[0, :3], torch.tensor([0.00040950122638605535, 0.0004282030276954174,
                                                                0.0005440677632577717]), rtol=1e-4, atol=0)
    total, margin, recon = capsnet_loss(out, x, y)
    assert margin.item() == pytest.approx(0.8089740872383118, rel=1e-5)
    assert recon.item() == pytest.approx(0.03238368034362793, rel=1e-5)


def schedule_config(**changes):
    """capsnet_r1's RunConfig under the committed params (the paper protocol's optimiser), with ``changes``."""
    return run_config(load_params(REPO / "params.yaml"), "capsnet_r1", 0, **changes)


def test_adam_is_tf1s_adam():
    """tf.train.AdamOptimizer, as the official code uses it: β 0.9 / 0.999, ε 1e-8 (Keras' default is
    1e-7), no weight decay, no AMSGrad."""
    optimizer, _ = make_optimizer(CapsNet(1, False, num_classes=3), schedule_config(), torch.device("cpu"))
    group = optimizer.param_groups[0]
    assert ADAM_EPS == 1e-8 and group["eps"] == 1e-8 and group["betas"] == (0.9, 0.999)
    assert group["weight_decay"] == 0 and group["amsgrad"] is False


def test_the_decay_is_smooth_and_floored_at_lr_min():
    """lr · 0.96^(step / decay_steps), not a staircase, never below lr_min: with 10-step decays and a
    floor of 1e-4, step 5 has 1e-3 · 0.96^0.5 and from step 565 on (0.96^56.5 < 0.1) the floor holds."""
    rates = schedule(schedule_config(lr_decay_steps=10, lr_min=1e-4), 1000)
    assert rates[5] == pytest.approx(1e-3 * 0.96 ** 0.5)
    assert rates[560] == pytest.approx(1e-3 * 0.96 ** 56) and rates[560] > 1e-4
    assert rates[565:] == [pytest.approx(1e-4)] * 436 and rates[564] > 1e-4
    assert all(a >= b for a, b in zip(rates, rates[1:]))
