"""Training and prediction: the paper's recipe on data that lives on the device.

`train(config, data, checkpoint_path, logger)` is the pure core the `capsnet train` stage wraps.
The whole training set sits on the device as uint8; shuffling, the ±2 px shifts and batching
happen there; the loss is read back only every `log_every` steps (no per-step host sync).
An atomic checkpoint every `checkpoint_every` epochs (and after the last) makes a killed run
resumable; in deterministic CPU mode
the resumed run ends with exactly the weights of an uninterrupted one.

DEVIATIONS (printed by the report):
- Each epoch is floor(N / batch) steps (the last partial batch is dropped, a different one each
  epoch); 640 epochs are 299,520 steps rather than the official 300,000.
- §5.2 early stopping is checked once per epoch on the expanded-MNIST test set (the paper stops
  on that set's accuracy too; it does not say how often it looked), so a stopped model can lie
  a little above the target.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pipeline.affnist import random_place
from pipeline.baseline import BaselineCNN, MultiMNISTCNN, PoolingCNN
from pipeline.capsnet import CapsNet, capsnet_loss, margin_loss
from pipeline.data import random_shift
from pipeline.errors import UserError
from pipeline import multimnist as mm
from pipeline.files import atomic_path
from pipeline.params import Params

ADAM_EPS = 1e-8  # TF1's tf.train.AdamOptimizer default, which the official code uses (1e-7 is Keras')
DEVIATIONS = [
    "Epochs are floor(N/batch) steps (last partial batch dropped, a different one each epoch): "
    "640 epochs = 299,520 steps, not the official 300,000.",
    "§5.2 early stopping is checked once per epoch (the paper does not say how often), on the expanded-MNIST "
    "test set as in the paper, so a stopped model can lie a little above the target accuracy.",
]


BF16_NOTE = (
    "train.amp = true: bf16 autocast on CUDA (the paper's code trains in fp32). Measured on an H100 at "
    "initialisation, batch 128, against eager fp32 with TF32 off: losses agree within 1e-5 relative for every "
    "variant; gradients within 0.8 % relative norm for the CapsNets but 7.4 % (baseline_cnn) and 9.7 % "
    "(cnn_affnist) for the CNNs, whose deep wide layers accumulate bf16 rounding (eager bf16 on CPU gives the "
    "same 7.4 %, so it is the precision, not torch.compile).")


class NonFiniteLossError(UserError, RuntimeError):
    """The training loss became NaN or infinite; the message names the first such step."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines one training run; stored with its checkpoint and weights."""

    variant: str
    model: str
    routing_iterations: int
    reconstruction: bool
    image_size: int
    num_classes: int
    target_accuracy_pct: float  # early stopping on the per-epoch test accuracy; 0 = off
    seed: int
    profile: str
    epochs: int
    batch_size: int
    lr: float
    lr_decay_rate: float
    lr_decay_steps: int
    lr_min: float
    max_shift: int
    amp: bool
    compile: bool
    deterministic: bool
    log_every: int
    eval_batch_size: int
    device: str
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch is always saved)
    multimnist_epoch_size: int = 60_000  # MultiMNIST: examples sampled per epoch (pipeline.multimnist)
    recipe: str = "paper"  # CapsNet: paper | official (pipeline.capsnet); the CNNs have one recipe, "paper"
    channels_last: bool = False  # NHWC convolutions: a memory layout, so outside the digest
    lr_schedule_epochs: int = 0  # 0: the decay at its own pace; E: E epochs' decay compressed into `epochs`

    @property
    def multimnist(self) -> bool:
        """A MultiMNIST variant (§6): two overlapping digits on the 36×36 canvas."""
        return self.image_size == mm.CANVAS

    def digest(self) -> str:
        """Hash of the fields that change the mathematics (a checkpoint resumes only on a match)."""
        fields = dataclasses.asdict(self) | {"adam_eps": ADAM_EPS}
        for cosmetic in ("log_every", "eval_batch_size", "profile", "checkpoint_every", "channels_last"):
            fields.pop(cosmetic)
        if not self.multimnist:  # unused there: digests (checkpoints) from before MultiMNIST stay valid
            fields.pop("multimnist_epoch_size")
        if not self.lr_schedule_epochs:  # uncompressed: digests from before the key existed stay valid
            fields.pop("lr_schedule_epochs")
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def run_config(params: Params, variant: str, seed: int, **overrides) -> RunConfig:
    """The RunConfig of (variant, seed) under ``params``: the variant's model settings plus the
    train section's recipe (every TrainParams field is a RunConfig field, but compile_cnns decides
    ``compile`` for the CNNs), then ``overrides``."""
    v = params.variant(variant)
    recipe = dataclasses.asdict(params.train)
    compile_cnns = recipe.pop("compile_cnns")
    recipe["compile"] = params.train.compile and (v.model == "capsnet" or compile_cnns)
    cfg = RunConfig(variant=variant, model=v.model, routing_iterations=v.routing_iterations,
                    reconstruction=v.reconstruction, image_size=v.image_size, num_classes=10,
                    target_accuracy_pct=v.target_accuracy_pct, recipe=v.recipe, seed=seed,
                    profile=params.base.profile, **recipe)
    return dataclasses.replace(cfg, **overrides)


