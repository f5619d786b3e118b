"""CapsNet (Sabour, Frosst, Hinton 2017, "Dynamic Routing Between Capsules"), one piece per equation.

Conv1 (256, 9×9, ReLU) → PrimaryCaps (32 types × 8D, 9×9 stride 2, squash) → DigitCaps (one 16D
capsule per class, u_hat_{j|i} = W_ij u_i, dynamic routing) → class score ‖v_j‖; a decoder
(FC 512 → FC 1024 → FC H·W sigmoid) reconstructs the image from the masked DigitCaps.

Two recipes (``CapsNet(..., recipe=...)``, ``capsnet_loss(..., recipe=...)``):

- ``paper``: what the paper's text says. Parameter count at 28×28 with 10 classes: 8,215,568
  (6,804,224 without the decoder), the paper's 8.2M / 6.8M by arithmetic. PyTorch's default
  initialisation, DigitCaps W ~ N(0, 0.01²).
- ``official``: what the authors' TensorFlow code (Sarasra/models, research/capsules) computes:
  PrimaryCaps pre-activation conv(x) / 32 + b with b (32, 8) shared over positions and no conv
  bias (layers.conv_slim_capsule: one routing iteration over 32 types from zero logits); a
  DigitCaps bias b_j (10, 16) added to s_j in every routing iteration (layers._update_routing);
  truncated-normal initialisation (variables.weight_variable: std 0.1, conv1 5e-2; every bias
  0.1); the loss of layers._margin_loss + layers.evaluate (Eq. 4 / 20) plus 0.0005 × per-image
  SSE (layers.reconstruction). 8,215,728 parameters at 28×28 (the 160 of the DigitCaps bias more).

DEVIATIONS (printed by the report):
- The squash uses ‖s‖ = sqrt(‖s‖² + 1e-8) so that a zero vector maps to zero with a finite
  gradient (PAPER.md asks for an epsilon; its size is ours; the official code has none). Class
  scores ‖v‖ use the same ε. Both recipes.
- Paper recipe: no learned DigitCaps bias and no PrimaryCaps /32 scaling (the paper mentions
  neither), PyTorch's default initialisation (the paper gives none).
- Official recipe: no leaky routing (the official code's `leaky` flag, off by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-8
RECIPES = ("paper", "official")
OFFICIAL_STD, OFFICIAL_CONV1_STD, OFFICIAL_BIAS = 0.1, 5e-2, 0.1  # the official code's initialisation

DEVIATIONS = [
    "Squash and capsule lengths use ‖s‖ = sqrt(‖s‖² + 1e-8), so a zero vector stays finite (both recipes; "
    "the official code has no ε).",
]
PAPER_RECIPE_DEVIATIONS = [
    "Paper recipe vs the official code: no learned DigitCaps bias (the official code adds a 10×16 bias to s_j): "
    "8,215,568 parameters instead of 8,215,728; PrimaryCaps is a plain conv with bias, not conv/32 + a (32, 8) "
    "bias; PyTorch's default initialisation (DigitCaps W ~ N(0, 0.01²)) instead of truncated normal std 0.1; "
    "loss Eq. 4 + 0.0005·SSE as the text says, where the official code's scale makes the reconstruction "
    "term 20× stronger relative to Eq. 4.",
]
OFFICIAL_RECIPE_DEVIATIONS = [
    "Official recipe vs the paper's text: loss Eq. 4 / 20 + 0.0005·SSE (relative to Eq. 4 the reconstruction "
    "weight is 0.01, the paper says 0.0005); PrimaryCaps conv/32 + a (32, 8) bias; a 10×16 DigitCaps bias in "
    "every routing iteration; truncated-normal initialisation (std 0.1, conv1 5e-2, biases 0.1).",
    "Official recipe vs the official code: no leaky routing (its `leaky` flag, off by default); the squash ε "
    "above; batches drawn from the whole shuffled set each epoch, not the code's ~5,000-example shuffle buffer "
    "over shifted copies written to disk.",
]


@dataclass(frozen=True)
class CapsNetConfig:
    """Architecture of the paper's MNIST CapsNet (§4); only the first five fields vary by variant."""

    routing_iterations: int = 3
    reconstruction: bool = True
    image_size: int = 28
    num_classes: int = 10
    recipe: str = "paper"  # paper | official (module docstring)
    conv1_channels: int = 256
    kernel_size: int = 9
    primary_types: int = 32
    primary_dim: int = 8
    primary_stride: int = 2
    digit_dim: int = 16
    decoder_hidden: tuple[int, int] = (512, 1024)

    @property
    def primary_grid(self) -> int:
        """Side of the PrimaryCaps grid, from conv arithmetic (6 at 28×28, 12 at 40×40)."""
        conv1_side = self.image_size - self.kernel_size + 1
        return (conv1_side - self.kernel_size) // self.primary_stride + 1

    @property
    def num_primary(self) -> int:
        """Number of primary capsules: types × grid² (1152 at 28×28)."""
        return self.primary_types * self.primary_grid**2


