"""The paper's CNNs: the Table 1 baseline (§5) and §5.2's conventional CNN with max-pooling.

BaselineCNN (§5): three 5×5 convs (256, 256, 128), FC 328, FC 192, dropout, 10-way softmax.

35,445,522 parameters at 28×28 with 10 classes — PAPER.md's 35.4M, which holds when the convs
use SAME padding and there is no pooling, so the first FC sees 28×28×128.

DEVIATIONS (printed by the report):
- SAME padding and no pooling are inferred from the 35.4M parameter count; the paper states neither.
- Dropout p = 0.5 before the 10-way output layer; the paper gives no rate.
- PoolingCNN (§5.2) is ours: the paper says only "a traditional convolutional model with a similar
  number of parameters" using max-pooling and dropout (see its docstring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.models.capsnet import OFFICIAL_BIAS, OFFICIAL_CONV1_STD, OFFICIAL_STD

DROPOUT = 0.5
CONV_CHANNELS = (256, 256, 128)
FC_SIZES = (328, 192)
KERNEL_SIZE = 5

DEVIATIONS = [
    "Baseline CNN: SAME padding and no pooling, inferred from the paper's 35.4M parameters "
    "(35,445,522 by arithmetic); the paper states neither.",
    f"Baseline CNN: dropout p = {DROPOUT} before the output layer; the paper gives no rate.",
    "§5.2 CNN (cnn_affnist): architecture ours (convs 256/256/128 5×5 with 2×2 max-pooling after the first "
    "two, FC 848, FC 192, dropout 0.5): 13,484,826 parameters at 40×40 vs the 40×40 CapsNet's 13,475,648; "
    "the paper states only max-pooling, dropout and a similar parameter count.",
]
MULTIMNIST_DEVIATIONS = [
    "MultiMNIST baseline (multimnist_baseline): the official conv_model.py (conv 5×5 512, pool, conv 5×5 256, "
    "pool, FC 1024, FC 10, no dropout, its initialisation) with SAME padding, inferred from the paper's 24.56M "
    "(24,535,306 by arithmetic; the code's default VALID padding gives 12,738,826); trained with the code's default "
    "margin loss on its raw outputs, both classes positive; the paper describes neither.",
]
POOLING_FC_SIZES = (848, 192)  # chosen so that the 40×40 count is within 0.1 % of the 40×40 CapsNet


class BaselineCNN(nn.Module):
    """Three 5×5 SAME convs (256, 256, 128, ReLU), each of the first ``pools`` followed by 2×2
    max-pooling, then FC → FC → dropout → num_classes. The defaults are the Table 1 baseline."""

    def __init__(self, image_size: int = 28, num_classes: int = 10, dropout: float = DROPOUT, *,
                 pools: int = 0, fc_sizes: tuple[int, int] = FC_SIZES):
        super().__init__()
        channels = (1, *CONV_CHANNELS)
        self.convs = nn.ModuleList(
            nn.Conv2d(c_in, c_out, KERNEL_SIZE, padding=KERNEL_SIZE // 2)
            for c_in, c_out in zip(channels[:-1], channels[1:])
        )
        self.pools = pools
        side = image_size // 2**pools  # each 2×2 max-pool halves the side
        self.fc1 = nn.Linear(CONV_CHANNELS[-1] * side * side, fc_sizes[0])
        self.fc2 = nn.Linear(fc_sizes[0], fc_sizes[1])
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(fc_sizes[1], num_classes)

    def forward(self, images: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """images (B, 1, H, W) in [0, 1] -> logits (B, num_classes); softmax lives in the loss.

        ``keep`` (B, FC2): the dropout mask already scaled, 0 or 1 / (1 − p), drawn by
        `dropout_keep` from the run's own generator (training); None: nn.Dropout's own draw.
        """
        x = images
        for k, conv in enumerate(self.convs):
            x = F.relu(conv(x))  # (B, C, H', W') with SAME padding
            if k < self.pools:
                x = F.max_pool2d(x, 2)  # (B, C, H'/2, W'/2)
        x = F.relu(self.fc1(x.flatten(1)))  # (B, FC1)
        x = F.relu(self.fc2(x))  # (B, FC2)
        x = self.dropout(x) if keep is None else x * keep.to(x.dtype)  # (B, FC2)
        return self.out(x)  # (B, num_classes)

    def dropout_keep(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        """A training step's dropout mask (B, FC2), 0 with probability p else 1 / (1 − p), drawn from
        ``generator`` (on its device): each seed's own stream, so stacked seeds drop what separate
        runs drop."""
        p = self.dropout.p
        u = torch.rand(batch, self.out.in_features, generator=generator, device=generator.device)  # (B, FC2)
        return (u >= p).float() / (1 - p)


class PoolingCNN(BaselineCNN):
    """§5.2's conventional CNN: max-pooling, dropout, about the 40×40 CapsNet's parameter count.

    conv 5×5 256 → max-pool 2 → conv 5×5 256 → max-pool 2 → conv 5×5 128 (SAME padding, ReLU)
    → FC 848 → FC 192 → dropout 0.5 → num_classes. At 40×40 with 10 classes: 13,484,826
    parameters; the 40×40 CapsNet (routing 3, decoder) has 13,475,648 (+0.07 %).
    """

    def __init__(self, image_size: int = 40, num_classes: int = 10, dropout: float = DROPOUT):
        super().__init__(image_size, num_classes, dropout, pools=2, fc_sizes=POOLING_FC_SIZES)


class MultiMNISTCNN(nn.Module):
    """The MultiMNIST baseline (§6), as the official conv_model.py builds it: 5×5 conv 512 → ReLU →
    2×2 max-pool → 5×5 conv 256 → ReLU → 2×2 max-pool → FC 1024 ReLU → FC num_classes (linear),
    SAME padding, no dropout; the official code's initialisation (truncated normal ±2σ: convs std
    5e-2, FCs 0.1; biases 0.1). 24,535,306 parameters at 36×36: the paper's 24.56M holds with SAME
    padding, while the code's default `padding` hparam, VALID, gives 12,738,826 (both counts are
    tested). Trained as the code's default `loss_type: margin` does: Eq. 4's margin loss on the 10
    raw outputs, both digits' classes positive (pipeline.training.train)."""

    CHANNELS, FC, POOLED = (512, 256), 1024, 4  # two 2×2 pools shrink the side 4×

    def __init__(self, image_size: int = 36, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, self.CHANNELS[0], KERNEL_SIZE, padding=KERNEL_SIZE // 2)
        self.conv2 = nn.Conv2d(self.CHANNELS[0], self.CHANNELS[1], KERNEL_SIZE, padding=KERNEL_SIZE // 2)
        side = -(-image_size // self.POOLED)  # SAME pooling rounds up
        self.fc1 = nn.Linear(self.CHANNELS[1] * side * side, self.FC)
        self.out = nn.Linear(self.FC, num_classes)
        with torch.no_grad():
            # the official variables.weight_variable: convs 5e-2 (as CapsNet's conv1), fully connected 0.1
            for layer, std in ((self.conv1, OFFICIAL_CONV1_STD), (self.conv2, OFFICIAL_CONV1_STD),
                               (self.fc1, OFFICIAL_STD), (self.out, OFFICIAL_STD)):
                nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
                layer.bias.fill_(OFFICIAL_BIAS)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 1, S, S) in [0, 1] -> raw class scores (B, num_classes)."""
        x = F.max_pool2d(F.relu(self.conv1(images)), 2, ceil_mode=True)  # (B, 512, S/2, S/2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, ceil_mode=True)  # (B, 256, S/4, S/4)
        return self.out(F.relu(self.fc1(x.flatten(1))))  # (B, num_classes)