def count_params(cfg: RunConfig) -> int:
    """Parameter count of cfg's model, built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        return n_params(build_model(cfg))


class EpochLogger(Protocol):
    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None: ...


@dataclass
class TrainResult:
    model: torch.nn.Module
    history: list[dict[str, float]]
    steps: int
    resumed_from_epoch: int
    resumed_at: list[int]  # every epoch this run resumed at, across its processes (the checkpoint carries the list)
    stop_reason: str  # "target" (early stopping reached the target accuracy) or "budget" (all epochs)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"train.device is {name!r} but torch {torch.__version__} sees no CUDA device; "
                        "set train.device: auto (or cpu) in params.yaml")
    return device


def build_model(cfg: RunConfig) -> torch.nn.Module:
    if cfg.model == "capsnet":
        return CapsNet(cfg.routing_iterations, cfg.reconstruction, cfg.image_size, cfg.num_classes, cfg.recipe)
    if cfg.model == "pooling_cnn":
        return PoolingCNN(cfg.image_size, cfg.num_classes)
    if cfg.model == "multimnist_cnn":
        return MultiMNISTCNN(cfg.image_size, cfg.num_classes)
    return BaselineCNN(cfg.image_size, cfg.num_classes)


def place_model(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> torch.nn.Module:
    """``model`` on ``device``; with cfg.channels_last its 4-D weights in NHWC, which makes every
    convolution's output NHWC too (the (B, 1, H, W) input is the same memory in both layouts)."""
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if cfg.channels_last else model


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W) -> float (B, 1, H, W) in [0, 1]."""
    return images.unsqueeze(1).float().div_(255)


def augment(images: torch.Tensor, image_size: int, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """The paper's training augmentation, on the device.  (B, h, w) uint8 -> (B, S, S), S = image_size.

    Digits at the model's input size get a random shift of up to ±max_shift px (Table 1); smaller
    digits go to a uniformly random position on an image_size canvas, nothing else (§5.2).
    """
    if images.shape[-1] == image_size:
        return random_shift(images, max_shift, generator)
    return random_place(images, image_size, generator)


def loss_recipe(cfg: RunConfig) -> str | None:
    """The CapsNet loss recipe of cfg's model, or None for a CNN (cross-entropy)."""
    return cfg.recipe if cfg.model == "capsnet" else None