class CapsNetOutput(NamedTuple):
    lengths: torch.Tensor  # (B, num_classes) ‖v_j‖, the class scores
    poses: torch.Tensor  # (B, num_classes, 16) v_j
    reconstructions: torch.Tensor | None  # (B, 1, H, W) in [0, 1], None without a decoder


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Eq. 1: v = ‖s‖² / (1 + ‖s‖²) · s / ‖s‖. Norms land in [0, 1), direction is kept."""
    squared_norm = (s * s).sum(dim=dim, keepdim=True)  # (..., 1, ...)
    return squared_norm / (1 + squared_norm) * s / torch.sqrt(squared_norm + EPS)


def capsule_length(v: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """‖v‖ along ``dim`` with the squash's ε (finite gradient at 0).  (..., D) -> (...)"""
    return torch.sqrt((v * v).sum(dim=dim) + EPS)


def dynamic_routing(u_hat: torch.Tensor, iterations: int,
                    bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Procedure 1: routing by agreement.  u_hat (B, N_in, N_out, D) -> v (B, N_out, D), c (B, N_in, N_out).

    b_ij = 0; repeat r times: c_i = softmax(b_i) over the parents j; s_j = Σ_i c_ij u_hat_{j|i}
    (+ bias_j (N_out, D) in every iteration, the official recipe); v_j = squash(s_j);
    b_ij += u_hat_{j|i} · v_j. Gradients flow through every iteration, as in the official code.
    Returns the outputs and the coupling coefficients that produced them.
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    b = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype, device=u_hat.device)  # (B, N_in, N_out)
    for r in range(iterations):
        c = torch.softmax(b, dim=2)  # (B, N_in, N_out) sums to 1 over parents j
        s = torch.einsum("bij,bijd->bjd", c.to(u_hat.dtype), u_hat)  # (B, N_out, D)
        if bias is not None:
            s = s + bias  # (B, N_out, D)
        v = squash(s)  # (B, N_out, D)
        if r < iterations - 1:
            b = b + torch.einsum("bijd,bjd->bij", u_hat, v)  # (B, N_in, N_out) agreement
    return v, c


class PrimaryCaps(nn.Module):
    """9×9 stride-2 conv to types × D channels, grouped into D-dim capsules per grid position.

    Channel = type·D + component (official code). The view/permute keeps every capsule at one
    grid position; reshaping (B, types·D, G, G) straight to (B, N, D) would mix positions.
    ``official``: the conv has no bias; the pre-activation is conv(x) / types + b with b (types, D)
    shared over positions (the official code's one routing iteration from zero logits gives every
    type the coupling 1 / types).
    """

    def __init__(self, in_channels: int, types: int, dim: int, kernel_size: int, stride: int,
                 official: bool = False):
        super().__init__()
        self.types, self.dim = types, dim
        self.conv = nn.Conv2d(in_channels, types * dim, kernel_size, stride=stride, bias=not official)
        self.bias = nn.Parameter(torch.full((types, dim), OFFICIAL_BIAS)) if official else None  # (types, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, types·G·G, D), squashed."""
        out = self.conv(x)  # (B, types·D, G, G)
        b, _, g, _ = out.shape
        out = out.view(b, self.types, self.dim, g, g)  # (B, types, D, G, G)
        if self.bias is not None:
            out = out / self.types + self.bias[:, :, None, None]  # (B, types, D, G, G)
        out = out.permute(0, 1, 3, 4, 2).reshape(b, self.types * g * g, self.dim)  # (B, N_in, D)
        return squash(out)


