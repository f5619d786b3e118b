"""The experiments a variant can name: params.yaml's ``experiment:`` key, to the module that owns it.

This module holds names, where each experiment lives and the two facts params check a variant
against (its image size, its models), never an experiment's code: `load` imports the module when
a stage needs it, so reading params.yaml imports no torch, and the stages run any experiment
without naming one. What a module provides: pipeline/experiments/base.py.

A new experiment is one module and one line in EXPERIMENTS, or `register(module)` from anywhere
(a plug-in, a test) before the stages run.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType

from pipeline.core.errors import UserError


@dataclass(frozen=True)
class Entry:
    """Where an experiment lives and what params check a variant against, without importing it
    (the module itself is the source: tests/test_extension.py keeps this index equal to it)."""

    module: str
    image_size: int
    models: tuple[str, ...]


EXPERIMENTS = {  # report order: each experiment's section follows the one before it
    # §5.1: shifted MNIST, the affine-shifted column
    "table1": Entry("pipeline.experiments.table1", 28, ("capsnet", "baseline_cnn", "pooling_cnn")),
    # §5.2: the 40×40 canvas, expanded MNIST, affNIST
    "affnist": Entry("pipeline.experiments.affnist", 40, ("capsnet", "baseline_cnn", "pooling_cnn")),
    # §6: two overlapping digits on 36×36
    "multimnist": Entry("pipeline.experiments.multimnist", 36, ("capsnet", "multimnist_cnn")),
}
# run records and params written before the key existed: the image size said which experiment
LEGACY_IMAGE_SIZES = {28: "table1", 40: "affnist", 36: "multimnist"}
_registered: dict[str, ModuleType] = {}


def register(module: ModuleType) -> None:
    """Make ``module`` (an experiment: its NAME and what base.py lists) available by its NAME."""
    _registered[module.NAME] = module


def unregister(name: str) -> None:
    _registered.pop(name, None)


def plugins() -> dict[str, str]:
    """The experiments `register` added, as {NAME: the module's import name}: what another process
    imports to have them too (pipeline.training.fingerprint's capped process)."""
    return {name: module.__name__ for name, module in _registered.items()}


def names() -> list[str]:
    """Every experiment, built-in ones first, in report order."""
    return [*EXPERIMENTS, *(n for n in _registered if n not in EXPERIMENTS)]


def load(name: str) -> ModuleType:
    """The experiment module named ``name``; a clear error for a name nothing registered."""
    if name in _registered:
        return _registered[name]
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; known: {', '.join(names())}")
    return import_module(EXPERIMENTS[name].module)


def entry(name: str) -> Entry:
    """What params check a variant of ``name`` against, importing nothing for a built-in one."""
    if name in _registered:
        module = _registered[name]
        return Entry(module.__name__, module.IMAGE_SIZE, tuple(module.MODELS))
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; known: {', '.join(names())}")
    return EXPERIMENTS[name]


def of_record(experiment: str | None, image_size: int | None) -> str:
    """The experiment a run record or variant names, or (written before the key) its image size says."""
    if experiment:
        return experiment
    if image_size in LEGACY_IMAGE_SIZES:
        return LEGACY_IMAGE_SIZES[image_size]
    raise UserError(f"a record names no experiment and its image size {image_size} is none of the built-in "
                    f"ones ({', '.join(f'{s}: {n}' for s, n in LEGACY_IMAGE_SIZES.items())}); add `experiment:`")
