"""Image transforms the prepared sets and the training augmentations share.

- Affine (the affine-shifted and affNIST-style test sets): a random transform from affNIST's
  ranges (PAPER.md §5.2: rotation ±20°, shear ±0.2, per-axis scale 0.8–1.2), translated so that
  the digit stays inside the frame; warped with torch's affine_grid/grid_sample.
- Translation (`translate`): the one gather behind Table 1's ±2 px shifts, §5.2's placement on
  the 40×40 canvas and MultiMNIST's shifted digits, on the device without host synchronisation.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch
import torch.nn.functional as F

AFFINE_PARAM_NAMES = ("rotation_deg", "shear", "scale_x", "scale_y", "translate_x", "translate_y")


@dataclass(frozen=True)
class AffineRanges:
    max_rotation_deg: float = 20.0
    max_shear: float = 0.2
    min_scale: float = 0.8
    max_scale: float = 1.2


def _linear_part(params: torch.Tensor) -> torch.Tensor:
    """A = R(θ) · Shear(k) · Scale(sx, sy) in (x, y) pixel coordinates.  (N, 6) -> (N, 2, 2)"""
    theta = torch.deg2rad(params[:, 0])
    k, sx, sy = params[:, 1], params[:, 2], params[:, 3]
    cos, sin = torch.cos(theta), torch.sin(theta)
    rotation = torch.stack([cos, -sin, sin, cos], dim=1).view(-1, 2, 2)  # (N, 2, 2)
    shear = torch.stack([torch.ones_like(k), k, torch.zeros_like(k), torch.ones_like(k)], 1).view(-1, 2, 2)
    scale = torch.stack([sx, torch.zeros_like(sx), torch.zeros_like(sy), sy], dim=1).view(-1, 2, 2)
    return rotation @ shear @ scale  # (N, 2, 2)


def _bbox_corners(images: torch.Tensor) -> torch.Tensor:
    """Corners of each digit's ink bounding box, centred pixel coords.  (N, H, W) -> (N, 4, 2)"""
    n, h, w = images.shape
    ink = images > 0
    cols, rows = ink.any(dim=1), ink.any(dim=2)  # (N, W), (N, H)
    ar_w, ar_h = torch.arange(w), torch.arange(h)
    x0 = torch.where(cols, ar_w, w).min(1).values.clamp(max=w - 1).float()  # (N,)
    x1 = torch.where(cols, ar_w, -1).max(1).values.clamp(min=0).float() + 1
    y0 = torch.where(rows, ar_h, h).min(1).values.clamp(max=h - 1).float()
    y1 = torch.where(rows, ar_h, -1).max(1).values.clamp(min=0).float() + 1
    xs = torch.stack([x0, x1, x0, x1], 1) - w / 2  # (N, 4) edges, origin at the image centre
    ys = torch.stack([y0, y0, y1, y1], 1) - h / 2
    return torch.stack([xs, ys], dim=2)  # (N, 4, 2)


