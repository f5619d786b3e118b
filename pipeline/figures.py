"""Figures written by the stages (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def save_figure(fig: plt.Figure, path: str | Path) -> None:
    """Save atomically (temporary name, then rename) and close the figure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)


def affine_montage(originals: torch.Tensor, transformed: torch.Tensor, params: torch.Tensor,
                   path: str | Path) -> None:
    """Originals (top row) above their affine-shifted versions, with each transform's parameters."""
    n = originals.shape[0]
    fig, axes = plt.subplots(2, n, figsize=(1.1 * n, 2.8), squeeze=False)
    for k in range(n):
        rot, shear, sx, sy, tx, ty = params[k].tolist()
        for row, image in enumerate((originals[k], transformed[k])):
            ax = axes[row, k]
            ax.imshow(image.numpy(), cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[1, k].set_xlabel(f"{rot:+.0f}° k{shear:+.2f}\n×{sx:.2f},{sy:.2f}\n({tx:+.1f},{ty:+.1f})", fontsize=6)
    axes[0, 0].set_ylabel("MNIST", fontsize=8)
    axes[1, 0].set_ylabel("affine", fontsize=8)
    fig.suptitle("Affine-shifted test set (rotation, shear, scale x/y, translation)", fontsize=9)
    save_figure(fig, path)
