"""The paper's CNNs layer by layer: each forward equals its docstring's layers written out by hand
from the module's own weights, and the baseline's dropout is inverted dropout drawn from the run's
generator. Parameter counts alone miss a dropped ReLU or an unscaled mask; these do not."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.models.baseline import DROPOUT, BaselineCNN, MultiMNISTCNN, PoolingCNN


def baseline_by_hand(model: BaselineCNN, x: torch.Tensor, pools: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Three 5×5 SAME convs with ReLU (2×2 max-pool after the first ``pools``), FC ReLU, FC ReLU,
    dropout (``keep``: the scaled mask, or none in evaluation), the output layer."""
    for k, conv in enumerate(model.convs):
        x = F.relu(F.conv2d(x, conv.weight, conv.bias, padding=2))
        if k < pools:
            x = F.max_pool2d(x, 2)
    x = F.relu(F.linear(x.flatten(1), model.fc1.weight, model.fc1.bias))
    x = F.relu(F.linear(x, model.fc2.weight, model.fc2.bias))
    if keep is not None:
        x = x * keep
    return F.linear(x, model.out.weight, model.out.bias)


@pytest.mark.parametrize("cls, image_size, pools", [(BaselineCNN, 28, 0), (PoolingCNN, 40, 2)])
def test_the_cnns_compute_their_layers_as_written(cls, image_size, pools):
    """Table 1's baseline (§5) and §5.2's pooling CNN, in evaluation (dropout off) and in training
    with a mask from `dropout_keep`: the module's output is the hand-written composition."""
    torch.manual_seed(0)
    model = cls(image_size=image_size, num_classes=7)
    x = torch.rand(3, 1, image_size, image_size)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), baseline_by_hand(model, x, pools))
        keep = model.dropout_keep(3, torch.Generator().manual_seed(1))
        torch.testing.assert_close(model.train()(x, keep), baseline_by_hand(model, x, pools, keep))


def test_the_multimnist_cnn_computes_the_official_layers_as_written():
    """§6's baseline as conv_model.py builds it: conv 5×5 512, ReLU, 2×2 max-pool, conv 5×5 256, ReLU,
    2×2 max-pool, FC 1024 ReLU, a linear output."""
    torch.manual_seed(0)
    model = MultiMNISTCNN(36, num_classes=7)
    x = torch.rand(2, 1, 36, 36)
    h = F.max_pool2d(F.relu(F.conv2d(x, model.conv1.weight, model.conv1.bias, padding=2)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, model.conv2.weight, model.conv2.bias, padding=2)), 2)
    h = F.relu(F.linear(h.flatten(1), model.fc1.weight, model.fc1.bias))
    with torch.no_grad():
        torch.testing.assert_close(model(x), F.linear(h, model.out.weight, model.out.bias))


def test_dropout_masks_are_inverted_dropout_from_the_runs_generator():
    """0 with probability p, else 1 / (1 − p), so a unit's expected output is unchanged (what nn.Dropout
    does, and what evaluation without dropout assumes); the same generator state draws the same mask."""
    model = BaselineCNN(num_classes=3)
    keep = model.dropout_keep(2048, torch.Generator().manual_seed(0))  # (2048, 192)
    assert keep.shape == (2048, model.out.in_features)
    assert set(keep.unique().tolist()) == {0.0, 1 / (1 - DROPOUT)}
    assert abs((keep == 0).float().mean().item() - DROPOUT) < 0.01  # 393k draws: σ ≈ 0.0008
    assert abs(keep.mean().item() - 1) < 0.02
    assert torch.equal(keep, model.dropout_keep(2048, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("cls", [BaselineCNN, PoolingCNN])
def test_a_cnn_drops_at_the_rate_it_is_given(cls):
    """A dropout rate other than the default reaches the layer and the masks a run draws."""
    model = cls(num_classes=3, dropout=0.25)
    keep = model.dropout_keep(4096, torch.Generator().manual_seed(0))  # (4096, 192)
    assert model.dropout.p == 0.25 and keep.unique().tolist() == pytest.approx([0.0, 1 / 0.75])
    assert abs((keep == 0).float().mean().item() - 0.25) < 0.01  # 786k draws: σ ≈ 0.0005


def test_the_multimnist_cnn_pools_as_same_padding_does_where_a_pool_does_not_halve_evenly():
    """At 33×33 each 2×2 max-pool rounds up, as conv_model.py's SAME pooling does (33 → 17 → 9), and
    the first FC takes that size; at 36 (MultiMNIST's) rounding never shows."""
    torch.manual_seed(0)
    model = MultiMNISTCNN(33, num_classes=7)
    x = torch.rand(2, 1, 33, 33)
    h = F.max_pool2d(F.relu(F.conv2d(x, model.conv1.weight, model.conv1.bias, padding=2)), 2, ceil_mode=True)
    h = F.max_pool2d(F.relu(F.conv2d(h, model.conv2.weight, model.conv2.bias, padding=2)), 2, ceil_mode=True)
    assert h.shape[-2:] == (9, 9) and model.fc1.in_features == 256 * 9 * 9
    h = F.relu(F.linear(h.flatten(1), model.fc1.weight, model.fc1.bias))
    with torch.no_grad():
        torch.testing.assert_close(model(x), F.linear(h, model.out.weight, model.out.bias))
