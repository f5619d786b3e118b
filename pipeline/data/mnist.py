"""MNIST IDX decoding, the affine-shifted test set, and the on-device shift augmentation.

Stage `prepare` turns the four IDX files into compact uint8 tensors (safetensors) and builds
the affine-shifted test set: every test digit under one random affine transform drawn from
affNIST's ranges (PAPER.md §5.2: rotation ±20°, shear ±0.2, per-axis scale 0.8–1.2), translated
so that the digit stays inside the frame. Warping uses torch's affine_grid/grid_sample.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from pipeline.core.errors import UserError
from pipeline.training.experiment import Batch, predict, to_float
from pipeline.core.files import atomic_path

IDX_UBYTE = 0x08
MNIST_SIZE = 28
MULTIMNIST_SIZE = 36  # MultiMNIST's canvas (§6): each 28×28 digit padded by 4 (pipeline.experiments.multimnist)
SPLITS = {"train": "train", "test": "t10k"}
AFFINE_PARAM_NAMES = ("rotation_deg", "shear", "scale_x", "scale_y", "translate_x", "translate_y")


class IdxError(UserError, ValueError):
    """An IDX file is malformed; the message names the file and the problem."""


def read_idx(path: str | Path, expected_ndim: int) -> torch.Tensor:
    """Decode an uncompressed IDX file of unsigned bytes into a uint8 tensor.

    Checks the magic number (0x0000 08 ndim), the dimensions against the payload size, and
    rejects truncated or over-long files.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 4:
        raise IdxError(f"{path.name}: only {len(data)} bytes, too short for an IDX header")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != IDX_UBYTE or ndim != expected_ndim:
        raise IdxError(
            f"{path.name}: bad magic number 0x{data[:4].hex()} "
            f"(expected 0x000008{expected_ndim:02x}: unsigned bytes, {expected_ndim} dimensions)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IdxError(f"{path.name}: truncated header ({len(data)} bytes, need {header})")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    payload = math.prod(dims)
    if len(data) - header != payload:
        kind = "truncated" if len(data) - header < payload else "longer than its header says"
        raise IdxError(
            f"{path.name}: {kind}: header says {dims} = {payload} bytes, file holds {len(data) - header}"
        )
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(dims)


def read_split(raw_dir: str | Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, H, W) uint8 and labels (N,) uint8 of one MNIST split, with matching counts."""
    prefix = SPLITS[split]
    raw_dir = Path(raw_dir)
    images = read_idx(raw_dir / f"{prefix}-images-idx3-ubyte", 3)  # (N, H, W)
    labels = read_idx(raw_dir / f"{prefix}-labels-idx1-ubyte", 1)  # (N,)
    if images.shape[0] != labels.shape[0]:
        raise IdxError(
            f"{prefix}: {images.shape[0]} images but {labels.shape[0]} labels; the files do not belong together"
        )
    if int(labels.max()) > 9:
        raise IdxError(f"{prefix}-labels-idx1-ubyte: label {int(labels.max())} is not a digit 0-9")
    return images, labels


# --- the affine-shifted test set --------------------------------------------------------------


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


# --- prepared tensors ---------------------------------------------------------------------------


def save_split(path: Path, images: torch.Tensor, labels: torch.Tensor, metadata: dict[str, str] | None = None,
               **extra: torch.Tensor) -> None:
    """Write one split atomically (temporary name, then rename); ``metadata`` is stored in its header."""
    tensors = {"images": images.contiguous(), "labels": labels.contiguous(), **{k: t.contiguous() for k, t in extra.items()}}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def load_split(path: str | Path) -> dict[str, torch.Tensor]:
    """images (N, H, W) uint8, labels (N,) uint8 and, for the affine set, affine_params (N, 6)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} not found; build it with `dvc repro prepare`")
    try:
        tensors = load_file(str(path))
    except (OSError, SafetensorError) as err:
        raise UserError(f"{path} is truncated or corrupt ({err}); rebuild it with `dvc repro -f prepare`") from err
    if "images" not in tensors or "labels" not in tensors or len(tensors["images"]) != len(tensors["labels"]):
        raise UserError(f"{path} is not a prepared split (images and labels of one length); "
                        "rebuild it with `dvc repro -f prepare`")
    return tensors


