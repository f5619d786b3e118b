"""The stage list that scale-out fans out, named as dvc.yaml's matrices name the stages.

An item is what one process trains: a stacked variant (``<variant>``: ``train_stacked@<variant>``
then ``evaluate_stacked@<variant>-<seed>`` for each seed) or one seed of a separate variant
(``<variant>-<seed>``: ``train@<variant>-<seed>`` then ``evaluate@<variant>-<seed>``). Stacked items
come first: each trains every seed, the longest work, and a fan-out should start it first.

This is all the scheduling the project does itself: xargs (scripts/fanout.sh), a SLURM job array
or a Kubernetes Indexed Job (scripts/cluster/task.sh) pick an item by position, and DVC runs its
stages.
"""

from __future__ import annotations

from pipeline.errors import UserError
from pipeline.params import Params


def items(params: Params) -> list[str]:
    """Every item of the ablation: the stacked variants, then ``<variant>-<seed>`` for each separate
    variant and seed (variants outer, as DVC orders the matrix)."""
    ablation = params.ablation
    return [*ablation.stacked, *(f"{variant}-{seed}" for variant in ablation.separate for seed in ablation.seeds)]


def stage_names(params: Params, item: str) -> list[str]:
    """The DVC stages of ``item``, in the order they run."""
    ablation = params.ablation
    if item in ablation.stacked:
        return [f"train_stacked@{item}", *(f"evaluate_stacked@{item}-{seed}" for seed in ablation.seeds)]
    if item in items(params):
        return [f"train@{item}", f"evaluate@{item}"]
    raise UserError(f"{item!r} is not an item of params.yaml's ablation; `capsnet stages` lists them")


def item_at(all_items: list[str], index: int) -> str:
    """The item an array task of ``index`` runs; a clear error when the array and the list disagree."""
    if not 0 <= index < len(all_items):
        raise UserError(f"task index {index} is outside the {len(all_items)} items of params.yaml's ablation: "
                        f"submit the array as 0-{len(all_items) - 1} (`capsnet stages --count` says how many)")
    return all_items[index]