def compute_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: str | None,
                 targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, margin or cross-entropy, reconstruction) for one batch, all on the device.

    ``recipe``: `capsnet_loss`'s recipe for a CapsNet, None for a CNN (`loss_recipe(cfg)`).
    MultiMNIST: y (B, 2) and ``targets`` (B, 2, 1, S, S), each digit alone; its CNN takes the
    margin loss on raw outputs with both classes positive (the official code's default loss).
    """
    if recipe is None:
        scores = model(x).float()  # (B, K)
        loss = margin_loss(scores, y) if y.dim() == 2 else F.cross_entropy(scores, y)
        return loss, loss, torch.zeros((), device=x.device)
    return capsnet_loss(model(x, y), x, y, recipe, targets)


class LossOf(torch.nn.Module):
    """The model and its loss as one module, so that torch.compile fuses them into one graph
    (routing, squash, margin and reconstruction loss: hundreds of eager launches become tens)."""

    def __init__(self, model: torch.nn.Module, recipe: str | None):
        super().__init__()
        self.model, self.recipe = model, recipe

    def forward(self, x: torch.Tensor, y: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return compute_loss(self.model, x, y, self.recipe, targets)


def loss_function(model: torch.nn.Module, cfg: RunConfig, compile_mode: str = "default") -> torch.nn.Module:
    """The callable `training_step` differentiates: model + loss, compiled together when cfg.compile
    (``compile_mode``: torch.compile's mode; "reduce-overhead" adds CUDA graphs)."""
    fn = LossOf(model, loss_recipe(cfg))
    return torch.compile(fn, mode=compile_mode) if cfg.compile else fn


def configure_backends(cfg: RunConfig, device: torch.device) -> None:
    """Deterministic algorithms, or (deterministic: false) cuDNN autotuning for speed."""
    torch.use_deterministic_algorithms(cfg.deterministic, warn_only=True)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not cfg.deterministic


@torch.no_grad()
def predict(model: torch.nn.Module, images: torch.Tensor, batch_size: int, amp: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores and predictions for uint8 images (N, H, W) on the model's device.

    Returns scores (N, K) float32 (capsule lengths, or logits for the CNN) and predictions (N,).
    """
    model.eval()
    device = next(model.parameters()).device
    scores = []
    for start in range(0, images.shape[0], batch_size):
        x = to_float(images[start:start + batch_size].to(device))  # (b, 1, H, W)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        scores.append((out if torch.is_tensor(out) else out.lengths).float())  # (b, K)
    model.train()
    scores = torch.cat(scores)  # (N, K)
    return scores, scores.argmax(dim=1)


def training_step(loss_fn: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, images: torch.Tensor,
                  labels: torch.Tensor, generator: torch.Generator, cfg: RunConfig, amp: bool,
                  digits: torch.Tensor | None = None) -> torch.Tensor:
    """One optimiser step on a uint8 batch (B, h, w): augment, loss, backward, Adam, lr decay.

    ``loss_fn`` is `loss_function(model, cfg)`. Returns (total, margin or cross-entropy,
    reconstruction) detached on the device (no sync). The same function runs in `capsnet train`
    and `capsnet bench`; the augmentation stays outside the compiled graph. MultiMNIST batches
    come composed (`multimnist.compose`): images (B, 36, 36), labels (B, 2), and ``digits``
    (B, 2, 36, 36), each digit alone, the reconstruction targets; they get no further augmentation.
    """
    if digits is None:
        x, targets = to_float(augment(images, cfg.image_size, cfg.max_shift, generator)), None  # (B, 1, S, S)
    else:
        x, targets = to_float(images), digits.unsqueeze(2).float().div_(255)  # (B, 1, S, S), (B, 2, 1, S, S)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        loss, margin, recon = loss_fn(x, labels, targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return torch.stack([loss, margin, recon]).detach()


def make_optimizer(model: torch.nn.Module, cfg: RunConfig, device: torch.device):
    """Adam (TF defaults, lr from cfg) and the smooth exponential decay, floored at lr_min."""
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=ADAM_EPS, fused=device.type == "cuda")
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg))


def _lr_lambda(cfg: RunConfig):
    """lr(step) / lr = max(rate^(step / decay_steps · c), lr_min / lr), c = lr_schedule_epochs / epochs
    when the schedule is compressed (lr_schedule_epochs > 0), else 1."""
    floor = cfg.lr_min / cfg.lr
    pace = cfg.lr_schedule_epochs / cfg.epochs if cfg.lr_schedule_epochs else 1.0
    return lambda step: max(cfg.lr_decay_rate ** (step / cfg.lr_decay_steps * pace), floor)


def assert_finite_weights(weights: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to save non-finite weights: a NaN checkpoint would poison every resume after it."""
    bad = [k for k, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteLossError(f"{what}: non-finite weights in {', '.join(bad[:3])}"
                                 f"{' …' if len(bad) > 3 else ''}; nothing saved (the last good checkpoint is kept)")


def _save_checkpoint(path: Path, state: dict) -> None:
    assert_finite_weights(state["model"], f"checkpoint {path}")
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | Path, cfg: RunConfig) -> dict | None:
    """The checkpoint at ``path`` if it belongs to ``cfg`` (same digest); else None."""
    path = Path(path)
    if not path.is_file():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("digest") != cfg.digest():
        warnings.warn(f"{path} belongs to another configuration; starting afresh", stacklevel=2)
        return None
    return state


def train(cfg: RunConfig, data: dict[str, torch.Tensor], checkpoint_path: str | Path,
          logger: EpochLogger | None = None, extra: dict | None = None,
          state: dict | None | Literal["load"] = "load") -> TrainResult:
    """Train one (variant, seed); resume from ``checkpoint_path`` when it matches ``cfg``.

    ``data``: train_images (N, 28, 28) uint8, train_labels (N,), and the clean test set the model
    is scored on each epoch, test_images (M, S, S) with S = cfg.image_size, test_labels (M,).
    MultiMNIST (cfg.multimnist): every step composes a fresh batch of pairs from the train split,
    an epoch is cfg.multimnist_epoch_size examples, and the per-epoch test error is the pair error
    on the first `multimnist.CURVE_RECIPES` of test_pairs (P, 2) / test_shifts (P, 2, 2) over the
    28×28 test_images.
    With ``cfg.target_accuracy_pct`` > 0 training stops after the first epoch whose test
    accuracy reaches it (§5.2 early stopping); ``stop_reason`` says which end was reached.
    ``extra`` is stored in every checkpoint (the tracking run id, say). ``state`` is the checkpoint
    already read by the caller with `load_checkpoint` (None: start afresh); by default it is read here.
    """
    checkpoint_path = Path(checkpoint_path)
    device = resolve_device(cfg.device)
    amp = cfg.amp and device.type == "cuda"
    if cfg.amp and not amp:
        warnings.warn("train.amp is on but the device is not CUDA: training in fp32", stacklevel=2)
    configure_backends(cfg, device)
    torch.manual_seed(cfg.seed)
    model = place_model(build_model(cfg), cfg, device)
    optimizer, scheduler = make_optimizer(model, cfg, device)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)

    images = data["train_images"].to(device)  # (N, H, W) uint8
    labels = data["train_labels"].to(device).long()  # (N,)
    test_images = data["test_images"].to(device)  # (N_test, H, W) uint8, copied once per run
    test_labels = data["test_labels"].to(device).long()  # (N_test,)
    n = images.shape[0]
    steps_per_epoch = (cfg.multimnist_epoch_size if cfg.multimnist else n) // cfg.batch_size
    if steps_per_epoch == 0:
        raise UserError(f"train.batch_size {cfg.batch_size} exceeds the "
                        f"{cfg.multimnist_epoch_size if cfg.multimnist else n} training examples of an epoch")
    if cfg.multimnist:  # built once: the class index for sampling, the curve's recipes on the device
        train_index = mm.class_index(labels)
        curve_pairs = data["test_pairs"][:mm.CURVE_RECIPES].to(device).long()  # (P', 2)
        curve_shifts = data["test_shifts"][:mm.CURVE_RECIPES].to(device)  # (P', 2, 2)
        curve_labels = test_labels[curve_pairs]  # (P', 2)

    start_epoch, history, stop_reason, resumed_at = 0, [], "budget", []
    if state == "load":
        state = load_checkpoint(checkpoint_path, cfg)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        generator.set_state(state["generator"])
        torch.set_rng_state(state["cpu_rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        start_epoch, history, stop_reason = state["epoch"] + 1, state["history"], state["stop_reason"]
        resumed_at = [*state.get("resumed_at", []), start_epoch]
    last_epoch = len(history) if stop_reason == "target" else cfg.epochs  # an early-stopped run is finished

    loss_fn = loss_function(model, cfg)
    model.train()
    for epoch in range(start_epoch, last_epoch):
        t0 = time.perf_counter()
        sums = torch.zeros(3, device=device)  # total, margin, reconstruction
        first_bad = torch.full((), -1, device=device, dtype=torch.long)
        step_dev = torch.full((), epoch * steps_per_epoch, device=device, dtype=torch.long)
        perm = None if cfg.multimnist else torch.randperm(n, generator=generator, device=device)  # (N,)
        bar = tqdm(range(steps_per_epoch), desc=f"{cfg.variant} seed{cfg.seed} epoch {epoch + 1}/{cfg.epochs}",
                   leave=False, mininterval=1.0, disable=None)
        for step in bar:
            if cfg.multimnist:  # a fresh pair and fresh shifts for every example
                pairs, shifts = mm.sample_pairs(train_index, cfg.batch_size, cfg.max_shift, generator)  # (B, 2), (B, 2, 2)
                merged, digits = mm.compose(images, pairs, shifts)  # (B, 36, 36), (B, 2, 36, 36)
                parts = training_step(loss_fn, optimizer, scheduler, merged, labels[pairs], generator, cfg, amp, digits)
            else:
                idx = perm[step * cfg.batch_size:(step + 1) * cfg.batch_size]  # (B,)
                parts = training_step(loss_fn, optimizer, scheduler, images[idx], labels[idx], generator, cfg, amp)  # (3,)
            first_bad = torch.where(~torch.isfinite(parts[0]) & (first_bad < 0), step_dev, first_bad)
            sums += parts
            step_dev += 1
            if (step + 1) % cfg.log_every == 0 or step + 1 == steps_per_epoch:
                if int(first_bad) >= 0:  # one host read every log_every steps
                    raise NonFiniteLossError(
                        f"{cfg.variant} seed {cfg.seed}: non-finite loss at step {int(first_bad)} "
                        f"(epoch {epoch + 1}); the last good checkpoint is {checkpoint_path}")
                bar.set_postfix(loss=f"{float(sums[0]) / (step + 1):.4f}", lr=f"{scheduler.get_last_lr()[0]:.2e}",
                                img_s=f"{(step + 1) * cfg.batch_size / (time.perf_counter() - t0):.0f}")
        bar.close()
        totals = (sums / steps_per_epoch).tolist()
        seconds = time.perf_counter() - t0
        if cfg.multimnist:
            preds = mm.predict_pairs(model, test_images, curve_pairs, curve_shifts, cfg.eval_batch_size, amp)
            test_error = 100.0 * int((~mm.pair_correct(preds, curve_labels)).sum()) / curve_labels.shape[0]
        else:
            _, preds = predict(model, test_images, cfg.eval_batch_size, amp)
            test_error = 100.0 * int((preds != test_labels).sum()) / test_labels.shape[0]  # exact count, one sync
        metrics = {
            "epoch": epoch + 1,
            "train_loss": totals[0], "margin_loss": totals[1], "reconstruction_loss": totals[2],
            "lr": scheduler.get_last_lr()[0], "test_error_pct": test_error,
            "epoch_seconds": seconds, "train_images_per_second": steps_per_epoch * cfg.batch_size / seconds,
        }
        history.append(metrics)
        if target_reached(test_error, cfg.target_accuracy_pct):
            stop_reason = "target"
        last = stop_reason == "target" or epoch + 1 == last_epoch
        if last or (epoch + 1) % cfg.checkpoint_every == 0:
            _save_checkpoint(checkpoint_path, {
                "digest": cfg.digest(), "epoch": epoch, "history": history, "extra": extra or {},
                "resumed_at": resumed_at,
                "stop_reason": stop_reason, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "generator": generator.get_state(),
                "cpu_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            })
        if logger is not None:
            logger.log_epoch(epoch + 1, metrics)
        print(f"{cfg.variant} seed{cfg.seed} epoch {epoch + 1}/{cfg.epochs}: loss {totals[0]:.4f}, "
              f"test error {test_error:.2f}%, {metrics['train_images_per_second']:.0f} img/s", flush=True)
        if stop_reason == "target":
            print(f"{cfg.variant} seed{cfg.seed}: test accuracy {100 - test_error:.2f}% reached the target "
                  f"{cfg.target_accuracy_pct}% after epoch {epoch + 1}; early stop", flush=True)
            break
    return TrainResult(model, history, len(history) * steps_per_epoch, start_epoch, resumed_at, stop_reason)


def target_reached(test_error_pct: float, target_accuracy_pct: float) -> bool:
    """Early stopping's rule: a target is set (> 0) and the accuracy 100 − error % reaches it."""
    return target_accuracy_pct > 0 and 100.0 - test_error_pct >= target_accuracy_pct - 1e-6


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
