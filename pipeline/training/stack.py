"""Several seeds of one variant trained as one computation (issue #23), and the loss they share.

`SeedStack` holds S models of one architecture as one: every parameter becomes one (S, …) tensor,
and its forward evaluates every seed's model and loss on every seed's batch at once with
`torch.func.vmap` over `torch.func.functional_call`. vmap's batching rules make the stacked
layers what HFTA (Wang et al., MLSys 2021) builds by hand: a convolution with per-seed weights
runs as one grouped convolution (groups = S), a linear layer and DigitCaps' W as batched matrix
products, so one launch does S seeds' work.

Why the seeds stay independent: each seed's loss depends only on its own slice of each stacked
parameter, the loop backpropagates the **sum** of the per-seed losses (so each slice's gradient is
that seed's own gradient; an average would scale it by 1/S, which changes Adam's update through ε),
and Adam is elementwise, so one Adam over (S, …) tensors is S Adams. S = 1 is a separate run:
the same code without vmap.

Grouped convolutions have been reported slower than separate ones on some GPUs (pytorch#73764:
256 channels, 3.32 ms grouped against 2.48 ms separate, as that issue reports it), and PrimaryCaps
(256→256, 9×9) does most of a CapsNet's arithmetic, so the layout is a choice (train.stack_layout;
`capsnet bench --stack` times each): ``fused`` (vmap, as above), ``bmm`` (vmap, but every convolution as im2col and one matrix
product, `conv2d_as_matmul`, which under vmap is a batched matmul over the seeds, no grouped
kernel), ``loop`` (each seed's model in turn, its own kernels, still one process, one backward
and one Adam step), or ``streams`` (the loop with each seed's forward, and so its backward, on a
CUDA stream of its own, `SeedStreams`: the seeds' kernels may run side by side, and a captured
step holds them as parallel branches of one graph).

Why streams: on an H200 one seed's captured batch-128 step ran at 79.5 TFLOP/s, about a tenth of the
card's bf16 matrix rate (about 790 TFLOP/s, the device tool's figure), and three seeds stacked
(fused) at 0.48x one seed's images/s (reports/benchmarks.md): the step's kernels leave most of the
card idle, and no layout above lets another seed's kernels fill it.
On a CPU there are no streams and ``streams`` is ``loop``.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from pipeline.core.params import STACK_LAYOUTS
from pipeline.models.capsnet import capsnet_loss, margin_loss
from pipeline.training.experiment import Batch


def loss_recipe(cfg) -> str | None:
    """The CapsNet loss recipe of cfg's model (a pipeline.training.config.RunConfig), or None for a CNN."""
    return cfg.recipe if cfg.model == "capsnet" else None


