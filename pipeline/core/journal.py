"""Deferred tracking: with ``$CAPSNET_TRACKING_JOURNAL`` set to a folder, each run's tracker calls are
written there as JSON lines, ``<journal run id>.jsonl``, and no MLflow is needed (a GPU box without
it, say); `capsnet track sync FOLDER` replays them into an MLflow store later
(pipeline.core.tracking.Tracker.replay). Also the per-epoch adapter that either tracker hands to
training."""

from __future__ import annotations

import json
import os
import time
import uuid
import warnings
from pathlib import Path

from pipeline.core.provenance import common_params, git_commit, repo_root, run_tags, shown_path


def read_journal(path: Path) -> list[dict]:
    """The events of a journal file. Only the last line may be torn (a process killed mid-write
    leaves a partial line, and a line is written whole or last): it is dropped with a warning naming
    the file and the line, and the complete records before it are kept. A malformed line anywhere
    else means the file is not what it claims: ValueError naming the line."""
    lines = [(k, line) for k, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    events = []
    for index, (number, line) in enumerate(lines):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError as err:
            if index < len(lines) - 1:
                raise ValueError(f"line {number} is not a journal record ({err.msg}); only a torn last line "
                                 "is skipped") from err
            warnings.warn(f"{path}: line {number} is torn (a process stopped mid-write); replaying the "
                          f"{len(events)} complete record(s) before it", stacklevel=2)
    return events


class JournalTracker:
    """The Tracker's calls written as JSON lines to ``<folder>/<run id>.jsonl`` (no MLflow needed)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def _write(self, run_id: str, event: str, **fields) -> None:
        line = json.dumps({"event": event, "time_ms": int(time.time() * 1000), **fields}, sort_keys=True)
        with (self.folder / f"{run_id}.jsonl").open("a") as f:
            f.write(line + "\n")

    def start(self, run_name: str, params: dict, run_id: str | None = None) -> str:
        if run_id is not None and (self.folder / f"{run_id}.jsonl").is_file():
            self._write(run_id, "tag", key="resumed", value="true")
            return run_id
        run_id = uuid.uuid4().hex
        self._write(run_id, "start", run_name=run_name, params=common_params(params), tags=run_tags())
        return run_id

    def has_run(self, run_id: str) -> bool:
        """Always: a journal only appends, and `capsnet track sync` finds the run when it replays."""
        return True

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        self._write(run_id, "metrics", metrics={k: float(v) for k, v in metrics.items()}, step=step)

    def log_metrics_once(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        logged = {(e["step"], k) for e in self._events(run_id) if e["event"] == "metrics" for k in e["metrics"]}
        new = {k: v for k, v in metrics.items() if (step, k) not in logged}
        if new:
            self.log_metrics(run_id, new, step)

    def _events(self, run_id: str) -> list[dict]:
        path = self.folder / f"{run_id}.jsonl"
        return read_journal(path) if path.is_file() else []

    def log_artifact(self, run_id: str, path: str | Path, folder: str | None = None) -> None:
        self._write(run_id, "artifact", path=shown_path(path), folder=folder)

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._write(run_id, "tag", key=key, value=value)

    def log_datasets(self, run_id: str, datasets: list[dict]) -> None:
        self._write(run_id, "datasets", datasets=[{**d, "source": shown_path(d["source"])} for d in datasets])

    def end(self, run_id: str, failed: bool = False) -> None:
        self._write(run_id, "end", status="FAILED" if failed else "FINISHED")

    def close_stale(self, run_name: str, keep: str) -> list[str]:
        return []  # a journal is replayed as it was written; its runs end when they ended

    def log_report(self, files: list[Path], profile: str, metrics: dict[str, float]) -> str:
        run_id = uuid.uuid4().hex
        self._write(run_id, "start", run_name="report", params={},
                    tags={"git_commit": git_commit(repo_root()), "profile": profile, "kind": "report",
                          "dvc_stage": os.environ.get("DVC_STAGE", "")})
        self.log_metrics(run_id, metrics)
        for path in files:
            self.log_artifact(run_id, path, "report" if path.suffix != ".png" else "report/figures")
        self.end(run_id)
        return run_id

    def epoch_logger(self, run_id: str) -> "EpochLogger":
        return EpochLogger(self, run_id)


class EpochLogger:
    """Adapter for pipeline.training.train: per-epoch metrics with step = epoch, to either tracker."""

    def __init__(self, tracker, run_id: str):
        self.tracker, self.run_id = tracker, run_id

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        self.tracker.log_metrics(self.run_id, {k: v for k, v in metrics.items() if k != "epoch"}, step=epoch)
