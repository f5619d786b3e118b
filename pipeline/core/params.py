"""Strict loading of params.yaml into frozen dataclasses.

One section per stage plus ``base`` (seed, profile) and ``ablation`` (which variants and seeds
DVC's matrix expands). Every key must be known, present, of the annotated type and in range;
anything else fails before any work with a message naming the key, e.g.
``variants.capsnet_r1.routing_iterations must be >= 1, got 0``.

The committed params.yaml is the paper protocol. Other profiles (smoke, gpu) are DVC overrides
(``dvc exp run -S key=value``, see the Makefile), so every profile runs the same code path.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from pipeline.core import registry
from pipeline.core.errors import UserError
from pipeline.core.protocol import PRECISIONS


class ParamsError(UserError, ValueError):
    """params.yaml is malformed; the message names the key and what to do."""


def _range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> dict:
    return {"lo": lo, "hi": hi, "lo_open": lo_open}


PROFILES = ("paper", "paper-gpu", "gpu", "smoke")
MODELS = ("baseline_cnn", "capsnet", "pooling_cnn", "multimnist_cnn")
STACK_LAYOUTS = ("fused", "bmm", "loop", "streams")  # how stacked seeds run: pipeline.training.stack.SeedStack
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
GRAPHED_COMPILE_MODES = ("reduce-overhead", "max-autotune")  # the modes that capture CUDA graphs of their own
RECIPES = ("paper", "official")  # pipeline.models.capsnet.RECIPES (kept here so params.py does not import torch)


class BenchMode(NamedTuple):
    """The train.* speed settings a `capsnet bench --mode` times (pipeline.training.bench)."""

    amp: bool  # bf16 autocast
    compile_mode: str | None  # torch.compile's mode (train.compile_mode), None: eager
    channels_last: bool = False  # NHWC convolutions
    cuda_graph: bool = False  # the whole step captured as one CUDA graph (pipeline.training.steps)


# "graphs" adds torch.compile's own CUDA graphs (reduce-overhead); "autotune" searches kernels without
# graphs (max-autotune-no-cudagraphs); "cl" puts the convolutions in NHWC; "capture" captures the whole
# step, Adam and the batch draws included, as one CUDA graph (train.cuda_graph). Here, not beside the
# bench, so that the CLI and scripts/gpu_levers.py read them without importing torch.
BENCH_MODES = {
    "fp32": BenchMode(False, None), "bf16": BenchMode(True, None), "compile": BenchMode(False, "default"),
    "bf16-compile": BenchMode(True, "default"), "bf16-graphs": BenchMode(True, "reduce-overhead"),
    "bf16-cl": BenchMode(True, None, True), "bf16-compile-cl": BenchMode(True, "default", True),
    "bf16-autotune": BenchMode(True, "max-autotune-no-cudagraphs"),
    "bf16-capture": BenchMode(True, None, cuda_graph=True),
    "bf16-compile-capture": BenchMode(True, "default", cuda_graph=True),
    # fp32 (TF32 off: train.tf32) captured: the precision check's fp32 twin (#36 item 6) and the paper-gpu profile
    "capture": BenchMode(False, None, cuda_graph=True), "compile-capture": BenchMode(False, "default", cuda_graph=True),
}


def bench_mode_name(amp: bool, compile_mode: str | None, channels_last: bool = False,
                    cuda_graph: bool = False) -> str | None:
    """The BENCH_MODES name of these train.* speed settings (``compile_mode`` None: not compiled), None
    if no bench mode is them: what a run's config or a profile trains with, named as the bench rows are."""
    wanted = BenchMode(bool(amp), compile_mode, bool(channels_last), bool(cuda_graph))
    return next((name for name, mode in BENCH_MODES.items() if mode == wanted), None)


