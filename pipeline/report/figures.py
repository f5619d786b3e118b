"""Figures written by the stages (matplotlib, headless Agg backend)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from pipeline.core.files import atomic_path  # noqa: E402


def save_figure(fig: plt.Figure, path: str | Path) -> None:
    """Save atomically (temporary name, then rename) and close the figure."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def affine_montage(originals: torch.Tensor, transformed: torch.Tensor, params: torch.Tensor | None,
                   path: str | Path, *, labels: tuple[str, str] = ("MNIST", "affine"),
                   title: str = "Affine-shifted test set (rotation, shear, scale x/y, translation)") -> None:
    """Originals (top row) above their transformed versions, with each transform's parameters if known."""
    n = originals.shape[0]
    fig, axes = plt.subplots(2, n, figsize=(1.1 * n, 2.8), squeeze=False)
    for k in range(n):
        for row, image in enumerate((originals[k], transformed[k])):
            ax = axes[row, k]
            ax.imshow(image.numpy(), cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
        if params is not None:
            rot, shear, sx, sy, tx, ty = params[k].tolist()
            axes[1, k].set_xlabel(f"{rot:+.0f}° k{shear:+.2f}\n×{sx:.2f},{sy:.2f}\n({tx:+.1f},{ty:+.1f})", fontsize=6)
    axes[0, 0].set_ylabel(labels[0], fontsize=8)
    axes[1, 0].set_ylabel(labels[1], fontsize=8)
    fig.suptitle(title, fontsize=9)
    save_figure(fig, path)


def learning_curves(history: list[dict], title: str, path: str | Path) -> None:
    """Test error and training loss per epoch."""
    epochs = [h["epoch"] for h in history]
    fig, (ax_err, ax_loss) = plt.subplots(1, 2, figsize=(9, 3.2))
    ax_err.plot(epochs, [h["test_error_pct"] for h in history], marker=".")
    ax_err.set(xlabel="epoch", ylabel="test error (%)", title="test error")
    ax_loss.plot(epochs, [h["train_loss"] for h in history], marker=".")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="training loss", yscale="log")
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def confusion(panels: list[tuple[list[list[int]], str]], title: str, path: str | Path) -> None:
    """Confusion matrices side by side, one panel per (matrix, test-set name); rows = true class."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False)
    for ax, (cm, name) in zip(axes[0], panels):
        image = ax.imshow(cm, cmap="Blues")
        k = len(cm)
        ax.set(xticks=range(k), yticks=range(k), xlabel="predicted", ylabel="true", title=name)
        for i in range(k):
            for j in range(k):
                if cm[i][j]:
                    ax.text(j, i, cm[i][j], ha="center", va="center", fontsize=6,
                            color="white" if cm[i][j] > max(map(max, cm)) / 2 else "black")
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def image_grid(rows: list[torch.Tensor], row_labels: list[str], title: str, path: str | Path,
               col_labels: list[str] | None = None, gap: int = 2) -> None:
    """Rows of equally many (H, W) images in [0, 1] or uint8, tiled into one image (one axes, not
    one per image: 200 axes took 8 s of every reconstruction variant's evaluation on 2 cores),
    ``gap`` grey pixels apart; row labels at the left, column labels below."""
    n_rows, n_cols = len(rows), rows[0].shape[0]
    h, w = rows[0].shape[-2:]
    canvas = torch.full((n_rows * (h + gap) - gap, n_cols * (w + gap) - gap), 0.5)
    for r, row in enumerate(rows):
        row = row.float() / 255 if row.dtype == torch.uint8 else row.float()
        for c in range(n_cols):
            canvas[r * (h + gap):r * (h + gap) + h, c * (w + gap):c * (w + gap) + w] = row[c].detach().cpu()
    fig, ax = plt.subplots(figsize=(0.8 * n_cols, 0.85 * n_rows))
    ax.imshow(canvas.numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_yticks([r * (h + gap) + h / 2 - 0.5 for r in range(n_rows)], row_labels, fontsize=6)
    ax.set_xticks([c * (w + gap) + w / 2 - 0.5 for c in range(n_cols)] if col_labels else [],
                  col_labels or [], fontsize=6)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=9)  # on the axes: a figure title would float above the tiles' aspect
    save_figure(fig, path)


def seed_errors(variants: list[str], per_seed: list[list[float]], intervals: list[tuple[float, float]],
                paper: list[float], paper_std: list[float], path: str | Path) -> None:
    """Every seed's test error as a dot per variant, our mean with its 95 % t-interval over seeds
    (the spread the verdicts come from), and the paper's mean ± its σ over 3 trials."""
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for k, (errors, (lo, hi)) in enumerate(zip(per_seed, intervals)):
        mean = sum(errors) / len(errors)
        ax.scatter([k - 0.12] * len(errors), errors, color="#4c72b0", s=14, alpha=0.8, zorder=3,
                   label="ours, each seed" if k == 0 else None)
        yerr = None if lo != lo else [[mean - lo], [hi - mean]]  # NaN: one seed, no interval
        ax.errorbar([k - 0.12], [mean], yerr=yerr, fmt="_", color="#1b365d", markersize=14, capsize=4, zorder=4,
                    label="ours, mean and 95 % interval over seeds" if k == 0 else None)
    has_std = [s == s for s in paper_std]
    ax.errorbar([k + 0.12 for k in range(len(paper))], paper, yerr=[s if ok else 0 for s, ok in zip(paper_std, has_std)],
                fmt="D", color="#dd4444", markersize=5, capsize=4, zorder=4, label="paper (Table 1), mean ± σ")
    ax.set_xticks(range(len(variants)), variants, rotation=20, fontsize=8)
    ax.set_ylabel("MNIST test error (%)")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def effect_intervals(effects: list[str], ours: list[float], intervals: list[tuple[float, float]], paper: list[float],
                     notes: list[str], path: str | Path) -> None:
    """The ablation effects as a forest plot, one row each: our estimate with its 95 % seed-aware
    interval (a grey dot where there is none), the paper's effect where it states one, 0 dashed, and
    beside each row its note (what would settle it)."""
    n = len(effects)
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * n + 1.0))
    for k, (estimate, (lo, hi), theirs) in enumerate(zip(ours, intervals, paper)):
        y = n - 1 - k  # the first effect on top
        known = lo == lo  # NaN: confounded, no interval
        ax.errorbar([estimate], [y], xerr=[[estimate - lo], [hi - estimate]] if known else None, fmt="o",
                    color="#1b365d" if known else "#999999", markersize=5, capsize=3, zorder=3,
                    label=None if k else "ours, 95 % seed-aware interval")
        if theirs == theirs:
            ax.plot([theirs], [y], "D", color="#dd4444", markersize=5, zorder=4,
                    label="paper (Table 1)" if not any(p == p for p in paper[:k]) else None)
    if any(lo != lo for lo, _ in intervals):  # a legend entry only where a row shows it
        ax.plot([], [], "o", color="#999999", markersize=5, label="ours, no interval (confounded)")
    ax.axvline(0, color="grey", linewidth=0.8, linestyle="--", zorder=1)
    ax.set_yticks(range(n), effects[::-1], fontsize=7)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("error(A) − error(B), percentage points (negative: A errs less)", fontsize=8)
    for k, note in enumerate(notes):
        ax.annotate(note, xy=(1.01, n - 1 - k), xycoords=("axes fraction", "data"), va="center", fontsize=6.5)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3, frameon=False)
    save_figure(fig, path)


