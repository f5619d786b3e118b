"""One test per paper equation and per known pitfall (PAPER.md), on tiny hand-computable tensors."""

import math

import pytest
import torch

from pipeline.models.baseline import BaselineCNN, PoolingCNN
from pipeline.models.capsnet import (
    CapsNet, PrimaryCaps, capsule_length, dynamic_routing, margin_loss, reconstruction_loss, squash,
)


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- Eq. 1 squash ---------------------------------------------------------------------------------

def test_squash_worked_example():
    s = torch.tensor([3.0, 4.0])  # ‖s‖ = 5 → scale 25/26, unit vector (0.6, 0.8)
    torch.testing.assert_close(squash(s), torch.tensor([0.6, 0.8]) * 25 / 26)


def test_squash_norm_below_one_and_direction_kept():
    s = torch.randn(64, 16) * torch.logspace(-3, 1.5, 64).unsqueeze(1)
    v = squash(s)
    norms = v.norm(dim=-1)
    assert (norms < 1).all()
    cosine = torch.nn.functional.cosine_similarity(s, v, dim=-1)
    torch.testing.assert_close(cosine, torch.ones(64))
    expected = s.norm(dim=-1) ** 2 / (1 + s.norm(dim=-1) ** 2)
    torch.testing.assert_close(norms, expected, rtol=1e-4, atol=1e-6)


def test_squash_zero_vector_is_finite_with_finite_gradient():
    s = torch.zeros(2, 8, requires_grad=True)
    v = squash(s)
    v.sum().backward()
    assert torch.equal(v, torch.zeros(2, 8))
    assert torch.isfinite(s.grad).all()


def test_squash_along_other_dim():
    s = torch.tensor([[3.0, 0.0], [4.0, 0.0]])  # capsules along dim 0
    torch.testing.assert_close(squash(s, dim=0)[:, 0], torch.tensor([0.6, 0.8]) * 25 / 26)


# --- Procedure 1 routing --------------------------------------------------------------------------

def test_coupling_sums_to_one_over_parents():
    u_hat = torch.randn(2, 5, 3, 4)
    _, c = dynamic_routing(u_hat, 3)
    torch.testing.assert_close(c.sum(dim=2), torch.ones(2, 5))
    assert not torch.allclose(c.sum(dim=1), torch.ones(2, 3))  # not a softmax over inputs


def test_one_iteration_is_uniform_coupling():
    u_hat = torch.randn(2, 5, 3, 4)
    v, c = dynamic_routing(u_hat, 1)
    torch.testing.assert_close(c, torch.full((2, 5, 3), 1 / 3))
    torch.testing.assert_close(v, squash(u_hat.sum(dim=1) / 3))  # s_j = Σ_i (1/3) u_hat


def _routing_by_hand(u_hat, iterations):
    """Procedure 1 with explicit loops over i and j, for one sample."""
    n_in, n_out, _ = u_hat.shape
    b = [[0.0] * n_out for _ in range(n_in)]
    for r in range(iterations):
        c = []
        for i in range(n_in):
            exps = [math.exp(b[i][j]) for j in range(n_out)]
            c.append([e / sum(exps) for e in exps])
        v = []
        for j in range(n_out):
            s_j = sum(c[i][j] * u_hat[i, j] for i in range(n_in))
            norm2 = float((s_j * s_j).sum())
            v.append(norm2 / (1 + norm2) * s_j / math.sqrt(norm2))
        for i in range(n_in):
            for j in range(n_out):
                b[i][j] += float(u_hat[i, j] @ v[j])
    return torch.stack(v), torch.tensor(c)


def test_three_iterations_match_procedure_1_by_hand():
    torch.manual_seed(0)
    u_hat = torch.randn(1, 4, 3, 2, dtype=torch.float64)
    v, c = dynamic_routing(u_hat, 3)
    v_ref, c_ref = _routing_by_hand(u_hat[0], 3)
    torch.testing.assert_close(v[0], v_ref.to(v.dtype))
    torch.testing.assert_close(c[0], c_ref.to(c.dtype))


def test_routing_rejects_zero_iterations():
    with pytest.raises(ValueError, match="iterations must be >= 1"):
        dynamic_routing(torch.randn(1, 2, 2, 2), 0)


def test_gradient_flows_through_every_iteration():
    u_hat = torch.randn(1, 4, 3, 2, requires_grad=True)
    v3, _ = dynamic_routing(u_hat, 3)
    g3 = torch.autograd.grad(v3.sum(), u_hat)[0]
    assert torch.isfinite(g3).all()
    # Were the agreement b built from a detached u_hat, the gradient would be that of a fixed-c sum.
    _, c3 = dynamic_routing(u_hat.detach(), 3)
    s = torch.einsum("bij,bijd->bjd", c3, u_hat)
    g_fixed = torch.autograd.grad(squash(s).sum(), u_hat)[0]
    assert not torch.allclose(g3, g_fixed)


# --- Eq. 4 margin loss, reconstruction loss -----------------------------------------------------

