"""Stage `train`: one (variant, seed), or several seeds of a variant stacked (`run_group`), from
prepared data to each seed's weights, history and config, each tracked as its own MLflow run.

Top to bottom, what the stage must get right: check everything checkable (params, device, batch
against the data, writable paths) before an MLflow run exists; lock the checkpoint so two trainers
never work on one run; reopen the run a checkpoint belongs to and close stale RUNNING runs of the
same (variant, seed); train; write outputs atomically; and mark the run FAILED on every failure
after it started, SIGTERM included. The CLI only parses arguments and prints the outcome.
"""

from __future__ import annotations

import csv
import dataclasses
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import save_file

from pipeline.core import provenance, tracking
from pipeline.core.errors import Terminated, UserError
from pipeline.core.files import atomic_path, file_lock, writable_dir, write_json
from pipeline.core.params import Params, cpu_epoch_seconds
from pipeline.report import figures
from pipeline.training.fingerprint import fingerprint_environment, training_fingerprint
from pipeline.training.checkpoint import assert_finite_weights, load_checkpoint
from pipeline.training.config import ADAM_EPS, RunConfig, run_config
from pipeline.training.train import count_params, resolve_device, train_group

ARTIFACTS = ("model.safetensors", "learning_curve.png", "history.csv", "config.json")


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into :class:`Terminated` for the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(f"stopped by signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclasses.dataclass
class TrainOutcome:
    cfg: RunConfig
    history: list[dict]
    stop_reason: str
    eval_set: str
    run_id: str


def run(params: Params, variant: str, seed: int, data_dir: Path, out_dir: Path, checkpoint: Path) -> TrainOutcome:
    """Train ``variant`` with ``seed``; resume from ``checkpoint`` when it belongs to the same
    configuration. Writes model.safetensors, history.csv, learning_curve.png and config.json."""
    return run_group(params, variant, [seed], data_dir, [out_dir], checkpoint)[0]


def run_group(params: Params, variant: str, seeds: list[int], data_dir: Path, out_dirs: list[Path],
              checkpoint: Path) -> list[TrainOutcome]:
    """Train ``variant``'s ``seeds`` stacked in one process (`train.train_group`), seed k's outputs
    in out_dirs[k] exactly as a one-seed run writes them, one MLflow run per seed
    (``<variant>-seed<k>``); resume from ``checkpoint`` when it belongs to the same seed group."""
    if len(out_dirs) != len(seeds) or len(set(map(str, out_dirs))) != len(seeds):
        raise UserError(f"{variant}: {len(seeds)} seed(s) need as many distinct output directories, got {out_dirs}")
    experiment = run_config(params, variant, seeds[0]).experiment_module()
    cfgs = [experiment.configure(run_config(params, variant, seed), data_dir) for seed in seeds]
    cfg = cfgs[0]
    device = resolve_device(cfg.device)
    data, datasets = experiment.training_data(data_dir, cfg)
    per_epoch = cpu_epoch_seconds(cfg.model, cfg.experiment_name)
    if device.type == "cpu" and cfg.profile != "smoke" and per_epoch is not None:
        hours = per_epoch * len(data["train_images"]) / 60_000 * cfg.epochs * len(seeds) / 3600
        if hours > 1:
            warnings.warn(f"{variant} seed(s) {seeds}: {cfg.epochs} epochs on a CPU take about {hours:,.0f} h "
                          "(measured on 2 cores); the paper protocol wants a GPU", stacklevel=2)
    for out_dir in out_dirs:
        writable_dir(out_dir, "output")
    writable_dir(checkpoint.parent, "checkpoint")
    what = f"{variant} seed {seeds[0]}" if len(seeds) == 1 else f"{variant} seeds {', '.join(map(str, seeds))}"
    with file_lock(checkpoint.with_name(checkpoint.name + ".lock"), wait=False, what=f"{what}'s checkpoint {checkpoint}"):
        state = load_checkpoint(checkpoint, cfgs)
        env = provenance.environment()
        fingerprint = training_fingerprint(cfg)
        env["fingerprint_environment"] = fingerprint_environment()
        earlier = {s["extra"].get("fingerprint") for s in state["seeds"]} - {None, fingerprint} if state else set()
        if earlier:
            warnings.warn(f"{what} resumes a checkpoint trained by other training code (fingerprint "
                          f"{', '.join(sorted(earlier))}, now {fingerprint}): its config.json records both", stacklevel=2)
        tracker = tracking.open_tracker(cfg.profile)
        params_per_seed = [run_params(c, data, device, env) for c in cfgs]
        run_ids: list[str] = []
        try:
            for k, (c, seed_params) in enumerate(zip(cfgs, params_per_seed)):
                run_name = f"{variant}-seed{c.seed}"
                saved = state["seeds"][k]["extra"].get("run_id") if state else None
                run_ids.append(tracker.start(run_name, seed_params, run_id=saved))
                tracker.set_tag(run_ids[-1], "training_fingerprint", fingerprint)
                tracker.close_stale(run_name, keep=run_ids[-1])
                tracker.log_datasets(run_ids[-1], datasets)
            with sigterm_raises():
                outcomes = _train_and_write(cfgs, data, checkpoint, out_dirs, tracker, run_ids,
                                            params_per_seed, env, state, fingerprint, sorted(earlier))
        except BaseException:
            for run_id in run_ids:
                tracker.end(run_id, failed=True)
            raise
        for run_id in run_ids:
            tracker.end(run_id)
    return outcomes


def run_params(cfg: RunConfig, data: dict, device: torch.device, env: dict) -> dict:
    """What MLflow records as one run's parameters."""
    return {
        "variant": cfg.variant, "model": cfg.model, "routing_iterations": cfg.routing_iterations,
        "reconstruction": cfg.reconstruction, "seed": cfg.seed, "batch_size": cfg.batch_size, "lr": cfg.lr,
        "lr_decay_rate": cfg.lr_decay_rate, "lr_decay_steps": cfg.lr_decay_steps,
        "lr_schedule_epochs": cfg.lr_schedule_epochs, "epochs": cfg.epochs,
        "steps": cfg.epochs * (cfg.experiment_module().examples_per_epoch(cfg, data["train_images"].shape[0])
                               // cfg.batch_size), "amp": cfg.amp,
        "compile": cfg.compile, "n_params": count_params(cfg), "device": str(device),
        "torch_version": env["torch_version"], "profile": cfg.profile, "recipe": cfg.recipe,
        "experiment": cfg.experiment_name, "image_size": cfg.image_size, "n_train": data["train_images"].shape[0],
        "n_test": data["test_images"].shape[0]}


def _train_and_write(cfgs: list[RunConfig], data: dict, checkpoint: Path, outs: list[Path], tracker,
                     run_ids: list[str], params: list[dict], env: dict, state: dict | None, fingerprint: str,
                     earlier: list[str]) -> list[TrainOutcome]:
    t0 = time.perf_counter()
    results = train_group(cfgs, data, checkpoint, [tracker.epoch_logger(r) for r in run_ids],
                          extras=[{"run_id": r, "fingerprint": fingerprint} for r in run_ids], state=state)
    seconds = time.perf_counter() - t0
    eval_set = cfgs[0].experiment_module().TEST_SETS[0]
    outcomes = []
    for cfg, result, out, run_id, run_params_ in zip(cfgs, results, outs, run_ids, params):
        weights = {k: t.contiguous() for k, t in result.model.state_dict().items()}
        assert_finite_weights(weights, f"{cfg.variant} seed {cfg.seed}")
        with atomic_path(out / "model.safetensors") as tmp:
            save_file(weights, str(tmp))
        with atomic_path(out / "history.csv") as tmp, tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(result.history[0]))
            writer.writeheader()
            writer.writerows(result.history)
        figures.learning_curves(result.history, f"{cfg.variant} seed {cfg.seed}", out / "learning_curve.png")
        write_json(out / "config.json", {
            "config": dataclasses.asdict(cfg), "run_id": run_id, "params": run_params_,
            "optimizer": {"name": "adam", "adam_eps": ADAM_EPS}, "environment": env,
            "train_seconds": seconds, "stacked_seeds": [c.seed for c in cfgs],
            "resumed_from_epoch": result.resumed_from_epoch, "resumed_at_epochs": result.resumed_at,
            "stop_reason": result.stop_reason, "epochs_trained": len(result.history), "steps_trained": result.steps,
            "eval_set": eval_set, "training_fingerprint": fingerprint,
            **({"earlier_training_fingerprints": earlier} if earlier else {})})
        if result.resumed_from_epoch < len(result.history):  # something was trained (else these are logged already)
            tracker.log_metrics(run_id, {"epochs_trained": len(result.history),
                                         "reached_target": float(result.stop_reason == "target")},
                                step=len(result.history))
        for artifact in ARTIFACTS:
            tracker.log_artifact(run_id, out / artifact)
        outcomes.append(TrainOutcome(cfg, result.history, result.stop_reason, eval_set, run_id))
    return outcomes
