"""Evaluation: test error on a model's clean and transformed test sets (MNIST and affine-shifted at
28×28; expanded MNIST and affNIST(-style) at 40×40), per-class accuracy, confusion matrices,
per-image predictions, accuracy by transform parameter bins, and for reconstruction variants the
reconstructions and Fig. 4."""

from __future__ import annotations

import torch

from pipeline.data.transforms import AFFINE_PARAM_NAMES
from pipeline.models.capsnet import CapsNet
from pipeline.training.train import predict, to_float

FIG4_STEPS = torch.linspace(-0.25, 0.25, 11)  # Fig. 4: perturbations of 0.05 in [-0.25, 0.25]


def confusion_matrix(labels: torch.Tensor, preds: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(K, K) counts, rows = true class, columns = predicted class."""
    flat = labels.long() * num_classes + preds.long()  # (N,)
    return torch.bincount(flat, minlength=num_classes**2).view(num_classes, num_classes)


def error_pct(labels: torch.Tensor, preds: torch.Tensor) -> float:
    n = labels.numel()
    return 100.0 * int((labels.long() != preds.long()).sum()) / n if n else float("nan")  # exact: a count over n


def evaluate_split(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   batch_size: int, num_classes: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """Metrics and compact predictions (labels uint8, preds uint8, scores float16) of one test set."""
    scores, preds = predict(model, images, batch_size)
    preds, scores = preds.cpu(), scores.cpu()
    cm = confusion_matrix(labels, preds, num_classes)
    per_class = (cm.diag().float() / cm.sum(dim=1).clamp(min=1)).tolist()
    metrics = {"error_pct": error_pct(labels, preds), "n": int(labels.shape[0]),
               "per_class_accuracy": {str(k): round(a, 6) for k, a in enumerate(per_class)},
               "confusion_matrix": cm.tolist()}
    arrays = {"labels": labels.to(torch.uint8), "preds": preds.to(torch.uint8), "scores": scores.half()}
    return metrics, arrays


def transform_spans(ranges: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The interval each binned transform parameter was drawn from (AffineRanges as a dict)."""
    rot, shear, lo, hi = ranges["max_rotation_deg"], ranges["max_shear"], ranges["min_scale"], ranges["max_scale"]
    return {"rotation_deg": (-rot, rot), "shear": (-shear, shear), "scale_x": (lo, hi), "scale_y": (lo, hi)}


def accuracy_by_bins(correct: torch.Tensor, params: torch.Tensor, ranges: dict[str, float],
                     n_bins: int = 8) -> dict[str, dict[str, list]]:
    """Accuracy (%) per equal-width bin of rotation, shear and per-axis scale.

    correct (N,) bool, params (N, 6) in AFFINE_PARAM_NAMES order. Per parameter: the bin edges,
    the image count and the accuracy of each bin (None where a bin is empty).
    """
    out = {}
    for name, (lo, hi) in transform_spans(ranges).items():
        column = params[:, AFFINE_PARAM_NAMES.index(name)].double()  # (N,)
        edges = torch.linspace(lo, hi, n_bins + 1, dtype=torch.float64)  # (n_bins + 1,)
        index = torch.bucketize(column, edges[1:-1])  # (N,) in [0, n_bins)
        count = torch.bincount(index, minlength=n_bins)  # (n_bins,)
        hits = torch.bincount(index, weights=correct.double(), minlength=n_bins)  # (n_bins,)
        out[name] = {"edges": [round(e, 6) for e in edges.tolist()], "count": count.tolist(),
                     "accuracy_pct": [100 * h / c if c else None for h, c in zip(hits.tolist(), count.tolist())]}
    return out


@torch.no_grad()
def reconstructions(model: CapsNet, images: torch.Tensor) -> torch.Tensor:
    """Decoder output from the predicted capsule (evaluation masking).  (N, H, W) uint8 -> (N, H, W) float."""
    model.eval()
    device = next(model.parameters()).device
    return model(to_float(images.to(device))).reconstructions.squeeze(1).float().cpu()


@torch.no_grad()
def fig4_grid(model: CapsNet, image: torch.Tensor) -> torch.Tensor:
    """Fig. 4: perturb each of the 16 dims of the winning capsule by FIG4_STEPS and decode.

    image (H, W) uint8 -> (16, len(FIG4_STEPS), H, W) float in [0, 1].
    """
    model.eval()
    device = next(model.parameters()).device
    out = model(to_float(image.unsqueeze(0).to(device)))
    winner = int(out.lengths.argmax())
    pose = out.poses[0]  # (K, D)
    dims, steps = pose.shape[1], FIG4_STEPS.to(device)
    perturbed = pose.expand(dims, len(steps), *pose.shape).clone()  # (D, S, K, D)
    perturbed[torch.arange(dims), :, winner, torch.arange(dims)] += steps  # one dim, one step each
    target = torch.full((dims * len(steps),), winner, device=device)
    decoded = model.decoder(perturbed.flatten(0, 1), target)  # (D·S, 1, H, W)
    return decoded.view(dims, len(steps), *decoded.shape[-2:]).float().cpu()
