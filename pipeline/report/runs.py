"""The report's input: one trained and evaluated (variant, seed) as its own records say it ran.

`Run` reads what a run recorded (config.json, history.csv, metrics, per-image predictions) and
nothing else: a field a run does not record is `NOT_RECORDED`, never filled from today's defaults.
A run's *protocol* (profile, epochs, batch, learning-rate schedule, precision) and its training
commit are part of its identity: the report never pools runs that differ in either (which runs make
one row: pipeline.report.rows).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from safetensors.torch import load_file

from pipeline.core import protocol, registry
from pipeline.core.errors import UserError
from pipeline.core.params import Params
from pipeline.core.protocol import NOT_RECORDED  # the report's word for a field a run did not record
from pipeline.core.stage_names import rerun_hint

# results/<variant>/seed<k>/figures/: every figure an evaluation draws, whichever its experiment draws, one
# DVC output folder (dvc.yaml), so a stage restored from DVC's run-cache brings every one back
RUN_FIGURES = "figures"


def run_figure(run_dir: Path, name: str) -> Path:
    """Where an evaluation in ``run_dir`` draws (and the report reads) figure ``name``."""
    return run_dir / RUN_FIGURES / name


# the report's CSVs name commits in these columns: text, whatever it looks like (a short hash "1527642" is
# not a number, nor "1234e56" 1.234e59)
COMMIT_COLUMNS = ("commit", "commits")


def read_table(path: Path) -> pd.DataFrame:
    """One of the report's CSVs as the report stage wrote it (results.csv, effects.csv, …), its commit
    columns as text."""
    return pd.read_csv(path, dtype={column: str for column in COMMIT_COLUMNS})


LAST_EPOCHS = 5  # the end-of-training stability diagnostic: mean test error of the last epochs

# metrics.json's keys, the same for every variant so `dvc metrics show` is one filled table; which
# sets "test" and "transformed" are for a variant is breakdown.json's "sources" (its experiment's TEST_SETS);
# MultiMNIST variants have no transformed set, so no transformed_* keys.
METRIC_KEYS = ("error_pct", "transformed_error_pct", "n_test", "n_transformed", "n_params", "epochs_trained",
               "reached_target")


def uniform_metrics(metrics: dict, clean: str, transformed: str) -> dict:
    """metrics.json in today's keys; files written before 2026-11-22 named the sets in the keys
    (``test_error_pct``, ``n_affnist_test``, …), as the published GPU runs do."""
    legacy = {f"{clean}_error_pct": "error_pct", f"{transformed}_error_pct": "transformed_error_pct",
              f"n_{clean}": "n_test", f"n_{transformed}": "n_transformed"}
    out = {legacy.get(k, k): v for k, v in metrics.items()}
    for error, n in (("error_pct", "n_test"), ("transformed_error_pct", "n_transformed")):
        if out.get(error) is not None and out.get(n):
            out[error] = whole_images(out[error], out[n])
    return out


def whole_images(error_pct: float, n: int) -> float:
    """An error rate as the count of misclassified images over ``n`` it is: evaluations before
    2026-11-27 took the mean in float32 (0.39 % stored as 0.38999998…), and a mean of such values
    rounds the other way from the exact one (0.375 shown as 0.37 in one table, 0.38 in another). A value
    farther from a whole count than float32's rounding is left as it is."""
    count = error_pct * n / 100
    return round(count) * 100 / n if abs(count - round(count)) < 1e-3 else error_pct  # float32's noise only


class ReportError(UserError, RuntimeError):
    """An input of the report is missing or inconsistent; the message names it."""


def paper_reference() -> dict:
    """The cited numbers of the paper and public re-runs (pipeline/paper_reference.yaml)."""
    return yaml.safe_load(resources.files("pipeline").joinpath("paper_reference.yaml").read_text())


