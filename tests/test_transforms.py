"""The transforms (pipeline/data/transforms.py): the affine-shifted test set's draws (their ranges,
uniformity and independence, the translation that keeps the ink inside), the warp (R·Shear·Scale,
bilinear, rounded), and training's random shift of up to a few pixels with zero padding."""

import math

import pytest
import torch

from conftest import synthetic_digits
from pipeline.data.transforms import (AffineRanges, _linear_part, apply_affine, make_affine_set, random_shift,
                                      sample_affine_params, translation_bounds)


RANGES = AffineRanges()


def test_affine_set_is_deterministic_in_its_seed():
    images, _ = synthetic_digits(30)
    a, pa = make_affine_set(images, 7, RANGES)
    b, pb = make_affine_set(images, 7, RANGES)
    c, _ = make_affine_set(images, 8, RANGES)
    assert a.numpy().tobytes() == b.numpy().tobytes() and torch.equal(pa, pb)
    assert a.numpy().tobytes() != c.numpy().tobytes()


def test_affine_parameters_within_ranges_and_digit_stays_inside():
    images, _ = synthetic_digits(200)
    _, params = make_affine_set(images, 3, RANGES)
    assert params[:, 0].abs().max() <= 20 and params[:, 1].abs().max() <= 0.2
    assert params[:, 2:4].min() >= 0.8 and params[:, 2:4].max() <= 1.2
    lo, hi = translation_bounds(images, _linear_part(params))
    assert (lo <= hi).all()  # small stand-in digits always fit
    assert ((params[:, 4:6] >= lo - 1e-5) & (params[:, 4:6] <= hi + 1e-5)).all()
    assert params[:, 0].std() > 5  # spread over the range, not constant


def test_affine_parameters_are_uniform_over_their_ranges_and_independent():
    """Rotation and shear uniform over ±max (both signs, mean 0), each axis's scale drawn on its own
    over [min, max], the translation uniform between the bounds that keep the ink inside: 2,000
    draws, each statistic several standard errors from what a one-sided, shared or pinned draw gives."""
    images, _ = synthetic_digits(2000)
    _, params = make_affine_set(images, 5, RANGES)
    for column, top in ((0, 20.0), (1, 0.2)):  # rotation, shear: U(−top, top) has mean 0, sd top/√3
        values = params[:, column]
        assert values.min() < -0.9 * top and values.max() > 0.9 * top
        assert abs(values.mean().item()) < 0.1 * top  # SE ≈ 0.013·top
    scale_x, scale_y = params[:, 2], params[:, 3]
    for scale in (scale_x, scale_y):
        assert scale.min() < 0.82 and scale.max() > 1.18 and abs(scale.mean().item() - 1.0) < 0.02
    assert abs(torch.corrcoef(torch.stack([scale_x, scale_y]))[0, 1].item()) < 0.1  # SE ≈ 0.022
    lo, hi = translation_bounds(images, _linear_part(params))
    where = (params[:, 4:6] - lo) / (hi - lo)  # (N, 2) the translation's place between its bounds
    assert abs(where.mean().item() - 0.5) < 0.03 and abs(where.var().item() - 1 / 12) < 0.01  # U(0, 1)


def test_the_six_affine_draws_are_independent_of_one_another():
    """Rotation, shear, each axis's scale and the translation's place between its bounds on each axis
    come from six draws: over 2,000 images no two of them correlate (a shared draw correlates fully)."""
    images, _ = synthetic_digits(2000)
    _, params = make_affine_set(images, 5, RANGES)
    lo, hi = translation_bounds(images, _linear_part(params))
    draws = torch.cat([params[:, :4], (params[:, 4:6] - lo) / (hi - lo)], dim=1)  # (N, 6)
    r = torch.corrcoef(draws.T)  # (6, 6)
    assert (r - torch.eye(6)).abs().max() < 0.1  # SE ≈ 0.022