def test_margin_loss_worked_example():
    lengths = torch.tensor([[0.8, 0.3, 0.05]])  # label 0
    # present: (0.9 - 0.8)^2 = 0.01; absent: 0.5 * ((0.3 - 0.1)^2 + 0) = 0.02
    torch.testing.assert_close(margin_loss(lengths, torch.tensor([0])), torch.tensor(0.03))


def test_margin_loss_squares_lambda_and_batch_mean():
    lengths = torch.tensor([[0.5, 0.7], [0.95, 0.0]])
    # sample 0 (label 0): 0.4^2 + 0.5 * 0.6^2 = 0.16 + 0.18 = 0.34; sample 1 (label 0): 0
    loss = margin_loss(lengths, torch.tensor([0, 0]))
    torch.testing.assert_close(loss, torch.tensor(0.17))
    custom = margin_loss(lengths, torch.tensor([0, 0]), m_plus=1.0, m_minus=0.0, lambda_=1.0)
    # sample 0: 0.5^2 + 0.7^2 = 0.74; sample 1: 0.05^2 = 0.0025
    torch.testing.assert_close(custom, torch.tensor((0.74 + 0.0025) / 2))


def test_reconstruction_loss_is_scaled_sum_not_mean():
    images = torch.zeros(2, 1, 2, 2)
    recon = torch.tensor([[[[1.0, 0.5], [0.0, 0.0]]], [[[0.0, 0.0], [0.0, 0.0]]]])
    # SSE per image: 1.25 and 0 → mean 0.625 → × 0.0005
    torch.testing.assert_close(reconstruction_loss(recon, images), torch.tensor(0.0005 * 0.625))
    torch.testing.assert_close(reconstruction_loss(recon, images, scale=1.0), torch.tensor(0.625))


# --- Architecture pitfalls ----------------------------------------------------------------------

def test_primary_capsules_never_mix_grid_positions():
    layer = PrimaryCaps(in_channels=1, types=2, dim=3, kernel_size=1, stride=1)
    with torch.no_grad():
        layer.conv.weight.zero_()
        layer.conv.bias.zero_()
        layer.conv.weight[:, 0, 0, 0] = 1.0  # every channel copies the input pixel
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 1, 0] = 5.0  # only grid position (1, 0) is non-zero
    u = layer(x)  # (1, 2·2·2, 3)
    nonzero = (u.abs().sum(dim=2) > 0).view(2, 2, 2)  # (types, G, G)
    expected = torch.zeros(2, 2, 2, dtype=torch.bool)
    expected[:, 1, 0] = True
    assert torch.equal(nonzero, expected)
    # each non-zero capsule holds its three components of that one position
    torch.testing.assert_close(u[0, 2], squash(torch.full((3,), 5.0)))


def test_primary_caps_sees_conv1_after_its_relu():
    """Conv1 is 256 channels of 9×9 with a ReLU (§4): PrimaryCaps' input has no negative value, and
    some of conv1's pre-activations are negative (else the check would hold with no ReLU)."""
    torch.manual_seed(0)
    model = CapsNet(routing_iterations=1, reconstruction=False, num_classes=3)
    seen = {}
    model.conv1.register_forward_hook(lambda module, args, out: seen.update(conv1=out))
    model.primary.register_forward_pre_hook(lambda module, args: seen.update(primary=args[0]))
    model(torch.rand(2, 1, 28, 28))
    assert (seen["conv1"] < 0).any()
    torch.testing.assert_close(seen["primary"], torch.relu(seen["conv1"]))


def test_decoder_sees_the_label_capsule_in_training():
    torch.manual_seed(0)
    model = CapsNet(routing_iterations=1, num_classes=3).eval()
    images = torch.rand(2, 1, 28, 28)
    out_a = model(images, torch.tensor([0, 1]))
    out_b = model(images, torch.tensor([0, 2]))  # change image 1's label only
    torch.testing.assert_close(out_a.reconstructions[0], out_b.reconstructions[0])
    assert not torch.allclose(out_a.reconstructions[1], out_b.reconstructions[1])
    # evaluation uses the longest capsule
    out_eval = model(images)
    predicted = out_eval.lengths.argmax(dim=1)
    torch.testing.assert_close(out_eval.reconstructions, model(images, predicted).reconstructions)


def test_capsnet_parameter_counts():
    assert n_params(CapsNet(reconstruction=True)) == 8_215_568
    assert n_params(CapsNet(reconstruction=False)) == 6_804_224


def test_baseline_parameter_count():
    assert n_params(BaselineCNN()) == 35_445_522