class DigitCaps(nn.Module):
    """u_hat_{j|i} = W_ij u_i with one 16×8 matrix per (input capsule i, class j), then routing
    (with a learned bias b_j (N_out, D_out) on s_j when ``bias``: the official recipe)."""

    def __init__(self, num_in: int, num_out: int, dim_in: int, dim_out: int, iterations: int,
                 bias: bool = False):
        super().__init__()
        self.iterations = iterations
        self.W = nn.Parameter(0.01 * torch.randn(num_in, num_out, dim_out, dim_in))  # (N_in, N_out, D_out, D_in)
        self.bias = nn.Parameter(torch.full((num_out, dim_out), OFFICIAL_BIAS)) if bias else None  # (N_out, D_out)

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u (B, N_in, D_in) -> v (B, N_out, D_out), c (B, N_in, N_out)."""
        u_hat = torch.einsum("ijdk,bik->bijd", self.W, u)  # (B, N_in, N_out, D_out)
        return dynamic_routing(u_hat, self.iterations, self.bias)


class Decoder(nn.Module):
    """FC 512 ReLU → FC 1024 ReLU → FC H·W sigmoid, from the masked DigitCaps (§4.1)."""

    def __init__(self, num_classes: int, dim: int, hidden: tuple[int, int], image_size: int):
        super().__init__()
        self.image_size = image_size
        self.net = nn.Sequential(
            nn.Linear(num_classes * dim, hidden[0]), nn.ReLU(inplace=True),
            nn.Linear(hidden[0], hidden[1]), nn.ReLU(inplace=True),
            nn.Linear(hidden[1], image_size * image_size), nn.Sigmoid(),
        )

    def forward(self, poses: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """poses (B, K, D), target class (B,) -> (B, 1, H, W): only the target's capsule is seen."""
        mask = F.one_hot(target, poses.shape[1]).to(poses.dtype)  # (B, K)
        masked = (poses * mask.unsqueeze(2)).flatten(1)  # (B, K·D)
        return self.net(masked).view(-1, 1, self.image_size, self.image_size)  # (B, 1, H, W)


class CapsNet(nn.Module):
    """The paper's three-layer CapsNet with optional reconstruction decoder, under the ``paper`` or
    ``official`` recipe (module docstring)."""

    def __init__(self, routing_iterations: int = 3, reconstruction: bool = True,
                 image_size: int = 28, num_classes: int = 10, recipe: str = "paper"):
        super().__init__()
        if recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
        cfg = CapsNetConfig(routing_iterations, reconstruction, image_size, num_classes, recipe)
        if cfg.primary_grid < 1:
            raise ValueError(f"image_size {image_size} is too small for two 9×9 convolutions")
        official = recipe == "official"
        self.config = cfg
        self.conv1 = nn.Conv2d(1, cfg.conv1_channels, cfg.kernel_size)
        self.primary = PrimaryCaps(cfg.conv1_channels, cfg.primary_types, cfg.primary_dim,
                                   cfg.kernel_size, cfg.primary_stride, official=official)
        self.digits = DigitCaps(cfg.num_primary, num_classes, cfg.primary_dim, cfg.digit_dim, routing_iterations,
                                bias=official)
        self.decoder = Decoder(num_classes, cfg.digit_dim, cfg.decoder_hidden, image_size) if reconstruction else None
        if official:
            official_init(self)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> CapsNetOutput:
        """images (B, 1, H, W) in [0, 1], labels (B,), (B, T) or None -> CapsNetOutput.

        With labels (training) the decoder sees the labelled class's capsule; without, the
        longest capsule's (evaluation). MultiMNIST's (B, 2) labels run the decoder once per digit,
        each masked by its own label: reconstructions (B, 2, 1, H, W).
        """
        x = F.relu(self.conv1(images))  # (B, 256, H-8, W-8)
        u = self.primary(x)  # (B, N_in, 8)
        v, _ = self.digits(u)  # (B, K, 16)
        lengths = capsule_length(v)  # (B, K)
        reconstructions = None
        if self.decoder is not None and labels is not None and labels.dim() == 2:
            reconstructions = torch.stack([self.decoder(v, t) for t in labels.unbind(1)], dim=1)  # (B, T, 1, H, W)
        elif self.decoder is not None:
            target = labels if labels is not None else lengths.argmax(dim=1)  # (B,)
            reconstructions = self.decoder(v, target)  # (B, 1, H, W)
        return CapsNetOutput(lengths, v, reconstructions)