def test_the_linear_part_is_rotation_then_shear_then_scale_and_a_digit_too_big_to_fit_is_centred():
    """A = R(θ)·Shear(k)·Scale(sx, sy) with Shear = [[1, k], [0, 1]], as the docstring writes it
    (worked by hand); a digit whose transformed ink is wider than the frame on an axis is centred on
    it, not pushed to one side."""
    c, s = math.cos(math.radians(30)), math.sin(math.radians(30))
    shear_scale = torch.tensor([[1.2, 0.2 * 0.8], [0.0, 0.8]])  # [[1, k], [0, 1]] @ diag(sx, sy)
    expected = torch.tensor([[c, -s], [s, c]]) @ shear_scale
    torch.testing.assert_close(_linear_part(torch.tensor([[30.0, 0.2, 1.2, 0.8, 0.0, 0.0]]))[0], expected)
    full = torch.full((64, 28, 28), 255, dtype=torch.uint8)  # ink to every edge: any growth leaves the frame
    params = sample_affine_params(full, RANGES, torch.Generator().manual_seed(0))
    lo, hi = translation_bounds(full, _linear_part(params))
    unfit = lo > hi  # (N, 2)
    assert unfit.any() and torch.equal(params[:, 4:6][unfit], ((lo + hi) / 2)[unfit])


def test_a_warp_rounds_to_the_nearest_grey_level_and_takes_square_images_only():
    """Bilinear weights of a quarter-pixel shift: a 255 column beside zeros becomes 191.25 and 63.75,
    stored as 191 and 64 (rounded, not truncated to 63). A non-square image is refused."""
    image = torch.zeros(1, 28, 28, dtype=torch.uint8)
    image[0, :, 10] = 255
    shifted = apply_affine(image, torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.25, 0.0]]))  # a quarter pixel right
    assert shifted[0, 14, 9:13].tolist() == [0, 191, 64, 0]
    with pytest.raises(ValueError, match="square images, got 28×20"):
        apply_affine(torch.zeros(1, 28, 20, dtype=torch.uint8), torch.zeros(1, 6))


def test_apply_affine_identity_and_pure_translation():
    images, _ = synthetic_digits(4)
    identity = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0, 0.0]]).repeat(4, 1)
    assert torch.equal(apply_affine(images, identity), images)
    shift = identity.clone()
    shift[:, 4] = 2.0  # two pixels right
    expected = torch.zeros_like(images)
    expected[:, :, 2:] = images[:, :, :-2]
    assert torch.equal(apply_affine(images, shift), expected)


def test_apply_affine_rotation_direction():
    image = torch.zeros(1, 28, 28, dtype=torch.uint8)
    image[0, 14, 20] = 255  # a dot right of the centre (x = 20.5 - 14 = +6.5)
    params = torch.tensor([[90.0, 0.0, 1.0, 1.0, 0.0, 0.0]])
    out = apply_affine(image, params)
    y, x = divmod(int(out.flatten().argmax()), 28)
    # x' = R(90°)(x, y): (+6.5, +0.5) -> (-0.5, +6.5): pixel row 20, column 13
    assert (y, x) == (20, 13)


def test_random_shift_moves_at_most_max_shift_and_keeps_range():
    images = torch.zeros(64, 28, 28, dtype=torch.uint8)
    images[:, 14, 14] = 200
    out = random_shift(images, 2, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert out.max() == 200 and out.min() == 0
    assert torch.equal(out.flatten(1).sum(1), images.flatten(1).sum(1))  # nothing lost in the middle
    ys, xs = [], []
    for img in out:
        y, x = divmod(int(img.flatten().argmax()), 28)
        ys.append(y - 14)
        xs.append(x - 14)
    assert max(map(abs, ys + xs)) <= 2 and len(set(zip(ys, xs))) > 10
    assert torch.equal(random_shift(images, 0, torch.Generator()), images)


def test_random_shift_zero_pads_at_the_border():
    images = torch.full((32, 4, 4), 9, dtype=torch.uint8)
    out = random_shift(images, 1, torch.Generator().manual_seed(1))
    sums = out.flatten(1).sum(1).tolist()
    assert set(sums) <= {9 * 16, 9 * 12, 9 * 9} and len(set(sums)) > 1