def line_colours(n: int) -> list:
    """n distinct colours: tab10 up to 10 lines, tab20 up to 20, then evenly spaced hues."""
    if n <= 10:
        return [plt.get_cmap("tab10")(k) for k in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(k) for k in range(n)]
    return [plt.get_cmap("hsv")(k / n) for k in range(n)]


LINE_STYLES = ("-", "--", ":", "-.")  # a variant's several lines in one panel: its colour, another dash


def learning_curve_panels(panels: dict[str, dict[str, list[tuple[list[int], list[float]]]]],
                          lr: dict[str, tuple[list[int], list[float]]], path: str | Path) -> None:
    """One panel per test set and protocol (its own y axis; a title's second line, the protocol, wrapped),
    one colour per variant in every panel, then the learning rate; one row of up to four panels, else
    rows of three.

    panels: panel title -> line label (the variant, then " (…)" where it has several lines) -> per seed
    (epochs, test error %): the mean over seeds is the line, the band spans the seeds. lr: schedule
    label -> (epochs, lr at the end of each epoch).
    """
    from matplotlib.ticker import FormatStrFormatter

    variants = list(dict.fromkeys(label.split(" (")[0] for curves in panels.values() for label in curves))
    colour_of = dict(zip(variants, line_colours(len(variants))))
    n = len(panels) + 1
    cols = n if n <= 4 else 3
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.4 * cols, 4.0 * rows), squeeze=False, layout="constrained")
    flat = list(axes.flat)
    for ax, (title, curves) in zip(flat, panels.items()):
        lines_of: dict[str, int] = {}
        for label, seeds in curves.items():
            variant = label.split(" (")[0]
            style = LINE_STYLES[lines_of.setdefault(variant, 0) % len(LINE_STYLES)]
            lines_of[variant] += 1
            by_epoch: dict[int, list[float]] = {}  # early-stopped seeds end sooner: each epoch over the seeds that ran it
            for epochs, errors in seeds:
                for epoch, error in zip(epochs, errors):
                    by_epoch.setdefault(epoch, []).append(error)
            epochs = sorted(by_epoch)
            ax.plot(epochs, [sum(by_epoch[e]) / len(by_epoch[e]) for e in epochs], color=colour_of[variant],
                    linestyle=style, label=f"{label} (n={len(seeds)})")
            if len(seeds) > 1:
                ax.fill_between(epochs, [min(by_epoch[e]) for e in epochs], [max(by_epoch[e]) for e in epochs],
                                color=colour_of[variant], alpha=0.15, linewidth=0)
        head, _, protocol = title.partition("\n")
        ax.set_title("\n".join([head, *textwrap.wrap(protocol, 64)]), fontsize=9 if protocol else 10)
        ax.set(xlabel="epoch", ylabel="test error (%)", yscale="log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.tick_params(axis="y", which="minor", labelsize=6)
        ax.legend(fontsize=6, ncol=1 if len(curves) <= 6 else 2)
    ax = flat[n - 1]
    for colour, (label, (epochs, rates)) in zip(line_colours(len(lr)), lr.items()):
        ax.plot(epochs, rates, color=colour, label="\n".join(textwrap.wrap(label, 60)))
    ax.set(xlabel="epoch", ylabel="learning rate (end of epoch)", yscale="log", title="learning-rate schedule")
    ax.legend(fontsize=6, loc="lower left")
    for ax in flat[n:]:
        ax.axis("off")
    fig.suptitle("Learning curves: mean over seeds (line) and the seeds' range (band)", fontsize=10)
    save_figure(fig, path)


BIN_LABELS = {"rotation_deg": "rotation (°)", "shear": "shear", "scale_x": "scale x", "scale_y": "scale y"}


def accuracy_by_transform(models: dict[str, dict[str, dict]], title: str, path: str | Path) -> None:
    """Accuracy per transform-parameter bin, one panel per parameter, one line per model.

    models: name -> parameter -> {"centres": [...], "accuracy_pct": [...], "std": [...]}.
    """
    names = list(BIN_LABELS)
    if not models:  # the real affNIST carries no transform parameters in our loader
        fig, ax = plt.subplots(figsize=(6, 1.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No transform parameters for this test set (real affNIST): no breakdown.", ha="center")
        save_figure(fig, path)
        return
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), sharey=True)
    for k, (model, bins) in enumerate(models.items()):
        for ax, name in zip(axes, names):
            b = bins[name]
            ax.errorbar(b["centres"], b["accuracy_pct"], yerr=b["std"], color=f"C{k}", marker="o", capsize=3,
                        label=model)
            ax.set(xlabel=BIN_LABELS[name])
    axes[0].set_ylabel("accuracy (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def placeholder(text: str, path: str | Path) -> None:
    """A figure that says why there is nothing to plot (the report stage declares every figure)."""
    fig, ax = plt.subplots(figsize=(5, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    save_figure(fig, path)


def multimnist_reconstructions(inputs: torch.Tensor, recons: torch.Tensor, titles: list[str], title: str,
                               path: str | Path) -> None:
    """Fig. 5 style: per example the input (top) and, below, the reconstructions from the two
    predicted capsules drawn in red and green over the input in grey.
    inputs (k, H, W) uint8, recons (k, 2, H, W) in [0, 1]."""
    k = inputs.shape[0]
    fig, axes = plt.subplots(2, k, figsize=(1.25 * k, 2.9), squeeze=False)
    for n in range(k):
        grey = inputs[n].float() / 255  # (H, W)
        overlay = torch.stack([torch.maximum(0.35 * grey, recons[n, 0]), torch.maximum(0.35 * grey, recons[n, 1]),
                               0.35 * grey], dim=-1)  # (H, W, 3)
        axes[0, n].imshow(grey.numpy(), cmap="gray", vmin=0, vmax=1)
        axes[1, n].imshow(overlay.clamp(0, 1).numpy())
        axes[0, n].set_title(titles[n], fontsize=7)
        for ax in axes[:, n]:
            ax.axis("off")
    fig.suptitle(title, fontsize=9, y=1.08)
    save_figure(fig, path)