def translation_bounds(images: torch.Tensor, linear: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-axis translation range [lo, hi] (pixels) keeping each transformed digit in the frame.

    (N, H, W), (N, 2, 2) -> lo (N, 2), hi (N, 2). Where the transformed digit is wider than the
    frame, lo > hi and the caller centres it.
    """
    n, h, w = images.shape
    corners = _bbox_corners(images) @ linear.transpose(1, 2)  # (N, 4, 2) transformed corners
    half = torch.tensor([w / 2, h / 2])
    lo = -half - corners.min(dim=1).values  # (N, 2)
    hi = half - corners.max(dim=1).values  # (N, 2)
    return lo, hi


def sample_affine_params(images: torch.Tensor, ranges: AffineRanges, generator: torch.Generator) -> torch.Tensor:
    """Draw one affNIST-range transform per image.  (N, H, W) uint8 -> (N, 6) float32.

    Columns: AFFINE_PARAM_NAMES. Rotation, shear and per-axis scale are uniform in their ranges;
    the translation is uniform over the offsets that keep the digit's ink inside the frame.
    """
    n = images.shape[0]
    u = torch.rand(n, 6, generator=generator)  # (N, 6)
    params = torch.empty(n, 6)
    params[:, 0] = (2 * u[:, 0] - 1) * ranges.max_rotation_deg
    params[:, 1] = (2 * u[:, 1] - 1) * ranges.max_shear
    params[:, 2:4] = ranges.min_scale + u[:, 2:4] * (ranges.max_scale - ranges.min_scale)
    lo, hi = translation_bounds(images, _linear_part(params))  # (N, 2) each
    fits = lo <= hi
    params[:, 4:6] = torch.where(fits, lo + u[:, 4:6] * (hi - lo), (lo + hi) / 2)
    return params


def apply_affine(images: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Warp each image by its transform (bilinear, zero fill).  (N, H, W) uint8 -> (N, H, W) uint8.

    Forward map about the image centre c: x' = A (x − c) + c + t. grid_sample needs the inverse,
    in normalised coordinates (align_corners=False), where A is unchanged for square images and
    t becomes 2t/W.
    """
    n, h, w = images.shape
    if h != w:
        raise ValueError(f"apply_affine expects square images, got {h}×{w}")
    linear = _linear_part(params).double()  # (N, 2, 2)
    inverse = torch.linalg.inv(linear)  # (N, 2, 2)
    t_norm = params[:, 4:6].double() * 2 / w  # (N, 2)
    theta = torch.cat([inverse, -(inverse @ t_norm.unsqueeze(2))], dim=2).float()  # (N, 2, 3)
    grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)  # (N, H, W, 2)
    warped = F.grid_sample(images.unsqueeze(1).float(), grid, mode="bilinear", align_corners=False)  # (N, 1, H, W)
    return warped.squeeze(1).round().clamp(0, 255).to(torch.uint8)  # (N, H, W)


def ranges_metadata(ranges: AffineRanges, source: str) -> dict[str, str]:
    """Header metadata of a transformed test set: where it comes from and the ranges it was drawn from."""
    return {"source": source, "ranges": json.dumps(dataclasses.asdict(ranges))}


def make_affine_set(images: torch.Tensor, seed: int, ranges: AffineRanges) -> tuple[torch.Tensor, torch.Tensor]:
    """The affine-shifted copy of ``images`` and its transform parameters, deterministic in seed."""
    generator = torch.Generator().manual_seed(seed)
    params = sample_affine_params(images, ranges, generator)  # (N, 6)
    return apply_affine(images, params), params


def translate(images: torch.Tensor, offsets: torch.Tensor, size: int) -> torch.Tensor:
    """Draw each (H, W) image on a black size×size canvas with its top-left corner at offsets[b]
    = (dy, dx); offsets may be negative or reach past the edge (ink outside the canvas is cut).

    (B, H, W), (B, 2) integers on the same device -> (B, size, size), same dtype; one gather and a
    mask, no host synchronisation. The one mechanism behind ±2 px shifts (Table 1), placement on
    §5.2's 40×40 canvas and MultiMNIST's padded, shifted digits.
    """
    b, h, w = images.shape
    side = torch.arange(size, device=images.device).view(1, size)  # (1, size)
    rows = side - offsets[:, :1].long()  # (B, size) source row of each canvas row
    cols = side - offsets[:, 1:].long()  # (B, size)
    inside = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]  # (B, size, size)
    batch = torch.arange(b, device=images.device).view(b, 1, 1)  # (B, 1, 1)
    gathered = images[batch, rows.clamp(0, h - 1)[:, :, None], cols.clamp(0, w - 1)[:, None, :]]  # (B, size, size)
    return gathered * inside.to(images.dtype)


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by its own random (dy, dx) in [−max_shift, max_shift]², zero padding.

    (B, H, W) -> (B, H, W), same dtype and device; no host synchronisation.
    """
    if max_shift == 0:
        return images
    b, h, w = images.shape
    shift = torch.randint(-max_shift, max_shift + 1, (b, 2), generator=generator, device=images.device)  # (B, 2)
    return translate(images, shift, h)  # square MNIST digits
