"""`capsnet bench`: training and inference throughput of the real training step, beside a
reference loop run the way popular re-implementations run it (eager fp32, a torchvision
DataLoader with per-sample ToTensor and a random ±2 px crop, batch 128).

FLOP per image are counted, not estimated: torch.utils.flop_counter.FlopCounterMode over one
training step (forward + backward of convs, matmuls and einsums) divided by the batch size.
Timing synchronises the device at the edges of the timed loop only.
"""

from __future__ import annotations

import dataclasses
import resource
import time

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.flop_counter import FlopCounterMode

from pipeline.core.errors import first_line
from pipeline.core.params import BENCH_MODES
from pipeline.core.provenance import git_commit, repo_root
from pipeline.data.idx import MNIST_SIZE
from pipeline.training.profile import profile_steps
from pipeline.training.config import RunConfig
from pipeline.training.train import (
    build_group, build_model, compiled, compute_loss, configure_backends, loss_recipe, make_optimizer, make_step, predict,
    resolve_device,
)

EPOCH_IMAGES = 60_000


MODES = BENCH_MODES  # --mode: the train.* speed settings of each name


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB -> MiB


def flop_per_image(cfg: RunConfig, device: torch.device, batch: int = 8) -> float:
    """FLOP of one training step (forward + backward) per image, counted by FlopCounterMode."""
    model = build_model(cfg).to(device)
    images = torch.randint(0, 256, (batch, cfg.image_size, cfg.image_size), dtype=torch.uint8, device=device)
    labels = torch.randint(0, cfg.num_classes, (batch,), device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _, _ = compute_loss(model, images.unsqueeze(1).float() / 255, labels, loss_recipe(cfg))
        loss.backward()
    return counter.get_total_flops() / batch


def random_data(cfg: RunConfig, n: int, device: torch.device) -> dict[str, torch.Tensor]:
    """n random uint8 examples of what cfg's experiment draws from (its `synthetic_data`)."""
    return cfg.experiment_module().synthetic_data(cfg, n, device)


def bench_step(cfg: RunConfig, steps: int, warmup: int, generator_seed: int = 0,
               compile_mode: str = "default", seeds: int = 1, layout: str = "fused", profile: int = 0) -> dict:
    """Time the training step `capsnet train` runs (`train.make_step`: every seed's batch drawn, one
    stacked step; captured as one CUDA graph under cfg.cuda_graph) and inference, on random uint8
    data; ``seeds`` seeds stacked (1: a separate run) in ``layout`` (`pipeline.training.stack.SeedStack`).

    The first warm-up step includes compilation; its wall time is returned as first_step_s (None
    without warm-up steps: then the timed steps include it). A captured step is captured after
    its own eager warm-up steps (pipeline.training.steps.WARMUP_STEPS), within ``warmup`` when it
    is larger. train_images_per_s counts every seed's images (aggregate); per_seed_images_per_s one seed's.
    ``profile`` > 0: that many more steps under torch.profiler after the timed ones, where their time
    went as the row's "profile" (`pipeline.training.profile`; the timing does not include them).
    """
    device = resolve_device(cfg.device)
    amp = cfg.amp and device.type == "cuda"
    configure_backends(cfg, device)
    cfgs = [dataclasses.replace(cfg, seed=generator_seed + k, stack_layout=layout) for k in range(seeds)]
    stack, optimizer, scheduler, generators = build_group(cfgs, device)
    loss_fn = compiled(stack, compile_mode) if cfg.compile else stack
    n = cfg.batch_size * (steps + warmup + profile)
    exp = cfg.experiment_module().Training(cfg, random_data(cfg, n, device), device)
    step = make_step(cfg, exp, stack, loss_fn, optimizer, scheduler, generators, amp, device)
    step.begin_epoch(0, [exp.epoch_order(g) for g in generators], torch.ones(seeds, device=device))

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0, first_step_s = time.perf_counter(), None
    for k in range(warmup):
        step()
        if k == 0:
            _sync(device)
            first_step_s = time.perf_counter() - t0
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    train_seconds = time.perf_counter() - t0
    captured = step.graph is not None
    where = None
    if profile:  # a profiler that fails (CUPTI on a machine that refuses it, say) costs the row its profile only
        try:
            where = profile_steps(step, profile, device)
        except Exception as err:  # noqa: BLE001  (the message goes into the row)
            where = {"error": f"{type(err).__name__}: {first_line(err)}", "steps": profile}
    # whole eval batches only: a last partial batch is a new shape, and cuDNN autotuning (deterministic:
    # false) would time its algorithm search
    images = exp.test_images  # (n, S, S); MultiMNIST's are the 28×28 digits its recipes index
    pad = (cfg.image_size - images.shape[-1]) // 2
    images = torch.nn.functional.pad(images, (pad,) * 4)  # (n, image_size, image_size)
    infer = images[: max(n // cfg.eval_batch_size, 1) * cfg.eval_batch_size]
    model = stack.seed_model(0)
    predict(model, infer[: cfg.eval_batch_size], cfg.eval_batch_size, amp)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    predict(model, infer, cfg.eval_batch_size, amp)
    _sync(device)
    infer_seconds = time.perf_counter() - t0
    images_per_s = seeds * steps * cfg.batch_size / train_seconds
    return {"seeds": seeds, "train_images_per_s": images_per_s, "per_seed_images_per_s": images_per_s / seeds,
            "ms_per_step": 1000 * train_seconds / steps, "s_per_epoch": seeds * EPOCH_IMAGES / images_per_s,
            "peak_memory_mb": _peak_memory_mb(device), "inference_images_per_s": infer.shape[0] / infer_seconds,
            "first_step_s": first_step_s, "captured": captured, **({"profile": where} if where else {})}


class _TensorDigits(Dataset):
    """MNIST-like uint8 tensors served one sample at a time, as torchvision's MNIST does."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, k: int):
        return self.transform(self.images[k].unsqueeze(0)), int(self.labels[k])


def bench_reference(cfg: RunConfig, steps: int, warmup: int, workers: int = 0) -> dict:
    """The popular implementations' loop: eager fp32, DataLoader, per-sample ToTensor + random crop."""
    from torchvision.transforms import v2  # here: torchvision's import (about 2 s, torch._dynamo's) only where it is used

    device = resolve_device(cfg.device)
    torch.manual_seed(0)
    model = build_model(cfg).to(device)
    optimizer, _ = make_optimizer(model, cfg, device)
    n = cfg.batch_size * (steps + warmup)
    images = torch.randint(0, 256, (n, MNIST_SIZE, MNIST_SIZE), dtype=torch.uint8)
    labels = torch.randint(0, cfg.num_classes, (n,))
    # ±max_shift px at 28×28; on a larger canvas, padding by the difference makes the crop a random placement
    padding = cfg.max_shift if cfg.image_size == MNIST_SIZE else cfg.image_size - MNIST_SIZE
    transform = v2.Compose([v2.RandomCrop(cfg.image_size, padding=padding), v2.ToDtype(torch.float32, scale=True)])
    loader = DataLoader(_TensorDigits(images, labels, transform), batch_size=cfg.batch_size, shuffle=True,
                        num_workers=workers, drop_last=True)
    t0 = None
    for k, (x, y) in enumerate(loader):
        if k == warmup:
            _sync(device)
            t0 = time.perf_counter()
        x, y = x.to(device), y.to(device)
        loss, _, _ = compute_loss(model, x, y, loss_recipe(cfg))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()  # the per-step host read these loops do for logging
    _sync(device)
    images_per_s = steps * cfg.batch_size / (time.perf_counter() - t0)
    return {"train_images_per_s": images_per_s, "ms_per_step": 1000 * cfg.batch_size / images_per_s,
            "s_per_epoch": EPOCH_IMAGES / images_per_s, "peak_memory_mb": _peak_memory_mb(device)}


def device_name(dev: torch.device) -> str:
    """The device as bench rows name it: the GPU's model ("NVIDIA H100 80GB HBM3"), or the CPU's threads."""
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


def device_slug(name: str) -> str:
    """A device name as a folder name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3" (reports/bench/)."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def run(params, variant: str, batch_sizes: tuple[int, ...], modes: tuple[str, ...], steps: int, warmup: int,
        reference: bool, deterministic: str, device: str, seeds: tuple[int, ...] = (1,),
        layouts: tuple[str, ...] = ("fused",), profile: int = 0):
    """Yield one row per (batch, mode, seeds stacked, layout), the reference loop first when asked:
    what `capsnet bench` prints. Rows with seeds > 1 carry their layout and speedup_vs_separate: their
    aggregate images/s over the one-seed row's (S separate runs one after another train at the
    one-seed rate). ``profile`` > 0: each timed row also says where that many steps' time went."""
    import datetime

    from pipeline.training.config import run_config

    dev = resolve_device(device)
    base = run_config(params, variant, 0, profile="bench", epochs=1, batch_size=batch_sizes[0], amp=False,
                      compile=False, device=str(dev))
    if deterministic != "params":
        base = dataclasses.replace(base, deterministic=deterministic == "on")
    flop = flop_per_image(base, dev)
    common = {"device": device_name(dev), "variant": variant, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
              "commit": git_commit(repo_root()), "deterministic": base.deterministic, "flop_per_image_train": flop}

    def row(values: dict) -> dict:
        values["tflop_per_s"] = values["train_images_per_s"] * flop / 1e12
        return {**common, **{k: round(x, 3) if isinstance(x, float) else x for k, x in values.items()}}

    for batch in batch_sizes:
        ref = None
        if reference:
            ref = bench_reference(dataclasses.replace(base, batch_size=batch), steps, warmup)
            yield row({"mode": "reference", "batch": batch, **ref})
        for mode in modes:
            amp, compile_mode, channels_last, cuda_graph = MODES[mode]
            cfg = dataclasses.replace(base, batch_size=batch, amp=amp and dev.type == "cuda",
                                      compile=compile_mode is not None, channels_last=channels_last, cuda_graph=cuda_graph)
            single = None
            for s, layout in [(s, layout) for s in seeds for layout in (layouts if s > 1 else ("fused",))]:
                result = bench_step(cfg, steps, warmup, compile_mode=compile_mode or "default", seeds=s,
                                    layout=layout, profile=profile)
                if ref:
                    result["speedup_vs_reference"] = result["train_images_per_s"] / ref["train_images_per_s"]
                if s == 1:
                    single = result["train_images_per_s"]
                else:
                    result["stack"] = layout
                    if single:
                        result["speedup_vs_separate"] = result["train_images_per_s"] / single
                yield row({"mode": mode, "batch": batch, **result})
                torch._dynamo.reset()  # each configuration compiles afresh; the on-disk cache still helps