def compute_loss(model, x: torch.Tensor, y: torch.Tensor, recipe: str | None,
                 targets: torch.Tensor | None = None,
                 keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, margin or cross-entropy, reconstruction) for one batch, all on the device.

    ``recipe``: `capsnet_loss`'s recipe for a CapsNet, None for a CNN (`loss_recipe(cfg)`).
    MultiMNIST: y (B, 2) and ``targets`` (B, 2, 1, S, S), each digit alone; its CNN takes the
    margin loss on raw outputs with both classes positive (the official code's default loss).
    ``keep``: a CNN's dropout mask (`BaselineCNN.dropout_keep`), None where the model has none.
    """
    if recipe is None:
        scores = (model(x) if keep is None else model(x, keep)).float()  # (B, K)
        loss = margin_loss(scores, y) if y.dim() == 2 else F.cross_entropy(scores, y)
        return loss, loss, torch.zeros((), device=x.device)
    return capsnet_loss(model(x, y), x, y, recipe, targets)


class LossOf(nn.Module):
    """One model and its loss as one module (the gradient checks and the step-time bench of a
    single model use it; training goes through `SeedStack`)."""

    def __init__(self, model: nn.Module, recipe: str | None):
        super().__init__()
        self.model, self.recipe = model, recipe

    def forward(self, x: torch.Tensor, y: torch.Tensor,
                targets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return compute_loss(self.model, x, y, self.recipe, targets)


def loss_function(model: nn.Module, cfg, compile_mode: str = "default") -> nn.Module:
    """`LossOf(model)`, compiled when cfg.compile (``compile_mode``: torch.compile's mode)."""
    fn = LossOf(model, loss_recipe(cfg))
    return torch.compile(fn, mode=compile_mode) if cfg.compile else fn


def stack_batches(batches: list[Batch]) -> Batch:
    """S seeds' batches as one, each field with a leading seed axis: x (S, B, 1, H, W), …"""
    if len(batches) == 1:  # a separate run: a view, no per-step copy of the batch
        return Batch(*(None if t is None else t.unsqueeze(0) for t in batches[0]))
    return Batch(*(None if parts[0] is None else torch.stack(parts) for parts in zip(*batches)))




def conv2d_as_matmul(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` as im2col and a matrix product: (B, C, H, W) -> (B, O, H', W').

    Unfold gathers every k×k patch, (B, C·k·k, L) with L = H'·W', and the flattened kernel (O, C·k·k)
    multiplies it. Under vmap over seeds, where weight and input are both batched, the product is
    one batched matmul instead of a grouped convolution. The same sums in another order: within
    float rounding of conv2d (tests/stacks.py states the bound)."""
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ValueError(f"conv2d_as_matmul takes ungrouped, zero-padded convolutions with numeric padding, not {conv}")
    b, _, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv.kernel_size, conv.stride, conv.padding, conv.dilation
    cols = F.unfold(x, (kh, kw), dilation=conv.dilation, padding=conv.padding, stride=conv.stride)  # (B, C·k·k, L)
    out = conv.weight.flatten(1) @ cols  # (B, O, L)
    if conv.bias is not None:
        out = out + conv.bias[:, None]
    h_out, w_out = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return out.view(b, -1, h_out, w_out)  # (B, O, H', W')


def convs_as_matmul(model: nn.Module) -> nn.Module:
    """``model`` with every Conv2d computing through `conv2d_as_matmul` (set once: no per-step patching,
    nothing for torch.compile to guard on)."""
    for conv in model.modules():
        if isinstance(conv, nn.Conv2d):
            conv.forward = lambda x, conv=conv: conv2d_as_matmul(conv, x)
    return model


class SeedStreams:
    """One CUDA stream per seed (the ``streams`` layout): `fork` makes every seed's stream wait for
    what the current stream has queued (the batches), `on(k)` runs seed k's work on its own stream,
    `join` makes the current stream wait for every seed's. Forked all before any seed's work and
    joined all after it, so no seed waits for another. Autograd runs each backward kernel on its
    forward's stream and waits where a gradient crosses streams (PyTorch's "stream semantics of
    backward passes"), so the seeds' backward runs side by side too, and their gradients meet on
    the current stream in the stack's unbind (`SeedStack.forward`). Under capture the forked streams
    join the capture through `fork`'s wait and leave it through `join`'s. Off CUDA: no streams, the
    seeds' work in turn on the one device."""

    def __init__(self, device: torch.device, n: int):
        self.device, self.cuda = device, device.type == "cuda"
        self.streams = [torch.cuda.Stream(device) for _ in range(n)] if self.cuda else [None] * n

    def fork(self):
        """The current stream, after every seed's stream was made to wait for it (None off CUDA)."""
        if not self.cuda:
            return None
        current = torch.cuda.current_stream(self.device)
        for stream in self.streams:
            stream.wait_stream(current)
        return current

    def on(self, k: int):
        """A context in which seed k's kernels launch on its own stream."""
        return torch.cuda.stream(self.streams[k]) if self.cuda else contextlib.nullcontext()

    def join(self, current) -> None:
        """The current stream waits for every seed's stream."""
        for stream in self.streams if self.cuda else ():
            current.wait_stream(stream)


class SeedStack(nn.Module):
    """S models of one architecture as one module whose parameters are (S, …) tensors.

    ``models``: the seeds' initialised models, in seed order, on the training device (each built
    after its own `torch.manual_seed`, as a separate run builds it). The first is kept, unregistered,
    as the architecture `functional_call` runs; `seed_weights(k)` gives seed k's state dict back.
    ``layout``: "fused" evaluates the seeds at once (vmap), "bmm" too with the convolutions as
    matrix products, "loop" one after another, "streams" each on its own CUDA stream, side by side
    (`SeedStreams`; one after another on a CPU).
    """

    def __init__(self, models: list[nn.Module], recipe: str | None, layout: str = "fused"):
        super().__init__()
        if layout not in STACK_LAYOUTS:
            raise ValueError(f"layout must be one of {STACK_LAYOUTS}, got {layout!r}")
        self.layout = layout
        if any(dict(m.named_buffers()) for m in models):
            raise ValueError("SeedStack stacks parameters only; these models have buffers")
        if any(isinstance(m, nn.Dropout) for m in models[0].modules()) and not hasattr(models[0], "dropout_keep"):
            raise ValueError(f"{type(models[0]).__name__} has dropout but no dropout_keep(batch, generator): its masks "
                             "would come from the global generator, which neither stacking nor resume reproduces")
        self.__dict__["template"] = models[0]  # not a submodule: its own weights are not trained
        # what the stacked forward calls: the template itself, or (bmm) a copy whose convolutions are
        # matrix products; scoring and saving (`seed_model`) keep the template's own convolutions
        self.__dict__["stacked"] = convs_as_matmul(copy.deepcopy(models[0])) if layout == "bmm" else models[0]
        self.recipe, self.seeds = recipe, len(models)
        self.names = [name for name, _ in models[0].named_parameters()]
        per_model = [dict(m.named_parameters()) for m in models]
        # S = 1 keeps the parameter's memory layout (channels_last included): a view, no copy
        self.weights = nn.ParameterList(
            nn.Parameter(per_model[0][n].detach().unsqueeze(0) if len(models) == 1
                         else torch.stack([p[n].detach() for p in per_model]))  # (S, …)
            for n in self.names)
        self.__dict__["compiled_one"] = None  # `_one` compiled (`compiled`, the streams layout), else None
        self.__dict__["seed_streams"] = None  # SeedStreams, made on the first streams forward's device

    def seed_weights(self, k: int) -> dict[str, torch.Tensor]:
        """Seed k's parameters under the model's own names (views of the stack)."""
        return {n: w[k] for n, w in zip(self.names, self.weights)}

    def seed_model(self, k: int) -> nn.Module:
        """The architecture holding seed k's current weights (a copy), for scoring and saving."""
        with torch.no_grad():
            self.template.load_state_dict({n: w.detach() for n, w in self.seed_weights(k).items()})
        return self.template

    def dropout_keep(self, batch: int, generator: torch.Generator) -> torch.Tensor | None:
        """One seed's dropout mask for a step, from its generator; None for a model without dropout."""
        draw = getattr(self.template, "dropout_keep", None)
        return None if draw is None else draw(batch, generator)

    def _one(self, weights: dict, x, y, targets, keep, template: nn.Module | None = None) -> torch.Tensor:
        model = lambda *args: functional_call(template or self.template, weights, args)  # noqa: E731
        return torch.stack(compute_loss(model, x, y, self.recipe, targets, keep))  # (3,)

    def forward(self, batch: Batch, keep: torch.Tensor | None) -> torch.Tensor:
        """batch: x (S, B, 1, H, W), labels (S, B[, T]), targets (S, B, T, 1, H, W) or None; keep
        (S, B, F) or None -> per-seed (total, margin or cross-entropy, reconstruction) (S, 3)."""
        if self.seeds > 1 and self.layout == "streams":
            return self._on_streams(batch, keep)
        if self.seeds == 1 or self.layout == "loop":  # one seed is the loop of one: no vmap
            return torch.stack([self._one(self.seed_weights(k), *self._seed_inputs(batch, keep, k))
                                for k in range(self.seeds)])  # (S, 3)
        weights = {n: w for n, w in zip(self.names, self.weights)}
        in_dims = (0, 0, 0, None if batch.targets is None else 0, None if keep is None else 0)
        one = lambda *args: self._one(*args, template=self.stacked)  # noqa: E731
        return vmap(one, in_dims=in_dims)(weights, batch.x, batch.labels, batch.targets, keep)  # (S, 3)

    @staticmethod
    def _seed_inputs(batch: Batch, keep: torch.Tensor | None, k: int) -> tuple:
        """Seed k's (x, labels, targets or None, dropout mask or None) from the stacked batch and masks."""
        return (batch.x[k], batch.labels[k], None if batch.targets is None else batch.targets[k],
                None if keep is None else keep[k])

    def _on_streams(self, batch: Batch, keep: torch.Tensor | None) -> torch.Tensor:
        """The streams layout's forward: each seed's loss (`_one`, compiled by `compiled`) on its own
        stream. The seeds' weights are one unbind of each stacked parameter, on the current stream, so
        that backward stacks the S seeds' gradients into the (S, …) gradient there once (S select views
        would each write a whole (S, …) gradient to be summed)."""
        if self.seed_streams is None or self.seed_streams.device != batch.x.device:
            self.__dict__["seed_streams"] = SeedStreams(batch.x.device, self.seeds)
        streams, one = self.seed_streams, self.compiled_one or self._one
        per_seed = [dict(zip(self.names, ws)) for ws in zip(*(w.unbind(0) for w in self.weights))]
        current = streams.fork()
        parts = []
        for k in range(self.seeds):
            with streams.on(k):
                parts.append(one(per_seed[k], *self._seed_inputs(batch, keep, k)))  # (3,)
        streams.join(current)
        return torch.stack(parts)  # (S, 3)


def compiled(stack: SeedStack, mode: str = "default") -> nn.Module:
    """What the loop calls for train.compile (``mode``: torch.compile's): the whole stack compiled as
    one graph, or, in the streams layout, the stack itself with each seed's loss compiled, since a
    compiled graph launches its kernels on one stream (the seeds' would queue one behind another)."""
    if stack.layout == "streams" and stack.seeds > 1:
        stack.__dict__["compiled_one"] = torch.compile(stack._one, mode=mode)
        return stack
    return torch.compile(stack, mode=mode)
