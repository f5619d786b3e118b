"""The stage list that scale-out fans out: one item per (variant, seed) of params.yaml's ablation,
named as dvc.yaml's matrix names them (``train@<variant>-<seed>``, ``evaluate@<variant>-<seed>``).

This is all the scheduling the project does itself: xargs (scripts/fanout.sh), a SLURM job array
or a Kubernetes Indexed Job (scripts/cluster/task.sh) pick an item by position, and DVC runs it.
"""

from __future__ import annotations

from pipeline.errors import UserError
from pipeline.params import Params

KINDS = ("train", "evaluate")  # the matrix stages of dvc.yaml, in the order one item runs them


def items(params: Params) -> list[str]:
    """``<variant>-<seed>`` for every (variant, seed) of the ablation, variants outer, as DVC orders
    the matrix."""
    return [f"{variant}-{seed}" for variant in params.ablation.variants for seed in params.ablation.seeds]


def item_at(all_items: list[str], index: int) -> str:
    """The item an array task of ``index`` runs; a clear error when the array and the list disagree."""
    if not 0 <= index < len(all_items):
        raise UserError(f"task index {index} is outside the {len(all_items)} (variant, seed) items of params.yaml's "
                        f"ablation: submit the array as 0-{len(all_items) - 1} (`capsnet stages --count` says "
                        "how many)")
    return all_items[index]
