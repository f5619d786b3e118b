"""Stage `evaluate`: a trained model on its clean and transformed test sets, logged to its run.

28×28 models: MNIST test and the affine-shifted set; 40×40 (§5.2): expanded MNIST and
affNIST(-style). Writes metrics.json (DVC's metrics, the same keys for every variant: see
METRIC_KEYS), breakdown.json (per-class accuracy, accuracy
by transform bins, which sets), predictions.safetensors (per image: label, prediction, scores),
confusion.png and, for reconstruction variants, reconstructions.png and fig4.png.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pipeline.report import figures

from pipeline.core import tracking
from pipeline.experiments import multimnist as mm
from pipeline.data.mnist import dataset_input, load_split, split_metadata, test_sets
from pipeline.core.errors import UserError
from pipeline.training.evaluate import FIG4_STEPS, accuracy_by_bins, evaluate_split, fig4_grid, reconstructions
from pipeline.core.files import atomic_path, writable_dir, write_json
from pipeline.core.params import Params
from pipeline.core.stage_names import rerun_hint
from pipeline.training.train import RunConfig, build_model, place_model, resolve_device


# metrics.json's keys, the same for every variant so `dvc metrics show` is one filled table; which
# sets "test" and "transformed" are for a variant is breakdown.json's "sources" (data.test_sets);
# MultiMNIST variants have no transformed set, so no transformed_* keys.
METRIC_KEYS = ("error_pct", "transformed_error_pct", "n_test", "n_transformed", "n_params", "epochs_trained",
               "reached_target")


def uniform_metrics(metrics: dict, clean: str, transformed: str) -> dict:
    """metrics.json in today's keys; files written before 2026-11-22 named the sets in the keys
    (``test_error_pct``, ``n_affnist_test``, …), as the published GPU runs do."""
    legacy = {f"{clean}_error_pct": "error_pct", f"{transformed}_error_pct": "transformed_error_pct",
              f"n_{clean}": "n_test", f"n_{transformed}": "n_transformed"}
    return {legacy.get(k, k): v for k, v in metrics.items()}


def load_model(model_dir: Path, params: Params | None = None) -> tuple[dict, RunConfig, torch.nn.Module]:
    """(config.json, its RunConfig, the model with its trained weights) of a train stage's output
    (models/<variant>/seed<k>); what is missing or corrupt names the stage that retrains it, as
    ``params``' ablation names it."""
    retrain = f"retrain it with {rerun_hint(params, model_dir.parent.name, model_dir.name.removeprefix('seed'), 'train')}"
    try:
        saved = json.loads((model_dir / "config.json").read_text())
        cfg = RunConfig(**saved["config"])
        weights = load_file(str(model_dir / "model.safetensors"))
    except FileNotFoundError as err:
        raise UserError(f"{err.filename} is missing; {retrain}") from err
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{model_dir / 'config.json'} is not a train stage's config ({err}); {retrain}") from err
    except (OSError, SafetensorError) as err:
        raise UserError(f"{model_dir / 'model.safetensors'} is truncated or corrupt ({err}); {retrain}") from err
    model = build_model(cfg)
    model.load_state_dict(weights)
    return saved, cfg, place_model(model, cfg, resolve_device(cfg.device)).eval()


def run(model_dir: Path, data_dir: Path, out: Path, params: Params | None = None) -> dict[str, float]:
    """Evaluate ``model_dir`` and write ``out``; returns metrics.json's content. ``params``: for the
    stage names a hint gives."""
    saved, cfg, model = load_model(model_dir, params)
    writable_dir(out, "output")
    if cfg.multimnist:
        return run_multimnist(saved, cfg, model, model_dir, data_dir, out)
    metrics, arrays, panels, datasets = {}, {}, [], []
    breakdown = {"per_class": {}, "sources": {}, "bins": {}}
    clean_set, transformed_set = test_sets(cfg.image_size)
    for name, (error_key, n_key) in ((clean_set, ("error_pct", "n_test")),
                                     (transformed_set, ("transformed_error_pct", "n_transformed"))):
        path = data_dir / f"{name}.safetensors"
        data, meta = load_split(path), split_metadata(path)
        datasets.append(dataset_input(path, data, "evaluation"))
        m, a = evaluate_split(model, data["images"], data["labels"], cfg.eval_batch_size, cfg.num_classes)
        metrics[error_key], metrics[n_key] = m["error_pct"], m["n"]
        breakdown["per_class"][name] = m["per_class_accuracy"]
        breakdown["sources"][name] = meta.get("source", name)  # dicts keep order: clean set first
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
    figures.confusion(panels, title, out / "confusion.png")
    metrics.update(n_params=saved["params"]["n_params"], epochs_trained=saved["epochs_trained"],
                   reached_target=saved["stop_reason"] == "target")
    with atomic_path(out / "predictions.safetensors") as tmp:
        save_file(arrays, str(tmp))
    write_json(out / "breakdown.json", breakdown)
    pngs = ["confusion.png"]
    if cfg.reconstruction:
        k = min(10, clean_images.shape[0])
        figures.image_grid([clean_images[:k], reconstructions(model, clean_images[:k])], ["input", "reconstruction"],
                           f"{title}: reconstructions (predicted capsule)", out / "reconstructions.png")
        grid = fig4_grid(model, clean_images[0])
        figures.image_grid(list(grid), [f"dim {d}" for d in range(grid.shape[0])], f"{title}: Fig. 4 perturbations",
                           out / "fig4.png", col_labels=[f"{round(s, 2) + 0.0:+.2f}" for s in FIG4_STEPS.tolist()])
        pngs += ["reconstructions.png", "fig4.png"]
    write_json(out / "metrics.json", metrics)
    # eval_*: training logs test_error_pct per epoch, so the evaluation's own keys never collide with it
    log_evaluation(saved, model_dir, out, {f"eval_{clean_set}_error_pct": metrics["error_pct"],
                                           f"eval_{transformed_set}_error_pct": metrics["transformed_error_pct"]},
                   ["metrics.json", "breakdown.json", *pngs], datasets)
    return metrics


