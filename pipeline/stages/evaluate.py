"""Stage `evaluate`: a trained model on its experiment's test sets, logged to its training run.

The variant's experiment (pipeline.core.registry) evaluates: which test sets, which metrics, which
per-image records and figures (pipeline/experiments/*.py, `evaluate`). This stage loads the model,
writes metrics.json (DVC's metrics, the same keys for every variant: pipeline.report.runs.METRIC_KEYS)
with the run's own parameter count, epochs and stopping reason, and logs it all to the run.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from pipeline.core import tracking
from pipeline.core.errors import UserError
from pipeline.core.files import writable_dir, write_json
from pipeline.core.params import Params
from pipeline.core.stage_names import rerun_hint
from pipeline.report.runs import RUN_FIGURES
from pipeline.training.config import RunConfig
from pipeline.training.train import build_model, configure_precision, place_model, resolve_device


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
    device = resolve_device(cfg.device)
    configure_precision(cfg, device)  # evaluated in the precision it trained in
    return saved, cfg, place_model(model, cfg, device).eval()


def run(model_dir: Path, data_dir: Path, out: Path, params: Params | None = None) -> dict[str, float]:
    """Evaluate ``model_dir`` on its experiment's test sets (the experiment's `evaluate` writes the
    predictions, breakdown and figures, these into ``out``/figures/) and write ``out``/metrics.json; returns its content.
    ``params``: for the stage names a hint gives."""
    saved, cfg, model = load_model(model_dir, params)
    writable_dir(out, "output")
    shutil.rmtree(out / RUN_FIGURES, ignore_errors=True)  # this evaluation's figures alone
    (out / RUN_FIGURES).mkdir()
    evaluation = cfg.experiment_module().evaluate(model, cfg, data_dir, out)
    metrics = {**evaluation.metrics, "n_params": saved["params"]["n_params"], "epochs_trained": saved["epochs_trained"],
               "reached_target": saved["stop_reason"] == "target"}
    write_json(out / "metrics.json", metrics)
    figures = [str(p.relative_to(out)) for p in sorted((out / RUN_FIGURES).iterdir())]
    log_evaluation(saved, model_dir, out, evaluation.logged, ["metrics.json", *evaluation.artifacts, *figures],
                   evaluation.datasets)
    return metrics


def log_evaluation(saved: dict, model_dir: Path, out: Path, metrics: dict[str, float], artifacts: list[str],
                   datasets: list[dict]) -> None:
    """Log the evaluation to the model's training run, the test sets as its dataset inputs
    (`pipeline.data.splits.dataset_input`; a set the run has already, as training's clean test set,
    stays as it was); where the store does not
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
