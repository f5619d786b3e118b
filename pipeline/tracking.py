"""The one place that talks to MLflow. Model, loss and data code never import mlflow.

Tracking URI: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<repo root>/mlflow.db`` with the
repo root taken from ``$DVC_ROOT`` (set by DVC, so `dvc exp run --temp/--queue` runs land in the
same store) or the current directory. One run per (variant, seed), named ``<variant>-seed<k>``;
training and evaluation log into it through the run id kept next to the model.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import mlflow
import torch
from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

EXPERIMENT = "capsnet-repro"
PARAM_KEYS = ("variant", "model", "routing_iterations", "reconstruction", "seed", "batch_size", "lr",
              "lr_decay_rate", "lr_decay_steps", "epochs", "steps", "amp", "compile", "n_params",
              "device", "torch_version", "profile")


def repo_root() -> Path:
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Tracker:
    """A thin client bound to the experiment; every call names its run id explicitly."""

    def __init__(self, uri: str | None = None):
        self.uri = uri or tracking_uri()
        self.client = MlflowClient(self.uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            artifacts = (repo_root() / "mlruns").as_uri()
            self.experiment_id = self.client.create_experiment(EXPERIMENT, artifact_location=artifacts)
        else:
            self.experiment_id = experiment.experiment_id

    def start(self, run_name: str, params: dict, run_id: str | None = None) -> str:
        """Reopen ``run_id`` (a resumed run) or create a run with the common param keys and tags."""
        if run_id is not None:
            try:
                self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
                return run_id
            except mlflow.exceptions.MlflowException:
                pass  # the store was reset: start a new run
        missing = set(PARAM_KEYS) - set(params)
        if missing:
            raise ValueError(f"run params lack {sorted(missing)}; every run logs {PARAM_KEYS}")
        tags = {
            "git_commit": git_commit(repo_root()),
            "dvc_stage": os.environ.get("DVC_STAGE", ""),
            "dvc_exp_name": os.environ.get("DVC_EXP_NAME", ""),
            "host": platform.node(),
        }
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        run_id = run.info.run_id
        self.client.log_batch(run_id, params=[Param(k, str(params[k])) for k in PARAM_KEYS])
        return run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_artifact(self, run_id: str, path: str | Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def end(self, run_id: str, failed: bool = False) -> None:
        self.client.set_terminated(run_id, "FAILED" if failed else "FINISHED")

    def log_report(self, files: list[Path], profile: str) -> str:
        """A `report` run beside the training runs, tagged with the commit, holding the report files."""
        tags = {"git_commit": git_commit(repo_root()), "profile": profile, "kind": "report"}
        run_id = self.client.create_run(self.experiment_id, run_name="report", tags=tags).info.run_id
        for path in files:
            self.log_artifact(run_id, path, "report" if path.suffix != ".png" else "report/figures")
        self.end(run_id)
        return run_id

    def epoch_logger(self, run_id: str) -> "EpochLogger":
        return EpochLogger(self, run_id)


class EpochLogger:
    """Adapter for pipeline.train: per-epoch metrics with step = epoch."""

    def __init__(self, tracker: Tracker, run_id: str):
        self.tracker, self.run_id = tracker, run_id

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.tracker.log_metrics(self.run_id, {k: v for k, v in metrics.items() if k != "epoch"}, step=epoch)


def environment() -> dict[str, str]:
    """Versions and device facts recorded with every run."""
    return {
        "torch_version": torch.__version__,
        "cuda_version": str(torch.version.cuda),
        "python_version": platform.python_version(),
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
    }
