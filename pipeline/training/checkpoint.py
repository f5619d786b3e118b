"""A seed group's checkpoint: which seeds train together (`group_config`), the key a checkpoint
resumes only under (`group_digest`), and reading and writing it safely: written atomically and only
with finite weights, read without unpickling code, an unreadable one moved aside, not deleted."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import warnings
from pathlib import Path

import torch

from pipeline.core.errors import UserError, first_line
from pipeline.core.files import atomic_path
from pipeline.training.config import RunConfig


class NonFiniteLossError(UserError, RuntimeError):
    """The training loss became NaN or infinite; the message names the first such step."""


def assert_finite_weights(weights: dict[str, torch.Tensor], what: str) -> None:
    """Refuse to save non-finite weights: a NaN checkpoint would poison every resume after it."""
    bad = [k for k, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise NonFiniteLossError(f"{what}: non-finite weights in {', '.join(bad[:3])}"
                                 f"{' …' if len(bad) > 3 else ''}; nothing saved (the last good checkpoint is kept)")


def save_checkpoint(path: Path, state: dict, weights: dict[str, torch.Tensor]) -> None:
    """Write ``state`` atomically after checking ``weights`` (what a resume would train on) are finite."""
    assert_finite_weights(weights, f"checkpoint {path}")
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def group_config(cfgs: RunConfig | list[RunConfig]) -> list[RunConfig]:
    """The seeds of one training process: configurations equal but for distinct seeds."""
    cfgs = list(cfgs) if isinstance(cfgs, (list, tuple)) else [cfgs]
    if not cfgs:
        raise ValueError("no seeds to train")
    seeds = [c.seed for c in cfgs]
    if len(set(seeds)) != len(seeds):
        raise UserError(f"{cfgs[0].variant}: seeds {seeds} repeat one; give each seed once")
    if any(dataclasses.replace(c, seed=cfgs[0].seed) != cfgs[0] for c in cfgs):
        raise ValueError(f"{cfgs[0].variant}: stacked seeds must share every setting but the seed")
    return cfgs


def group_digest(cfgs: list[RunConfig]) -> str:
    """The checkpoint key of a seed group: one seed's own digest (so a separate run's checkpoint
    keeps its key), else the hash of every seed's."""
    if len(cfgs) == 1:
        return cfgs[0].digest()
    return hashlib.sha256(" ".join(c.digest() for c in cfgs).encode()).hexdigest()[:16]


def load_checkpoint(path: str | Path, cfgs: RunConfig | list[RunConfig]) -> dict | None:
    """The checkpoint at ``path`` if it belongs to ``cfgs`` (one run, or a seed group); else None."""
    path, cfgs = Path(path), group_config(cfgs)
    if not path.is_file():
        return None
    try:  # tensors, numbers, strings, lists and dicts only: nothing in a checkpoint runs code when read
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # cut short (a full disk), overwritten, or not a checkpoint at all
        aside = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
        os.replace(path, aside)
        reason = first_line(err, 120)
        warnings.warn(f"checkpoint {path} is unreadable ({reason}); moved aside to {aside} (delete it once "
                      "you have looked) and training starts afresh", stacklevel=2)
        return None
    if state.get("digest") != group_digest(cfgs):
        warnings.warn(f"{path} belongs to another configuration; starting afresh", stacklevel=2)
        return None
    if "stack" not in state:
        warnings.warn(f"{path} was written by an older trainer (one seed, no stack); starting afresh", stacklevel=2)
        return None
    return state