@dataclass(frozen=True)
class Run:
    variant: str
    seed: int
    metrics: dict
    config: dict
    history: pd.DataFrame
    correct: dict[str, np.ndarray]  # test set name -> (N,) bool per image
    breakdown: dict  # evaluate's breakdown.json: per-class accuracy, transform bins, set sources
    digit_index: dict[str, np.ndarray]  # test set name -> (N,) source digit per image, where known
    commit: str = NOT_RECORDED  # full hash from config.json, or the journal's short tag, or NOT_RECORDED
    commit_source: str = NOT_RECORDED  # "config.json" | "tracking journal" | NOT_RECORDED
    computed_by: tuple[str, ...] = ()  # other commits whose fingerprint table computes this run's (`rows.bridge`)
    same_code_as: str = ""  # the fingerprint of the row it joins, recorded in another environment (`rows.same_code`)

    @property
    def cfg(self) -> dict:
        return self.config["config"]

    @property
    def experiment(self) -> str:
        """The experiment that trained the run (records from before the key: its image size says)."""
        return registry.of_record(self.cfg.get("experiment"), self.cfg["image_size"])

    @property
    def recipe(self) -> str:
        """paper | official; runs trained before recipes existed trained the paper's (the only one then)."""
        return self.cfg.get("recipe", "paper")

    @property
    def adam_eps(self) -> float | str:
        return self.config.get("optimizer", {}).get("adam_eps", NOT_RECORDED)

    @property
    def device(self) -> str:
        """The resolved device and its name, as recorded."""
        device = self.config.get("params", {}).get("device", self.cfg.get("device", NOT_RECORDED))
        name = self.config.get("environment", {}).get("device_name")
        return f"{device} ({name})" if name else str(device)

    @property
    def precision(self) -> str:
        """The arithmetic it trained in (pipeline.core.protocol.precision) on its recorded device."""
        return protocol.precision(self.cfg, protocol.device_of(self.config))

    @property
    def resume_epochs(self) -> list[int] | None:
        """The epochs training resumed from a checkpoint at: every one where the run records them
        (resumed_at_epochs), else the last one (resumed_from_epoch, 0 = none); None if neither."""
        if "resumed_at_epochs" in self.config:
            return list(self.config["resumed_at_epochs"])
        last = self.config.get("resumed_from_epoch")
        return None if last is None else [last] if last else []

    @property
    def resumed(self) -> str:
        """resume_epochs in words: `no`, `20, 35`, or NOT_RECORDED."""
        epochs = self.resume_epochs
        if epochs is None:
            return NOT_RECORDED
        if not epochs:
            return "no"
        text = ", ".join(map(str, epochs))
        if "resumed_at_epochs" not in self.config:
            text += " (the last resume; earlier ones not recorded)"
        if epochs[-1] >= len(self.history):
            text += " (its checkpoint was already final: the last start trained nothing)"
        return text

    @property
    def protocol_key(self) -> tuple:
        """What makes two runs comparable (pipeline.core.protocol.protocol_key: profile, epochs, batch,
        every lr* setting, precision): the GPU queue's definition too."""
        return protocol.recorded(self.config)

    @property
    def schedule(self) -> str:
        """Profile, length and learning-rate schedule in words, e.g. `gpu profile: 50 epochs × batch 128,
        lr 0.001·0.96^(step/2000) ≥ 1e-06`; a compressed schedule reads `0.96^(step/2000 · 640/50)`."""
        cfg = self.cfg
        pace = f" · {cfg['lr_schedule_epochs']}/{cfg['epochs']}" if protocol.compressed(cfg) else ""
        lr = f"lr {cfg['lr']:g}·{cfg['lr_decay_rate']:g}^(step/{cfg['lr_decay_steps']}{pace}) ≥ {cfg['lr_min']:g}"
        extra = [f"{k} {cfg[k]}" for k in sorted(cfg) if k.startswith("lr")
                 and k not in ("lr", "lr_decay_rate", "lr_decay_steps", "lr_min", "lr_schedule_epochs")]
        return (f"{cfg.get('profile', NOT_RECORDED)} profile: {cfg['epochs']} epoch{'s' * (cfg['epochs'] != 1)} × batch {cfg['batch_size']}, "
                f"{', '.join([lr, *extra])}")

    @property
    def protocol(self) -> str:
        """The protocol in words: `schedule` and precision."""
        return f"{self.schedule}, {self.precision}"

    @property
    def commit_key(self) -> str:
        """What the run's training code is compared by: its training fingerprint where it recorded one
        (``fp <8 hex>``: runs of any commits that compute the same pool), else its commit's first 7
        characters (the journal tags hold only those)."""
        if self.same_code_as:
            return f"fp {self.same_code_as[:8]}"
        return f"fp {self.fingerprint[:8]}" if self.fingerprint != NOT_RECORDED else short(self.commit)

    @property
    def fingerprint(self) -> str:
        """The training fingerprint the train stage recorded (pipeline.training.fingerprint)."""
        return self.config.get("training_fingerprint", NOT_RECORDED)

    @property
    def images_trained(self) -> int | None:
        """Training images this run drew (steps × batch), as it recorded them; None where it did not."""
        steps = self.config.get("steps_trained")
        return None if steps is None else int(steps) * int(self.cfg["batch_size"])

    @property
    def epochs_trained(self) -> int:
        """Epochs this run trained, as it recorded them (its history's length where it did not)."""
        return int(self.config.get("epochs_trained", len(self.history)))

    def last_epochs_error(self, k: int = LAST_EPOCHS) -> float:
        """Mean per-epoch test error % of the last k epochs (a stability diagnostic, not a headline)."""
        return float(self.history.test_error_pct.iloc[-k:].mean())

    @property
    def final_lr(self) -> float:
        return float(self.history.lr.iloc[-1]) if "lr" in self.history else math.nan


def short(commit: str) -> str:
    """A commit as tables show it: 7 characters (or NOT_RECORDED); a row's fingerprint label
    (pipeline.report.rows.row_commit) as it is."""
    return commit if commit == NOT_RECORDED or commit.startswith("fp ") else commit[:7]


