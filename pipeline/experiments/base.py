"""What an experiment module provides, and what the three built-in ones share.

An experiment (Table 1's shifted MNIST, §5.2's canvas, MultiMNIST, the next dataset) is one
module, found by name through `pipeline.core.registry` (params.yaml's variants say
``experiment: <name>``). The stages call only what is listed here; everything specific to the
experiment — its prepared sets, batches and augmentation, loss targets, per-epoch score,
evaluation and report section — lives in its module. The module provides:

- ``NAME``, ``IMAGE_SIZE`` (its variants' input side), ``MODELS`` (the models it trains),
  ``TEST_SETS``: (the prepared set it is scored on each epoch, its transformed twin or "");
  ``CPU_EPOCH_SECONDS``: {model: seconds per 60k-image epoch on 2 CPU cores} where measured;
  ``CURVES``: the title of its panel of the learning curves; optionally ``USES_EPOCH_SIZE``
  (train.multimnist_epoch_size sets its epoch, so it belongs to its runs' checkpoint key).
- ``prepare(params, mnist, out_dir, figures_dir) -> str``: write its prepared sets beside MNIST's
  train/test splits (``mnist``: their tensors) and its montage; returns a summary.
- ``configure(cfg, data_dir) -> RunConfig``: settings read from its prepared sets (default: none);
  ``planned(cfg, params) -> RunConfig``: the same settings as sets prepared under ``params`` will hold
  them (`run_config` applies it, so the fingerprint table and the bench, which have no sets, agree).
- ``training_data(data_dir, cfg) -> (data, dataset inputs)``: what the training loop draws from.
- ``Training(cfg, data, device)``: the loop's view (`pipeline.training.experiment.Experiment`).
- ``synthetic_data(cfg, n, device)``: random data of the same shapes (the bench, the fingerprint).
- ``examples_per_epoch(cfg, n_train)``: what an epoch draws (a run's recorded step count).
- ``evaluate(model, cfg, data_dir, out) -> Evaluation``: its test sets, written into ``out``.
- ``report(runs, context) -> Section``: its part of the report (pipeline.report.document), its
  files written even without runs (DVC's outputs); ``readme(out) -> list[str]``: its lines of the
  README's results block, from its CSVs as written.

The defaults below are what an experiment scored on one prepared set needs; a module takes them
with ``from pipeline.experiments.base import ...`` and overrides what differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipeline.core.errors import UserError
from pipeline.core.files import atomic_path, write_json
from pipeline.data.splits import dataset_input, load_split, split_metadata
from pipeline.report import figures
from pipeline.report.runs import run_figure
from pipeline.training.evaluate import FIG4_STEPS, accuracy_by_bins, evaluate_split, fig4_grid, reconstructions

CPU_EPOCH_SECONDS: dict[str, float] = {}


@dataclass
class Evaluation:
    """What an experiment's evaluation wrote into ``out``, for the stage to record."""

    metrics: dict[str, float]  # metrics.json's set keys (error_pct, n_test, …); the stage adds the run's own
    logged: dict[str, float]  # MLflow metrics of the evaluation (eval_<set>_error_pct)
    artifacts: list[str]  # files in ``out`` to log, besides metrics.json and the figures (the stage logs out/figures/)
    datasets: list[dict] = field(default_factory=list)  # the test sets as dataset inputs


def configure(cfg, data_dir: Path):
    """No setting comes from the prepared data."""
    return cfg


def planned(cfg, params):
    """No setting comes from the prepared data."""
    return cfg


def training_data(test_set: str, data_dir: Path, cfg, test_extras: tuple[str, ...] = ()
                  ) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """MNIST's training split and the per-epoch ``test_set``, and the two as dataset inputs;
    ``test_extras``: further tensors of the test split, as ``test_<name>`` (MultiMNIST's recipes)."""
    train_path, test_path = data_dir / "train.safetensors", data_dir / f"{test_set}.safetensors"
    train_split, test_split = load_split(train_path), load_split(test_path)
    n = train_split["images"].shape[0]
    if n < cfg.batch_size:
        raise UserError(f"train.batch_size {cfg.batch_size} exceeds the {n} training images in {data_dir}; "
                        "lower train.batch_size or raise prepare.train_subset")
    data = {"train_images": train_split["images"], "train_labels": train_split["labels"],
            "test_images": test_split["images"], "test_labels": test_split["labels"],
            **{f"test_{name}": test_split[name] for name in test_extras}}
    return data, [dataset_input(train_path, train_split, "training"), dataset_input(test_path, test_split, "testing")]