def split_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata a split was saved with (source and transform ranges of a test set)."""
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


def dataset_input(path: str | Path, tensors: dict[str, torch.Tensor], context: str) -> dict:
    """The prepared split at ``path``, as `load_split` loaded it (``tensors``; a stage hashes what it
    already holds instead of reading the file again), as a run's dataset input (MLflow's Dataset
    column; `tracking`): the file's stem as its name, a digest of its tensors (SHA-256 over each
    tensor's name, shape and bytes, in name order; the first 16 hex digits), its path, its size and
    source (from the file's header), and what the run used it for (``context``: training, testing,
    evaluation)."""
    path = Path(path)
    meta = split_metadata(path)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(torch.uint8).numpy())
    return {"name": path.stem, "digest": digest.hexdigest()[:16], "source": str(path), "context": context,
            "profile": {"num_rows": int(tensors["labels"].shape[0]), "source": meta.get("source", path.stem)}}


def test_sets(image_size: int) -> tuple[str, str]:
    """The (clean, transformed) test sets a model of this input size is evaluated on: MNIST and the
    affine-shifted set at 28×28 (Table 1); expanded MNIST and affNIST(-style) at 40×40 (§5.2);
    MultiMNIST's test recipes at 36×36 (§6), which have no transformed twin ("")."""
    if image_size == MULTIMNIST_SIZE:
        return "multimnist_test", ""
    return ("test", "affine_test") if image_size == MNIST_SIZE else ("expanded_test", "affnist_test")


def prepare(raw_dir: str | Path, out_dir: str | Path, *, train_subset: int, test_subset: int,
            affine_seed: int, ranges: AffineRanges) -> dict[str, torch.Tensor]:
    """Decode MNIST and build the affine-shifted test set; writes train/test/affine_test.safetensors.

    A subset size of 0 keeps the whole split; otherwise its first ``n`` digits (deterministic).
    Returns the tensors written, for the montage and for tests.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_images, train_labels = read_split(raw_dir, "train")
    test_images, test_labels = read_split(raw_dir, "test")
    if train_subset:
        train_images, train_labels = train_images[:train_subset], train_labels[:train_subset]
    if test_subset:
        test_images, test_labels = test_images[:test_subset], test_labels[:test_subset]
    affine_images, affine_params = make_affine_set(test_images, affine_seed, ranges)
    save_split(out_dir / "train.safetensors", train_images, train_labels, {"source": _mnist_source("train", train_subset)})
    save_split(out_dir / "test.safetensors", test_images, test_labels, {"source": _mnist_source("test", test_subset)})
    save_split(out_dir / "affine_test.safetensors", affine_images, test_labels, ranges_metadata(
        ranges, f"affine-shifted MNIST test set (generated, seed {affine_seed})"), affine_params=affine_params)
    return {"test_images": test_images, "test_labels": test_labels, "affine_images": affine_images,
            "affine_params": affine_params}


def _mnist_source(split: str, subset: int) -> str:
    return f"MNIST {split} set ({f'first {subset} digits' if subset else 'every digit'}, in file order)"


# --- training-time augmentation ----------------------------------------------------------------


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


# --- the Table 1 experiment ----------------------------------------------------------------------


class ShiftedMnist:
    """Table 1's training (pipeline.training.experiment.Experiment): every epoch a fresh permutation of the
    training digits (the last partial batch dropped), every step a batch shifted by up to
    ±max_shift px with zero fill; scored each epoch by the error on the clean test set.
    ``cfg`` is a pipeline.training.train.RunConfig."""

    def __init__(self, cfg, data: dict[str, torch.Tensor], device: torch.device):
        self.images = data["train_images"].to(device)  # (N, 28, 28) uint8
        self.labels = data["train_labels"].to(device).long()  # (N,)
        self.test_images = data["test_images"].to(device)  # (M, S, S) uint8, copied once per process
        self.test_labels = data["test_labels"].to(device).long()  # (M,)
        self.batch_size, self.max_shift, self.image_size = cfg.batch_size, cfg.max_shift, cfg.image_size
        self.examples_per_epoch = self.images.shape[0]
        self.steps_per_epoch = self.examples_per_epoch // cfg.batch_size

    def epoch_order(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(self.images.shape[0], generator=generator, device=self.images.device)  # (N,)

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """(B, 28, 28) uint8 -> (B, S, S): Table 1's ±max_shift px shift."""
        return random_shift(images, self.max_shift, generator)

    def batch(self, order: torch.Tensor, step: int, generator: torch.Generator) -> Batch:
        idx = order[step * self.batch_size:(step + 1) * self.batch_size]  # (B,)
        return Batch(to_float(self.augment(self.images[idx], generator)), self.labels[idx], None)

    def test_error(self, model: torch.nn.Module, batch_size: int, amp: bool) -> float:
        _, preds = predict(model, self.test_images, batch_size, amp)  # (M,)
        return 100.0 * int((preds != self.test_labels).sum()) / self.test_labels.shape[0]  # exact count, one sync
