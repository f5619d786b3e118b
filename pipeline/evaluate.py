"""Evaluation: test error on MNIST and on the affine-shifted set, per-class accuracy, confusion
matrix, per-image predictions, and for reconstruction variants the reconstructions and Fig. 4."""

from __future__ import annotations

import torch

from pipeline.capsnet import CapsNet
from pipeline.train import predict, to_float

FIG4_STEPS = torch.linspace(-0.25, 0.25, 11)  # Fig. 4: perturbations of 0.05 in [-0.25, 0.25]


def confusion_matrix(labels: torch.Tensor, preds: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(K, K) counts, rows = true class, columns = predicted class."""
    flat = labels.long() * num_classes + preds.long()  # (N,)
    return torch.bincount(flat, minlength=num_classes**2).view(num_classes, num_classes)


def error_pct(labels: torch.Tensor, preds: torch.Tensor) -> float:
    return 100.0 * (labels.long() != preds.long()).float().mean().item()


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