def synthetic_data(cfg, n: int, device: torch.device, test_size: int) -> dict[str, torch.Tensor]:
    """n random uint8 training digits (28×28) and n test images of ``test_size``."""
    return {"train_images": torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, device=device),
            "train_labels": torch.arange(n, device=device) % cfg.num_classes,
            "test_images": torch.randint(0, 256, (n, test_size, test_size), dtype=torch.uint8, device=device),
            "test_labels": torch.arange(n, device=device) % cfg.num_classes}


def examples_per_epoch(cfg, n_train: int) -> int:
    """An epoch is one pass over the training split."""
    return n_train


def evaluate_sets(test_sets: tuple[str, str], model: torch.nn.Module, cfg, data_dir: Path, out: Path) -> Evaluation:
    """``model`` on the clean and transformed ``test_sets``: error and per-class accuracy of each,
    accuracy by transform bins where a set records its transforms, per-image predictions, confusion
    matrices, and for reconstruction variants reconstructions.png and fig4.png (figures in out/figures/)."""
    metrics, arrays, panels, datasets = {}, {}, [], []
    breakdown = {"per_class": {}, "sources": {}, "bins": {}}
    clean_set, transformed_set = test_sets
    for name, (error_key, n_key) in ((clean_set, ("error_pct", "n_test")),
                                     (transformed_set, ("transformed_error_pct", "n_transformed"))):
        path = data_dir / f"{name}.safetensors"
        data, meta = load_split(path), split_metadata(path)
        datasets.append(dataset_input(path, data, "evaluation"))
        m, a = evaluate_split(model, data["images"], data["labels"], cfg.eval_batch_size, cfg.num_classes)
        metrics[error_key], metrics[n_key] = m["error_pct"], m["n"]
        breakdown["per_class"][name] = m["per_class_accuracy"]
        breakdown["sources"][name] = meta.get("source", name)  # read by set name (the file sorts its keys)
        if "affine_params" in data and "ranges" in meta:
            correct = a["labels"] == a["preds"]
            breakdown["bins"][name] = accuracy_by_bins(correct, data["affine_params"], json.loads(meta["ranges"]))
        arrays.update({f"{name}_{k}": t for k, t in a.items()})
        if "digit_index" in data:  # affNIST-style: which test digit each image came from (for the report's CI)
            arrays[f"{name}_digit_index"] = data["digit_index"].int()
        panels.append((m["confusion_matrix"], name))
        if name == clean_set:
            clean_images = data["images"]
    title = f"{cfg.variant} seed {cfg.seed}"
    figures.confusion(panels, title, run_figure(out, "confusion.png"))
    with atomic_path(out / "predictions.safetensors") as tmp:
        save_file(arrays, str(tmp))
    write_json(out / "breakdown.json", breakdown)
    if cfg.reconstruction:
        k = min(10, clean_images.shape[0])
        figures.image_grid([clean_images[:k], reconstructions(model, clean_images[:k])], ["input", "reconstruction"],
                           f"{title}: reconstructions (predicted capsule)", run_figure(out, "reconstructions.png"))
        grid = fig4_grid(model, clean_images[0])
        figures.image_grid(list(grid), [f"dim {d}" for d in range(grid.shape[0])], f"{title}: Fig. 4 perturbations",
                           run_figure(out, "fig4.png"), col_labels=[f"{round(s, 2) + 0.0:+.2f}" for s in FIG4_STEPS.tolist()])
    # eval_*: training logs test_error_pct per epoch, so the evaluation's own keys never collide with it
    logged = {f"eval_{clean_set}_error_pct": metrics["error_pct"],
              f"eval_{transformed_set}_error_pct": metrics["transformed_error_pct"]}
    return Evaluation(metrics, logged, ["breakdown.json"], datasets)
