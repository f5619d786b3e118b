"""What every experiment gives the training loop (its ``Training``), and the inference they share.

An experiment (pipeline/experiments/: Table 1's shifted MNIST, §5.2's 40×40 canvas, MultiMNIST;
a variant's ``experiment`` key names it, pipeline.core.registry finds it) owns how a training
batch is drawn and augmented, the loss's targets and how the model is scored each epoch. The
loop (pipeline.training.train) sees only this protocol: it draws every random number through the
generator it passes in, one per seed, so stacked seeds draw exactly the streams separate runs
draw.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch


class Batch(NamedTuple):
    """One seed's inputs for one training step."""

    x: torch.Tensor  # (B, 1, S, S) float in [0, 1], augmented
    labels: torch.Tensor  # (B,) the class, or (B, T) every class present (MultiMNIST: T = 2)
    targets: torch.Tensor | None  # (B, T, 1, S, S) what the decoder reconstructs, each digit alone; None: x


class Experiment(Protocol):
    """Built once per training process from (cfg, data, device): the data lives on the device."""

    steps_per_epoch: int  # optimiser steps per epoch
    examples_per_epoch: int  # what an epoch draws from (the error message when a batch is larger)
    # True when `batch` takes its step as a device counter too and reads nothing back to the host, so
    # that train.cuda_graph can capture it (pipeline.training.steps); optional: without it (False), training
    # runs uncaptured, saying so
    capturable: bool

    def epoch_order(self, generator: torch.Generator) -> Any:
        """Draw what the epoch's batches follow (a permutation; None when every batch is fresh)."""

    def batch(self, order: Any, step: int | torch.Tensor, generator: torch.Generator) -> Batch:
        """Step ``step``'s batch of the epoch (an int, or a 0-d long device tensor: the captured
        step's counter), augmented with draws from ``generator``."""

    def test_error(self, model: torch.nn.Module, batch_size: int, amp: bool) -> float:
        """The per-epoch test error (%) of ``model``: the learning curve and early stopping read it."""


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W) -> float (B, 1, H, W) in [0, 1]."""
    return images.unsqueeze(1).float().div_(255)


def class_scores(out) -> torch.Tensor:
    """A model's class scores (B, K) in fp32: capsule lengths of a CapsNet, a CNN's logits."""
    return (out if torch.is_tensor(out) else out.lengths).float()


@torch.no_grad()
def predict(model: torch.nn.Module, images: torch.Tensor, batch_size: int, amp: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores and predictions for uint8 images (N, H, W) on the model's device.

    Returns scores (N, K) float32 (capsule lengths, or logits for the CNN) and predictions (N,).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    scores = []
    for start in range(0, images.shape[0], batch_size):
        x = to_float(images[start:start + batch_size].to(device))  # (b, 1, H, W)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            scores.append(class_scores(model(x)))  # (b, K)
    model.train(was_training)
    scores = torch.cat(scores)  # (N, K)
    return scores, scores.argmax(dim=1)
