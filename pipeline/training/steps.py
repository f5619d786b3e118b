"""One optimiser step of every seed, as the training loop runs it: eagerly (`EagerStep`) or as one
capturable function of static device buffers (`CapturedStep`, train.cuda_graph).

Both do, per step: every seed's batch from its own epoch order and generator (its augmentation and
dropout mask too), the stacked forward, backward of the **sum** of the active seeds' losses, Adam,
the learning-rate decay, and the per-seed loss parts and first non-finite step kept on the device;
the loop reads them back every ``log_every`` steps and at the end of the epoch.

`CapturedStep` keeps everything a step reads or advances in tensors that live as long as the
process, so the same kernels with the same pointers serve every step: the step within the epoch
and the global step are device counters the step itself advances; the batch is gathered from a
static (S, N) buffer of the epoch's orders by the counter (the loop copies each epoch's new order
into it, outside the step); the learning rate is a device tensor the step reads from a table of
the schedule's values (the same `lr · λ(step)` LambdaLR computes, evaluated once on the host)
indexed by the global counter; Adam is fused and capturable on CUDA. On CUDA the step runs
eagerly WARMUP_STEPS times on a side stream (compilation, cuDNN autotuning, Adam's state), is then
captured once with `torch.cuda.graph`, the seeds' generators registered with the graph so that
each replay draws what an eager step would draw, and replayed for every later step. On the CPU
the same function runs eagerly every step: the CPU tests run every line of it but the capture.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from pipeline.core.errors import first_line
from pipeline.training.experiment import Batch, Experiment
from pipeline.training.stack import SeedStack, stack_batches

WARMUP_STEPS = 3  # eager steps before the capture (PyTorch's whole-network capture example uses 3)


def training_step(loss_fn: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, batch: Batch,
                  keep: torch.Tensor | None, active: torch.Tensor, amp: bool, cache: bool = True) -> torch.Tensor:
    """One optimiser step of every seed: loss, backward of the **sum** of the active seeds' losses,
    Adam, lr decay (``scheduler``; None where the step sets the learning rate itself). ``loss_fn``
    is a `SeedStack` (compiled or not), ``batch`` the seeds' stacked batches, ``active`` (S,) 1.0 for
    a seed still training, 0.0 for one early stopping has finished; ``cache``: autocast's cache of
    cast weights (off in a captured step). Returns each seed's (total, margin or cross-entropy,
    reconstruction) (S, 3), detached on the device (no sync). The same function runs in `capsnet
    train` and `capsnet bench`."""
    with torch.autocast(batch.x.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=cache):
        parts = loss_fn(batch, keep)  # (S, 3)
    optimizer.zero_grad(set_to_none=True)
    (parts[:, 0] * active).sum().backward()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return parts.detach()


def draw_step(exp: Experiment, stack: SeedStack, orders: list, step: int | torch.Tensor,
              generators: list[torch.Generator]) -> tuple[Batch, torch.Tensor | None]:
    """Every seed's batch and dropout mask for ``step`` (an int, or a device counter), each from its
    own generator in the order a separate run draws them: the batch (and its augmentation), then the mask."""
    batches, keeps = [], []
    for order, generator in zip(orders, generators):
        batches.append(exp.batch(order, step, generator))
        keeps.append(stack.dropout_keep(batches[-1].x.shape[0], generator))
    return stack_batches(batches), None if keeps[0] is None else torch.stack(keeps)  # (S, B, F)


class _Step:
    """What both steps share: their parts, and the epoch's tallies the loop reads back, kept on the
    device in buffers that live as long as the process: each active seed's summed loss parts and the
    global step of its first non-finite loss, the global step counter itself."""

    graph = None  # the captured CUDA graph (a `CapturedStep` on CUDA, once captured)

    def __init__(self, exp: Experiment, stack: SeedStack, loss_fn, optimizer, scheduler,
                 generators: list[torch.Generator], amp: bool, steps_per_epoch: int, device: torch.device):
        self.exp, self.stack, self.loss_fn, self.optimizer, self.scheduler = exp, stack, loss_fn, optimizer, scheduler
        self.generators, self.amp, self.steps_per_epoch, self.device = generators, amp, steps_per_epoch, device
        n_seeds = len(generators)
        self.active = torch.ones(n_seeds, device=device)  # (S,) 1.0 while a seed trains, 0.0 once it stopped
        self.sums = torch.zeros(n_seeds, 3, device=device)  # (S, 3) per seed: total, margin, reconstruction
        self.first_bad = torch.full((n_seeds,), -1, device=device, dtype=torch.long)  # (S,) -1: none yet
        self.global_step = torch.zeros((), dtype=torch.long, device=device)

    def begin_epoch(self, epoch: int, orders: list, active: torch.Tensor) -> None:
        """The epoch's active seeds, its tallies at zero, the global counter at its first step."""
        self.active.copy_(active)
        self.sums.zero_()
        self.first_bad.fill_(-1)
        self.global_step.fill_(epoch * self.steps_per_epoch)

    def _tally(self, parts: torch.Tensor) -> None:
        """A step's (S, 3) loss parts into the epoch's sums, the first non-finite step of each active
        seed kept, the global counter advanced; on the device, no sync."""
        bad = ~torch.isfinite(parts[:, 0]) & (self.active > 0) & (self.first_bad < 0)  # (S,)
        self.first_bad.copy_(torch.where(bad, self.global_step, self.first_bad))
        self.sums.add_(parts)
        self.global_step.add_(1)


