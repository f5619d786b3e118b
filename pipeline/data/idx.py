"""MNIST's IDX files: decoded into uint8 tensors, with a clear error for a malformed file."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import torch

from pipeline.core.errors import UserError

IDX_UBYTE = 0x08
MNIST_SIZE = 28
SPLITS = {"train": "train", "test": "t10k"}


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
