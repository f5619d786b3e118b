"""Prepared splits: uint8 tensors in safetensors files, written atomically, read with a clear
error, described as MLflow dataset inputs; and MNIST's own train and test splits, decoded from
the raw files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from pipeline.core.errors import UserError
from pipeline.core.files import atomic_path
from pipeline.data.idx import read_split


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


def prepare_mnist(raw_dir: str | Path, out_dir: str | Path, *, train_subset: int, test_subset: int
                  ) -> dict[str, torch.Tensor]:
    """Decode MNIST's train and test splits into train/test.safetensors, every experiment's base.

    A subset size of 0 keeps the whole split; otherwise its first ``n`` digits (deterministic).
    Returns the tensors written (train_images, train_labels, test_images, test_labels), from which
    each experiment builds its own sets.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_images, train_labels = read_split(raw_dir, "train")
    test_images, test_labels = read_split(raw_dir, "test")
    if train_subset:
        train_images, train_labels = train_images[:train_subset], train_labels[:train_subset]
    if test_subset:
        test_images, test_labels = test_images[:test_subset], test_labels[:test_subset]
    save_split(out_dir / "train.safetensors", train_images, train_labels, {"source": _mnist_source("train", train_subset)})
    save_split(out_dir / "test.safetensors", test_images, test_labels, {"source": _mnist_source("test", test_subset)})
    return {"train_images": train_images, "train_labels": train_labels, "test_images": test_images,
            "test_labels": test_labels}


def _mnist_source(split: str, subset: int) -> str:
    return f"MNIST {split} set ({f'first {subset} digits' if subset else 'every digit'}, in file order)"