def log_evaluation(saved: dict, model_dir: Path, out: Path, metrics: dict[str, float], artifacts: list[str],
                   datasets: list[dict]) -> None:
    """Log the evaluation to the model's training run, the test sets (`data.dataset_input`) as its
    dataset inputs (a set
    the run has already, as training's clean test set, stays as it was); where the store does not
    hold that run (the model was trained against another store), say so and leave the written
    evaluation as it is."""
    tracker = tracking.open_tracker(saved["config"].get("profile", "paper"))
    run_id = saved["run_id"]
    if not tracker.has_run(run_id):
        warnings.warn(f"{model_dir} was trained as MLflow run {run_id}, which the tracking store {tracker.uri} does "
                      f"not hold: the evaluation is in {out} but not in MLflow. To log it, run this again with "
                      "MLFLOW_TRACKING_URI set to the store the model was trained with", stacklevel=2)
        return
    tracker.log_metrics_once(run_id, metrics, step=saved["epochs_trained"])
    tracker.log_datasets(run_id, datasets)
    for artifact in artifacts:
        tracker.log_artifact(run_id, out / artifact, "evaluation")


def run_multimnist(saved: dict, cfg: RunConfig, model: torch.nn.Module, model_dir: Path, data_dir: Path,
                   out: Path) -> dict:
    """MultiMNIST (§6): pair error on every test recipe, composed on the device batch by batch.

    metrics.json has no transformed set (MultiMNIST has none); breakdown.json adds the share of
    pairs with at least one digit right (the official code's "almost correct"); predictions hold the
    true and predicted pairs (P, 2), sorted, as uint8; confusion.png is the per-digit confusion
    (`multimnist.digit_confusion`); reconstruction variants get reconstructions.png, the Fig. 5
    overlay of the two predicted capsules' reconstructions for a few pairs and one failure.
    """
    path = data_dir / "multimnist_test.safetensors"
    split, meta = load_split(path), split_metadata(path)
    if "pairs" not in split or "shifts" not in split:
        raise UserError(f"{path} holds no MultiMNIST recipes; rebuild it with `dvc repro -f prepare`")
    predicted = mm.predict_pairs(model, split["images"], split["pairs"], split["shifts"], cfg.eval_batch_size).cpu()  # (P, 2)
    truth = split["labels"].long()[split["pairs"].long()].sort(dim=1).values  # (P, 2)
    correct = mm.pair_correct(predicted, truth)  # (P,)
    one_right = (truth[:, :, None] == predicted[:, None, :]).any(dim=2).any(dim=1)  # (P,)
    n = int(truth.shape[0])
    metrics = {"error_pct": 100.0 * int((~correct).sum()) / n, "n_test": n,
               "n_params": saved["params"]["n_params"], "epochs_trained": saved["epochs_trained"],
               "reached_target": saved["stop_reason"] == "target"}
    breakdown = {"per_class": {}, "sources": {"multimnist_test": meta.get("source", "multimnist_test")}, "bins": {},
                 "at_least_one_right_pct": 100.0 * float(one_right.float().mean())}
    with atomic_path(out / "predictions.safetensors") as tmp:
        save_file({"multimnist_test_labels": truth.to(torch.uint8), "multimnist_test_preds": predicted.to(torch.uint8)},
                  str(tmp))
    write_json(out / "breakdown.json", breakdown)
    title = f"{cfg.variant} seed {cfg.seed}"
    figures.confusion([(mm.digit_confusion(predicted, truth, cfg.num_classes).tolist(), "MultiMNIST, per digit")],
                      title, out / "confusion.png")
    pngs = ["confusion.png"]
    if cfg.reconstruction:
        shown = torch.cat([torch.nonzero(correct).flatten()[:5], torch.nonzero(~correct).flatten()[:1]])  # (≤6,)
        merged, _ = mm.compose(split["images"], split["pairs"][shown], split["shifts"][shown])  # (k, 36, 36)
        recons = mm.reconstruct_pairs(model, merged, predicted[shown])  # (k, 2, 36, 36)
        titles = [f"{'' if bool(correct[i]) else 'FAIL '}true {tuple(truth[i].tolist())}\n"
                  f"red {int(predicted[i, 0])}, green {int(predicted[i, 1])}" for i in shown.tolist()]
        figures.multimnist_reconstructions(merged, recons, titles, f"{title}: reconstructions from the two "
                                           "predicted capsules", out / "reconstructions.png")
        pngs.append("reconstructions.png")
    write_json(out / "metrics.json", metrics)
    log_evaluation(saved, model_dir, out, {"eval_multimnist_test_error_pct": metrics["error_pct"]},
                   ["metrics.json", "breakdown.json", *pngs], [dataset_input(path, split, "evaluation")])
    return metrics