def best_epoch(history: pd.DataFrame) -> tuple[float, int]:
    """(lowest per-epoch test error %, its epoch), the first one on a tie. Selected on the test set."""
    k = int(history.test_error_pct.to_numpy().argmin())
    return float(history.test_error_pct.iloc[k]), int(history.epoch.iloc[k])


def _needed(models_dir: Path, results_dir: Path, variant: str, seed: int) -> list[Path]:
    model_dir, result_dir = models_dir / variant / f"seed{seed}", results_dir / variant / f"seed{seed}"
    return [result_dir / "metrics.json", result_dir / "predictions.safetensors", result_dir / "breakdown.json",
            model_dir / "config.json", model_dir / "history.csv"]


def missing_runs(models_dir: Path, results_dir: Path, variants: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """The (variant, seed) pairs that have no complete evaluation (not run, or stopped before the end)."""
    return [(v, s) for v in variants for s in seeds
            if not all(p.is_file() for p in _needed(models_dir, results_dir, v, s))]


def _correct(labels, preds) -> np.ndarray:
    """(N,) bool per test example; MultiMNIST's (N, 2) sorted pairs are right only as a whole."""
    same = (labels == preds).numpy()
    return same.all(axis=1) if same.ndim == 2 else same


def recorded_commit(config: dict, journal_dir: Path | None) -> tuple[str, str]:
    """(commit, where it was read): config.json's environment, else the run's tracking journal's start tags."""
    commit = config.get("environment", {}).get("git_commit")
    if commit:
        return commit, "config.json"
    journal = journal_dir / f"{config.get('run_id')}.jsonl" if journal_dir else None
    if journal is not None and journal.is_file():
        with journal.open() as f:
            commit = json.loads(f.readline()).get("tags", {}).get("git_commit")
        if commit:
            return commit, "tracking journal"
    return NOT_RECORDED, NOT_RECORDED


def load_runs(models_dir: Path, results_dir: Path, variants: list[str], seeds: list[int],
              skip: list[tuple[str, int]] = (), journal_dir: Path | None = None,
              params: Params | None = None) -> list[Run]:
    """Every (variant, seed)'s evaluation but those in ``skip``; a missing one is an error naming it,
    its path and the DVC stage that writes it (as ``params``' ablation names it). ``journal_dir``
    (default: beside models_dir) holds tracking journals that name the commit of runs whose
    config.json does not."""
    journal_dir = models_dir.parent / "journal" if journal_dir is None else journal_dir
    runs = []
    for variant in variants:
        for seed in seeds:
            if (variant, seed) in skip:
                continue
            model_dir, result_dir = models_dir / variant / f"seed{seed}", results_dir / variant / f"seed{seed}"
            missing = [str(p) for p in _needed(models_dir, results_dir, variant, seed) if not p.is_file()]
            if missing:
                raise ReportError(f"variant {variant} seed {seed} has no evaluation: missing {', '.join(missing)}; "
                                  f"run {rerun_hint(params, variant, seed, 'evaluate')}")
            pred = load_file(str(result_dir / "predictions.safetensors"))
            sets = [k.removesuffix("_labels") for k in pred if k.endswith("_labels")]
            config = json.loads((model_dir / "config.json").read_text())
            experiment = registry.of_record(config["config"].get("experiment"), config["config"]["image_size"])
            metrics = uniform_metrics(json.loads((result_dir / "metrics.json").read_text()),
                                      *registry.load(experiment).TEST_SETS)
            runs.append(Run(
                variant, seed, metrics, config, pd.read_csv(model_dir / "history.csv"),
                {name: _correct(pred[f"{name}_labels"], pred[f"{name}_preds"]) for name in sets},
                json.loads((result_dir / "breakdown.json").read_text()),
                {name: pred[f"{name}_digit_index"].long().numpy() for name in sets if f"{name}_digit_index" in pred},
                *recorded_commit(config, journal_dir)))
    return runs


def run_provenance(runs: list[Run]) -> pd.DataFrame:
    """One row per run, every field as the run recorded it (NOT_RECORDED where it did not)."""
    rows = []
    for r in runs:
        commit = r.commit if r.commit_source != "tracking journal" else f"{r.commit} (journal tag)"
        rows.append({
            "variant": r.variant, "seed": r.seed, "commit": commit, "fingerprint": r.fingerprint, "adam_eps": r.adam_eps,
            "amp": r.cfg.get("amp", NOT_RECORDED), "precision": r.precision,
            "compile": r.cfg.get("compile", NOT_RECORDED), "deterministic": r.cfg.get("deterministic", NOT_RECORDED),
            "resumed_at_epoch": r.resumed, "device": r.device,
            "torch": r.config.get("environment", {}).get("torch_version", NOT_RECORDED),
            "epochs_trained": len(r.history), "stop_reason": r.config.get("stop_reason", NOT_RECORDED),
        })
    return pd.DataFrame(rows)