@dataclass(frozen=True)
class BaseParams:
    seed: int = field(metadata=_range(0))
    profile: str = "paper"

    def check(self, where: str) -> None:
        if self.profile not in PROFILES:
            raise ParamsError(f"{where}.profile must be one of {PROFILES}, got {self.profile!r}")


@dataclass(frozen=True)
class PrepareParams:
    train_subset: int = field(metadata=_range(0))  # 0 = all 60,000 training digits
    test_subset: int = field(metadata=_range(0))  # 0 = all 10,000 test digits
    affine_seed: int = field(metadata=_range(0))
    max_rotation_deg: float = field(metadata=_range(0, 180))
    max_shear: float = field(metadata=_range(0, 1))
    min_scale: float = field(metadata=_range(0.1, 10))
    max_scale: float = field(metadata=_range(0.1, 10))
    montage_count: int = field(metadata=_range(1, 64))
    expanded_seed: int = field(metadata=_range(0))  # §5.2 expanded MNIST: digit positions on the 40×40 canvas
    affnist_seed: int = field(metadata=_range(0))  # §5.2 affNIST-style set: its transforms
    affnist_transforms: int = field(metadata=_range(1, 64))  # transforms per test digit (affNIST: 32)
    multimnist_pairs_per_digit: int = field(metadata=_range(1))  # MultiMNIST test recipes per test digit (paper: 1,000)
    multimnist_max_shift: int = field(metadata=_range(0, 8))  # each digit's shift, px each way (paper 4; official README 6)
    multimnist_seed: int = field(metadata=_range(0))  # the MultiMNIST test recipes

    def check(self, where: str) -> None:
        if self.min_scale > self.max_scale:
            raise ParamsError(
                f"{where}.min_scale ({self.min_scale}) must be <= {where}.max_scale ({self.max_scale})"
            )


