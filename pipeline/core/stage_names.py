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

from pipeline.core.errors import UserError
from pipeline.core.params import Params


def items(params: Params) -> list[str]:
    """Every item of the ablation: the stacked variants, then ``<variant>-<seed>`` for each separate
    variant and seed (variants outer, as DVC orders the matrix)."""
    ablation = params.ablation
    return [*ablation.stacked, *(f"{variant}-{seed}" for variant in ablation.separate for seed in ablation.seeds)]


def train_stage(params: Params, variant: str, seed: int) -> str:
    """The DVC stage that trains (``variant``, ``seed``): its stacked group's, or its own."""
    return f"train_stacked@{variant}" if variant in params.ablation.stacked else f"train@{variant}-{seed}"


def evaluate_stage(params: Params, variant: str, seed: int) -> str:
    """The DVC stage that evaluates (``variant``, ``seed``)."""
    return f"evaluate_stacked@{variant}-{seed}" if variant in params.ablation.stacked else f"evaluate@{variant}-{seed}"


def stage_names(params: Params, item: str) -> list[str]:
    """The DVC stages of ``item``, in the order they run."""
    ablation = params.ablation
    if item in ablation.stacked:
        return [train_stage(params, item, ablation.seeds[0]),
                *(evaluate_stage(params, item, seed) for seed in ablation.seeds)]
    if item in items(params):
        variant, seed = item.rsplit("-", 1)
        return [train_stage(params, variant, int(seed)), evaluate_stage(params, variant, int(seed))]
    raise UserError(f"{item!r} is not an item of params.yaml's ablation; `capsnet stages` lists them")


def rerun_hint(params: Params | None, variant: str, seed: int | str, stage: str) -> str:
    """`dvc repro -f <stage>` for (``variant``, ``seed``)'s train or evaluate ``stage`` as params.yaml's
    ablation names it; where params do not list the pair (or the path named none), the command that
    lists every stage."""
    if params is not None and variant in params.ablation.variants and str(seed).isdigit():
        name = (train_stage if stage == "train" else evaluate_stage)(params, variant, int(seed))
        return f"`dvc repro -f {name}`"
    which = f"of {variant} seed {seed}" if variant and str(seed).isdigit() else "that writes it"  # not <variant>/seed<k>
    return f"the {stage} stage {which} (`capsnet stages --kind stages` lists every stage)"


def item_at(all_items: list[str], index: int) -> str:
    """The item an array task of ``index`` runs; a clear error when the array and the list disagree."""
    if not 0 <= index < len(all_items):
        raise UserError(f"task index {index} is outside the {len(all_items)} items of params.yaml's ablation: "
                        f"submit the array as 0-{len(all_items) - 1} (`capsnet stages --count` says how many)")
    return all_items[index]