def official_init(model: CapsNet) -> None:
    """The official code's initialisation (variables.weight_variable / bias_variable, the decoder's
    initialisers): truncated normal cut at ±2σ, std 0.1 for the PrimaryCaps kernel, DigitCaps W and
    decoder weights, std 5e-2 for conv1; every bias 0.1."""
    weights = [(model.conv1.weight, OFFICIAL_CONV1_STD), (model.primary.conv.weight, OFFICIAL_STD),
               (model.digits.W, OFFICIAL_STD)]
    if model.decoder is not None:
        weights += [(layer.weight, OFFICIAL_STD) for layer in model.decoder.net if isinstance(layer, nn.Linear)]
    with torch.no_grad():
        for weight, std in weights:
            nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.fill_(OFFICIAL_BIAS)


def margin_loss(lengths: torch.Tensor, labels: torch.Tensor, *, m_plus: float = 0.9,
                m_minus: float = 0.1, lambda_: float = 0.5) -> torch.Tensor:
    """Eq. 4: L_k = T_k max(0, m⁺ − ‖v_k‖)² + λ (1 − T_k) max(0, ‖v_k‖ − m⁻)², summed over k,
    averaged over the batch.  lengths (B, K), labels (B,) class indices or (B, T) with T_k = 1
    for each listed class (MultiMNIST: both digits present) -> scalar."""
    t = F.one_hot(labels, lengths.shape[1]).to(lengths.dtype)  # (B, K) or (B, T, K)
    if t.dim() == 3:
        t = t.amax(dim=1)  # (B, K)
    present = t * F.relu(m_plus - lengths) ** 2  # (B, K)
    absent = lambda_ * (1 - t) * F.relu(lengths - m_minus) ** 2  # (B, K)
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(reconstructions: torch.Tensor, images: torch.Tensor, *,
                        scale: float = 0.0005) -> torch.Tensor:
    """Per-image **sum** of squared pixel errors (pixels in [0, 1]) × scale, averaged over the batch.

    (B, 1, H, W), (B, 1, H, W) -> scalar; MultiMNIST's (B, 2, 1, H, W) pairs sum SSE_a + SSE_b per
    example. Not a per-pixel mean, which is H·W times too weak.
    """
    sse = ((reconstructions - images) ** 2).flatten(1).sum(dim=1)  # (B,)
    return scale * sse.mean()


def capsnet_loss(output: CapsNetOutput, images: torch.Tensor, labels: torch.Tensor,
                 recipe: str = "paper", targets: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, margin, reconstruction) of a CapsNet batch: the one loss train and bench use.

    paper: Eq. 4 (summed over classes, batch mean) + 0.0005 × per-image SSE (batch mean).
    official: the official code's `_margin_loss` halves Eq. 4's terms and `evaluate` averages over
    the batch *and* the K classes, so its margin term is Eq. 4 / (2K) = Eq. 4 / 20; the reconstruction
    term is the same 0.0005 × per-image SSE (relative to Eq. 4: weight 0.01, 20× the paper's text).
    output.lengths (B, K), images (B, 1, H, W), labels (B,) -> three scalars (fp32). MultiMNIST:
    labels (B, 2) and ``targets`` (B, 2, 1, H, W), each digit alone, which its reconstruction is
    scored against (the input is the default target).
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    margin = margin_loss(output.lengths.float(), labels)
    if recipe == "official":
        margin = margin / (2 * output.lengths.shape[1])
    target = images if targets is None else targets
    recon = (reconstruction_loss(output.reconstructions.float(), target) if output.reconstructions is not None
             else torch.zeros((), device=images.device))
    return margin + recon, margin, recon
