"""The experiments a variant can name: params.yaml's ``experiment:`` key, to the module that owns it.

This module holds names and where each experiment lives, never an experiment's code: `load`
imports the module when something needs it, so params can check a name and the stages can run
any experiment without naming one. What a module provides: pipeline/experiments/base.py.

A new experiment is one module and one line in EXPERIMENTS, or `register(module)` from anywhere
(a plug-in, a test) before the stages run.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from pipeline.core.errors import UserError

EXPERIMENTS = {  # report order: each experiment's section follows the one before it
    "table1": "pipeline.experiments.table1",  # §5.1: shifted MNIST, the affine-shifted column
    "affnist": "pipeline.experiments.affnist",  # §5.2: the 40×40 canvas, expanded MNIST, affNIST
    "multimnist": "pipeline.experiments.multimnist",  # §6: two overlapping digits on 36×36
}
# run records and params written before the key existed: the image size said which experiment
LEGACY_IMAGE_SIZES = {28: "table1", 40: "affnist", 36: "multimnist"}
_registered: dict[str, ModuleType] = {}


def register(module: ModuleType) -> None:
    """Make ``module`` (an experiment: its NAME and what base.py lists) available by its NAME."""
    _registered[module.NAME] = module


def unregister(name: str) -> None:
    _registered.pop(name, None)


def names() -> list[str]:
    """Every experiment, built-in ones first, in report order."""
    return [*EXPERIMENTS, *(n for n in _registered if n not in EXPERIMENTS)]


def load(name: str) -> ModuleType:
    """The experiment module named ``name``; a clear error for a name nothing registered."""
    if name in _registered:
        return _registered[name]
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; known: {', '.join(names())}")
    return import_module(EXPERIMENTS[name])


def of_record(experiment: str | None, image_size: int | None) -> str:
    """The experiment a run record or variant names, or (written before the key) its image size says."""
    if experiment:
        return experiment
    if image_size in LEGACY_IMAGE_SIZES:
        return LEGACY_IMAGE_SIZES[image_size]
    raise UserError(f"a record names no experiment and its image size {image_size} is none of the built-in "
                    f"ones ({', '.join(f'{s}: {n}' for s, n in LEGACY_IMAGE_SIZES.items())}); add `experiment:`")