@pytest.mark.parametrize("routing_iterations,reconstruction", [(1, False), (1, True), (3, False), (3, True)])
def test_every_parameter_gets_a_finite_gradient(routing_iterations, reconstruction):
    torch.manual_seed(0)
    model = CapsNet(routing_iterations, reconstruction, num_classes=3)
    images, labels = torch.rand(2, 1, 28, 28), torch.tensor([0, 2])
    out = model(images, labels)
    loss = margin_loss(out.lengths, labels)
    if reconstruction:
        loss = loss + reconstruction_loss(out.reconstructions, images)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_baseline_every_parameter_gets_a_gradient():
    model = BaselineCNN(num_classes=7)
    logits = model(torch.rand(2, 1, 28, 28))
    assert logits.shape == (2, 7)
    torch.nn.functional.cross_entropy(logits, torch.tensor([1, 6])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("image_size,num_classes,n_primary", [(28, 7, 1152), (40, 10, 32 * 12 * 12), (28, 11, 1152)])
def test_shapes_for_other_sizes_and_class_counts(image_size, num_classes, n_primary):
    model = CapsNet(3, True, image_size=image_size, num_classes=num_classes)
    assert model.config.num_primary == n_primary
    out = model(torch.rand(2, 1, image_size, image_size))
    assert out.lengths.shape == (2, num_classes)
    assert out.poses.shape == (2, num_classes, 16)
    assert out.reconstructions.shape == (2, 1, image_size, image_size)
    assert BaselineCNN(image_size, num_classes)(torch.rand(2, 1, image_size, image_size)).shape == (2, num_classes)


def test_no_reconstruction_returns_none():
    assert CapsNet(1, reconstruction=False, num_classes=3)(torch.rand(1, 1, 28, 28)).reconstructions is None


def test_all_zero_images_give_no_nan():
    model = CapsNet(3, True)
    images, labels = torch.zeros(2, 1, 28, 28), torch.tensor([3, 4])
    out = model(images, labels)
    loss = margin_loss(out.lengths, labels) + reconstruction_loss(out.reconstructions, images)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_class_score_is_the_capsule_length():
    """§4: the class score is ‖v_j‖ (with the squash's ε, negligible here), not ‖v_j‖²: a 3-4-0 capsule
    scores 5, and the model's lengths are its poses' norms."""
    v = torch.tensor([[[3.0, 4.0, 0.0], [0.0, 0.0, 0.5]]])  # (B=1, K=2, D=3)
    torch.testing.assert_close(capsule_length(v), torch.tensor([[5.0, 0.5]]))
    out = CapsNet(1, False, num_classes=3)(torch.rand(2, 1, 28, 28))
    torch.testing.assert_close(out.lengths, out.poses.norm(dim=-1))


def test_lengths_below_one():
    out = CapsNet(3, False)(torch.rand(4, 1, 28, 28))
    assert ((out.lengths >= 0) & (out.lengths < 1)).all()


def test_bf16_autocast_forward():
    model = CapsNet(3, True, num_classes=3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.rand(2, 1, 28, 28), torch.tensor([0, 1]))
    assert torch.isfinite(out.lengths.float()).all()


def test_pooling_cnn_matches_the_40px_capsnet_parameter_count():
    """§5.2: a conventional CNN with max-pooling and dropout, close to the 40×40 CapsNet's count."""
    def count(m):
        return sum(p.numel() for p in m.parameters())

    capsnet, cnn = count(CapsNet(3, True, image_size=40)), count(PoolingCNN(image_size=40))
    assert (capsnet, cnn) == (13_475_648, 13_484_826)  # the numbers the docstring and the report state
    assert abs(cnn - capsnet) / capsnet < 0.001
    assert any(isinstance(m, torch.nn.Dropout) for m in PoolingCNN().modules())


@pytest.mark.parametrize("image_size,num_classes", [(40, 10), (28, 7)])
def test_pooling_cnn_shapes_and_gradients(image_size, num_classes):
    model = PoolingCNN(image_size, num_classes)
    logits = model(torch.rand(3, 1, image_size, image_size))
    assert logits.shape == (3, num_classes)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, num_classes - 1])).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("image_size", [16, 10])
def test_an_image_too_small_for_two_9x9_convolutions_is_refused_at_construction(image_size):
    """17×17 leaves PrimaryCaps a 1×1 grid; 16×16 leaves it none (a 0×0 grid), 10×10 less than none."""
    assert CapsNet(1, False, image_size=17).config.num_primary == 32
    with pytest.raises(ValueError, match=f"image_size {image_size} is too small for two 9×9 convolutions"):
        CapsNet(1, False, image_size=image_size)


def test_the_loss_of_a_bf16_forward_is_computed_in_fp32():
    """Under autocast the capsule lengths and reconstructions come out in bf16; the three loss terms come
    back in fp32, equal to the loss of the same values cast up first, for both recipes."""
    from pipeline.models.capsnet import CapsNetOutput, capsnet_loss

    torch.manual_seed(0)
    images = torch.rand(2, 1, 28, 28)
    lengths, recon = torch.rand(2, 10), torch.rand(2, 1, 28, 28)
    output = CapsNetOutput(lengths.bfloat16(), torch.zeros(2, 10, 16, dtype=torch.bfloat16), recon.bfloat16())
    for recipe in ("paper", "official"):
        total, margin, sse = capsnet_loss(output, images, torch.tensor([3, 7]), recipe)
        assert (total.dtype, margin.dtype, sse.dtype) == (torch.float32,) * 3
        exact = capsnet_loss(CapsNetOutput(lengths.bfloat16().float(), None, recon.bfloat16().float()), images,
                             torch.tensor([3, 7]), recipe)
        assert torch.equal(total, exact[0])