@dataclass(frozen=True)
class TrainParams:
    epochs: int = field(metadata=_range(1))
    batch_size: int = field(metadata=_range(1))
    lr: float = field(metadata=_range(0, 1, lo_open=True))
    lr_decay_rate: float = field(metadata=_range(0, 1, lo_open=True))
    lr_decay_steps: int = field(metadata=_range(1))
    lr_min: float = field(metadata=_range(0))
    max_shift: int = field(metadata=_range(0, 8))
    # 0: the schedule decays at its own pace (lr · rate^(step / decay_steps)); E > 0: the decay of E
    # epochs is compressed into `epochs` (exponent × E / epochs), so a short run ends at the learning
    # rate the E-epoch schedule ends at (the gpu profile: the paper's 640 epochs into 50)
    lr_schedule_epochs: int = field(default=0, metadata=_range(0))
    amp: bool = False  # bf16 autocast (CUDA only; ignored with a warning on CPU)
    # TensorFloat-32 for CUDA's fp32 matmuls and cuDNN convolutions (10-bit mantissas). false: fp32 is
    # fp32 (torch's own default leaves cuDNN's on); precision, so inside the checkpoint's key
    tf32: bool = False
    compile: bool = False  # torch.compile the model
    # with compile: compile the CNN baselines too (false: they run eager; on an H100 eager bf16 trains
    # them 8–10 % faster than compiled, reports/benchmarks.md); the CapsNets are compiled either way
    compile_cnns: bool = True
    # torch.compile's mode (a speed lever, not mathematics): default | reduce-overhead (CUDA graphs) |
    # max-autotune | max-autotune-no-cudagraphs; `capsnet bench --mode` times them
    compile_mode: str = "default"
    # how stacked seeds run (pipeline.training.stack): fused (vmap: grouped convolutions), bmm (vmap, the
    # convolutions as batched matrix products) or loop (each seed's kernels in turn); a speed lever
    stack_layout: str = "fused"
    # the whole optimiser step of every seed captured once as one CUDA graph and replayed
    # (pipeline.training.steps.CapturedStep): a speed lever; on a CPU the same step runs uncaptured
    cuda_graph: bool = False
    # convolution weights and activations in NHWC (channels_last): a memory layout, not mathematics;
    # cuDNN's bf16 convolutions are expected to be faster in it, not yet measured (`capsnet bench --mode bf16-cl`)
    channels_last: bool = False
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    deterministic: bool = True
    log_every: int = field(default=50, metadata=_range(1))  # steps between host reads of the loss
    eval_batch_size: int = field(default=1000, metadata=_range(1))
    checkpoint_every: int = field(default=1, metadata=_range(1))  # epochs between resume checkpoints
    multimnist_epoch_size: int = field(default=60_000, metadata=_range(1))  # MultiMNIST examples sampled per epoch

    def check(self, where: str) -> None:
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ParamsError(f"{where}.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.stack_layout not in STACK_LAYOUTS:
            raise ParamsError(f"{where}.stack_layout must be one of {', '.join(STACK_LAYOUTS)}, got {self.stack_layout!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ParamsError(f"{where}.compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if self.cuda_graph and self.compile and self.compile_mode in GRAPHED_COMPILE_MODES:
            raise ParamsError(f"{where}.cuda_graph captures the whole step, which cannot hold compile_mode "
                              f"{self.compile_mode!r}'s own CUDA graphs; set {where}.compile_mode to default or "
                              f"max-autotune-no-cudagraphs, or {where}.cuda_graph to false")


@dataclass(frozen=True)
class VariantParams:
    model: str
    routing_iterations: int = field(metadata=_range(0))
    reconstruction: bool
    # the experiment that trains, scores and reports the variant (pipeline.core.registry): table1,
    # affnist (§5.2's 40×40 canvas), multimnist (§6); params written before the key say image_size
    experiment: str = ""
    image_size: int = 0  # the experiment's own (checked against it when given)
    # early stopping: stop once the per-epoch clean-test accuracy reaches this (%); 0 = train every epoch
    target_accuracy_pct: float = field(default=0.0, metadata=_range(0, 100))
    recipe: str = "paper"  # CapsNet: the paper's text, or what the official code computes (pipeline.models.capsnet)
    # "": the train section's train.amp decides; fp32 | bf16: this variant trains in it whatever the profile
    # says (a precision twin: capsnet_r3_recon_fp32 is the gpu profile's bf16 capsnet_r3_recon in fp32)
    precision: str = ""

    def check(self, where: str) -> None:
        if self.precision not in PRECISIONS:
            raise ParamsError(f"{where}.precision must be fp32, bf16 or left out (the profile's train.amp decides), "
                              f"got {self.precision!r}")
        if self.model not in MODELS:
            raise ParamsError(f"{where}.model must be one of {MODELS}, got {self.model!r}")
        if self.recipe not in RECIPES:
            raise ParamsError(f"{where}.recipe must be one of {RECIPES}, got {self.recipe!r}")
        if self.recipe != "paper" and self.model != "capsnet":
            raise ParamsError(f"{where}: recipe {self.recipe!r} is for CapsNets; {self.model} has only recipe: paper")
        if not self.experiment and self.image_size not in registry.LEGACY_IMAGE_SIZES:
            raise ParamsError(f"{where}.experiment is missing: name one of {', '.join(registry.names())}")
        name = registry.of_record(self.experiment, self.image_size)
        try:
            experiment = registry.entry(name)
        except UserError as err:
            raise ParamsError(f"{where}.experiment: {err}") from err
        if self.image_size and self.image_size != experiment.image_size:
            raise ParamsError(f"{where}.image_size is {self.image_size} but experiment {name} takes "
                              f"{experiment.image_size}×{experiment.image_size} images; drop image_size")
        if self.model not in experiment.models:
            raise ParamsError(f"{where}: experiment {name} trains {', '.join(experiment.models)}, not {self.model}")
        object.__setattr__(self, "experiment", name)  # frozen: settled once, here
        object.__setattr__(self, "image_size", experiment.image_size)
        if self.model == "capsnet" and self.routing_iterations < 1:
            raise ParamsError(f"{where}.routing_iterations must be >= 1, got {self.routing_iterations}")
        if self.model != "capsnet" and (self.routing_iterations or self.reconstruction):
            raise ParamsError(
                f"{where}: {self.model} has no routing or reconstruction; "
                "set routing_iterations: 0 and reconstruction: false"
            )


@dataclass(frozen=True)
class AblationParams:
    """DVC's matrices: every variant is listed once, under how its seeds train."""

    seeds: tuple[int, ...]
    stacked: tuple[str, ...]   # all seeds in one process (pipeline/training/stack.py): stage train_stacked@<variant>
    separate: tuple[str, ...]  # one process per seed: stage train@<variant>-<seed>

    @property
    def variants(self) -> tuple[str, ...]:
        """Every variant the ablation trains, stacked ones first (as `capsnet stages` lists them)."""
        return self.stacked + self.separate

    def check(self, where: str) -> None:
        if not self.variants:
            raise ParamsError(f"{where}.stacked and {where}.separate list no variant between them; list at least one")
        for name in ("stacked", "separate"):
            names = getattr(self, name)
            if len(set(names)) != len(names):
                raise ParamsError(f"{where}.{name} lists a variant twice: {list(names)}")
        both = sorted(set(self.stacked) & set(self.separate))
        if both:
            raise ParamsError(f"{where}: {both[0]!r} is under both stacked and separate; a variant's seeds train "
                              "either in one process (stacked) or one process each (separate): keep it in one list")
        if not self.seeds:
            raise ParamsError(f"{where}.seeds must list at least one seed")
        if len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ParamsError(f"{where}.seeds must be distinct integers >= 0, got {list(self.seeds)}")


@dataclass(frozen=True)
class Params:
    base: BaseParams
    prepare: PrepareParams
    train: TrainParams
    ablation: AblationParams
    variants: dict[str, VariantParams]

    def variant(self, name: str) -> VariantParams:
        if name not in self.variants:
            raise ParamsError(f"unknown variant {name!r}; params.yaml defines {sorted(self.variants)}")
        return self.variants[name]


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ParamsError(f"{where} must be a list, got {value!r}")
        item_hint = typing.get_args(hint)[0]
        return tuple(_convert(v, item_hint, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"unsupported annotation {hint}")  # keep params types simple
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[hint]
    if not ok and hint is float and isinstance(value, str) and _is_number(value):
        mantissa, _, exponent = value.lower().partition("e")
        fixed = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent}"
        raise ParamsError(f"{where} is the string {value!r}: YAML reads a number in e-notation without a '.' "
                          f"as text; write {fixed}")
    if not ok:
        raise ParamsError(f"{where} must be of type {hint.__name__}, got {value!r}")
    return float(value) if hint is float else value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load_section(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ParamsError(f"{where} must be a mapping of keys, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParamsError(f"unknown key {where}.{unknown[0]}; known keys: {sorted(fields)}")
    values = {}
    for name, f in fields.items():
        key = f"{where}.{name}"
        if name not in raw:
            if f.default is dataclasses.MISSING:
                raise ParamsError(f"missing key {key} in params.yaml")
            continue
        value = _convert(raw[name], hints[name], key)
        lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
        if lo is not None and (value <= lo if f.metadata["lo_open"] else value < lo):
            op = ">" if f.metadata["lo_open"] else ">="
            raise ParamsError(f"{key} must be {op} {lo}, got {value}")
        if hi is not None and value > hi:
            raise ParamsError(f"{key} must be <= {hi}, got {value}")
        values[name] = value
    section = cls(**values)
    section.check(where)
    return section


def parse_params(raw: Any) -> Params:
    """Validate a params mapping (as read from params.yaml) into :class:`Params`."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml must be a mapping with sections base, prepare, train, ablation, variants")
    sections = {"base": BaseParams, "prepare": PrepareParams, "train": TrainParams, "ablation": AblationParams}
    unknown = sorted(set(raw) - set(sections) - {"variants"})
    if unknown:
        raise ParamsError(f"unknown section {unknown[0]!r} in params.yaml; known: {sorted([*sections, 'variants'])}")
    for name in [*sections, "variants"]:
        if name not in raw:
            raise ParamsError(f"missing section {name!r} in params.yaml")
    loaded = {name: _load_section(cls, current_ablation(raw[name]) if name == "ablation" else raw[name], name)
              for name, cls in sections.items()}
    if not isinstance(raw["variants"], dict) or not raw["variants"]:
        raise ParamsError("variants must map each variant name to its model settings")
    variants = {name: _load_section(VariantParams, v, f"variants.{name}") for name, v in raw["variants"].items()}
    for key in ("stacked", "separate"):
        for name in getattr(loaded["ablation"], key):
            if name not in variants:
                raise ParamsError(f"ablation.{key} names {name!r}, which is not defined under variants")
    params = Params(variants=variants, **loaded)
    check_combinations(params)
    return params


def current_ablation(raw: Any) -> Any:
    """The run records written before seeds could stack (reports/runs/params.yaml of the 2026-11-22/23
    GPU runs) list ``ablation.variants``: every variant one process per seed, which is ``separate``."""
    if isinstance(raw, dict) and "variants" in raw and not {"stacked", "separate"} & set(raw):
        return {**{k: v for k, v in raw.items() if k != "variants"}, "stacked": [], "separate": raw["variants"]}
    return raw


def ablation_variants(raw: dict) -> list[str]:
    """Every variant a raw params mapping's ablation trains (stacked, then separate)."""
    ablation = current_ablation(raw["ablation"])
    return [*ablation["stacked"], *ablation["separate"]]


def precision_twins(raw: dict) -> dict[str, str]:
    """{twin: original} of a raw params mapping: each variant naming its own precision, and the variant
    with the same settings but none of its own (capsnet_r3_recon_fp32: capsnet_r3_recon)."""
    variants = raw["variants"]
    pairs = {name: next((o for o, other in variants.items() if other == {k: v for k, v in spec.items() if k != "precision"}),
                        None)
             for name, spec in variants.items() if spec.get("precision")}
    return {twin: original for twin, original in pairs.items() if original}


def check_combinations(p: Params) -> None:
    """Settings that are each valid but wrong together."""
    subsets = {k: v for k, v in (("prepare.train_subset", p.prepare.train_subset),
                                 ("prepare.test_subset", p.prepare.test_subset)) if v}
    if subsets and p.base.profile != "smoke":
        raise ParamsError(f"base.profile is {p.base.profile!r} but {', '.join(subsets)} "
                          f"{'is' if len(subsets) == 1 else 'are'} set: data subsets are for the smoke profile "
                          "only (a paper or gpu run on a subset would be reported as the real thing); "
                          "set them to 0 or use `make smoke`")
    if p.prepare.train_subset and p.train.batch_size > p.prepare.train_subset:
        raise ParamsError(f"train.batch_size ({p.train.batch_size}) exceeds prepare.train_subset "
                          f"({p.prepare.train_subset}): not one batch per epoch; lower the batch or raise the subset")


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml; a missing file or bad YAML is a :class:`ParamsError`."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path} not found; run from the repository root or pass --params")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path} is not valid YAML: {err}") from err
    return parse_params(raw)


def cpu_epoch_seconds(model: str, experiment: str) -> float | None:
    """CPU seconds per full 60k-image epoch of ``model`` in ``experiment`` (its CPU_EPOCH_SECONDS:
    measured on this project's 2-core machine, or scaled from a measurement by FLOP); None where
    neither exists."""
    return registry.load(experiment).CPU_EPOCH_SECONDS.get(model)