class EagerStep(_Step):
    """The step as the loop has always run it: the step within the epoch a host integer, LambdaLR
    stepped after Adam."""

    def begin_epoch(self, epoch: int, orders: list, active: torch.Tensor) -> None:
        super().begin_epoch(epoch, orders, active)
        self.orders, self.i = orders, 0

    def __call__(self) -> None:
        batch, keep = draw_step(self.exp, self.stack, self.orders, self.i, self.generators)
        self._tally(training_step(self.loss_fn, self.optimizer, self.scheduler, batch, keep, self.active, self.amp))
        self.i += 1

    def last_lr(self, steps_done: int) -> float:
        """The learning rate of the next step, after ``steps_done`` steps in all."""
        return self.scheduler.get_last_lr()[0]

    def end_epoch(self, steps_done: int) -> None:
        """Nothing: the scheduler was stepped with every step."""


@contextlib.contextmanager
def tensor_lr(optimizer: torch.optim.Optimizer, lr: torch.Tensor):
    """The optimizer reads ``lr`` (a device tensor) inside the block, its float learning rate
    outside it: the scheduler and the checkpoint keep seeing floats, as in an eager run."""
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = lr
    try:
        yield
    finally:
        for group, value in zip(optimizer.param_groups, saved):
            group["lr"] = value


class CapturedStep(_Step):
    """train.cuda_graph: the whole step as a function of static buffers (module docstring); captured
    on CUDA, run eagerly elsewhere. ``lr_values``: the learning rate of every global step of the
    run (and one past the last), `pipeline.training.train.schedule`."""

    def __init__(self, exp: Experiment, stack: SeedStack, loss_fn, optimizer, scheduler,
                 generators: list[torch.Generator], amp: bool, steps_per_epoch: int, device: torch.device,
                 lr_values: list[float]):
        super().__init__(exp, stack, loss_fn, optimizer, scheduler, generators, amp, steps_per_epoch, device)
        self.capture = device.type == "cuda"
        self.lr_values = lr_values
        self.lr_table = torch.tensor(lr_values, dtype=torch.float64, device=device)  # (T + 1,)
        # fused Adam on CUDA reads a float32 learning rate; the CPU's reads the double the table holds
        self.lr = torch.zeros((), dtype=torch.float32 if self.capture else torch.float64, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)  # within the epoch
        self.orders: torch.Tensor | None = None  # (S, N), allocated by the first epoch, refilled by the next
        self.order_rows: list = [None] * len(generators)  # each seed's row of it (views)
        self.eager_steps = 0
        if self.capture:
            for group in optimizer.param_groups:
                group["capturable"] = True  # a checkpoint's param groups may have said otherwise

    def begin_epoch(self, epoch: int, orders: list, active: torch.Tensor) -> None:
        """The epoch's orders, the active seeds and the counters into the static buffers (outside the graph)."""
        super().begin_epoch(epoch, orders, active)
        if orders[0] is not None and self.orders is None:  # None: every batch is drawn fresh
            self.orders = torch.stack(orders)  # (S, N)
            self.order_rows = list(self.orders.unbind(0))
        elif orders[0] is not None:
            torch.stack(orders, out=self.orders)
        self.step.zero_()

    def run(self) -> None:
        """The step itself: what is captured, and what runs eagerly on the CPU."""
        batch, keep = draw_step(self.exp, self.stack, self.order_rows, self.step, self.generators)
        self.lr.copy_(self.lr_table.index_select(0, self.global_step.view(1)).squeeze(0))
        with tensor_lr(self.optimizer, self.lr):
            self._tally(training_step(self.loss_fn, self.optimizer, None, batch, keep, self.active, self.amp,
                                      cache=False))
        self.step.add_(1)

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        elif not self.capture:
            self.run()
        elif self.eager_steps < WARMUP_STEPS:
            self._warm_up()
        else:
            self._capture()

    def _warm_up(self) -> None:
        """One eager step on a side stream, as capture wants (PyTorch's CUDA graphs notes)."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*capturable=True.*")  # Adam: 'capturable, run uncaptured'
            self.run()
        current.wait_stream(side)
        self.eager_steps += 1

    def _capture(self) -> None:
        """Capture the step once (nothing runs while capturing) and replay it for this step. If the
        capture fails, say so in one line and go on uncaptured from the same state."""
        saved = [g.get_state() for g in self.generators]
        graph = torch.cuda.CUDAGraph()
        try:
            for generator in self.generators:
                graph.register_generator_state(generator)
            self.optimizer.zero_grad(set_to_none=True)  # backward allocates the gradients from the graph's pool
            with torch.cuda.graph(graph):
                self.run()
        except Exception as err:  # noqa: BLE001 (any failure: the step is not capturable here)
            for generator, state in zip(self.generators, saved):
                generator.set_state(state)
            warnings.warn(f"train.cuda_graph: capturing the step failed ({first_line(err)}); training on uncaptured, "
                          "the same step run eagerly", stacklevel=3)
            self.capture = False
            for group in self.optimizer.param_groups:
                group["capturable"] = False
            self.run()
            return
        self.graph = graph
        graph.replay()

    def last_lr(self, steps_done: int) -> float:
        """The learning rate of the next step, after ``steps_done`` steps in all (from the table: no sync)."""
        return self.lr_values[steps_done]

    def end_epoch(self, steps_done: int) -> None:
        """Bring the scheduler to ``steps_done`` (its last_lr, its checkpointed state), as if it had
        been stepped with every step."""
        self.scheduler.last_epoch = steps_done - 1
        self.scheduler.step()
