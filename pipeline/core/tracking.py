"""The one place that talks to MLflow. Model, loss and data code never import mlflow.

Tracking URI: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<repo root>/mlflow.db`` with the
repo root taken from ``$DVC_ROOT`` (set by DVC, so `dvc exp run --temp/--queue` runs land in the
same store) or the current directory; a sqlite store's runs keep their files in mlruns/ beside it
(the default store's: the repository's mlruns/). One run per (variant, seed), named ``<variant>-seed<k>``;
training and evaluation log into it through the run id kept next to the model.

Deferred tracking: with ``$CAPSNET_TRACKING_JOURNAL`` set to a folder, nothing talks to MLflow
(it need not be installed: a GPU box without it, say); each run is journalled there
(pipeline.core.journal), and `capsnet track sync FOLDER` replays the journals into any MLflow store
later (`Tracker.replay`), with the original steps and timestamps. Syncing twice adds nothing. What
every run records about where it ran: pipeline.core.provenance.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path

from pipeline.core import registry
from pipeline.core.files import file_lock
from pipeline.core.journal import EpochLogger, JournalTracker, read_journal
from pipeline.core.provenance import common_params, git_commit, repo_root, run_tags, shown_path

JOURNAL_ENV = "CAPSNET_TRACKING_JOURNAL"

EXPERIMENT = "capsnet-repro"  # the paper protocol's experiment; each other profile has its own (`experiment_name`)
PUBLISHED_TAG = "published"  # runs loaded from reports/runs/journal by `capsnet ui`: the published results
# MLflow 3's UI opens experiments in GenAI mode unless they say they are model training
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
# what an `mlflow server` / `mlflow ui` of this project starts with: without MLflow 3's job runner (huey
# consumers for GenAI jobs: 7 processes, 6 s of CPU at each start), which tracked runs never use
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def experiment_name(profile: str) -> str:
    """The MLflow experiment of a profile's runs: profiles never share one, so the published GPU runs
    (capsnet-repro-gpu) are never mixed with two-step smoke runs (capsnet-repro-smoke)."""
    return EXPERIMENT if profile in ("paper", "") else f"{EXPERIMENT}-{profile}"


def runs_url(port: int, experiment_id: str, search: str = "") -> str:
    """The MLflow UI's runs table of an experiment (its own route: the bare experiment URL opens MLflow
    3's GenAI overview), sorted by variant so each variant's seeds sit together, filtered by ``search``."""
    from urllib.parse import urlencode

    query = {"orderByKey": "params.`variant`", "orderByAsc": "true"} | ({"searchFilter": search} if search else {})
    return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a sqlite store (relative: to the current directory, as MLflow reads it);
    None for other stores."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def _store_lock(uri: str) -> Path | None:
    """The lock file beside a sqlite store (creating a fresh store runs migrations that two
    processes must not run at once); None for other stores, whose servers serialise for us."""
    file = _sqlite_file(uri)
    return None if file is None else file.with_name(file.name + ".lock")


def artifact_root(uri: str) -> Path:
    """Where a new experiment of the store at ``uri`` keeps its runs' files: beside a sqlite store's
    file (the default store's is the repository's mlruns/; a store in a scratch folder keeps them
    there too, not in whatever directory the process ran from), else the repository's mlruns/."""
    file = _sqlite_file(uri)
    return repo_root() / "mlruns" if file is None else file.resolve().parent / "mlruns"


class Tracker:
    """A thin client bound to one profile's experiment (`experiment_name`); every call names its run
    id explicitly."""

    def __init__(self, uri: str | None = None, profile: str = "paper"):
        from mlflow.tracking import MlflowClient

        self.uri, self.profile = uri or tracking_uri(), profile
        lock = _store_lock(self.uri)
        with file_lock(lock, wait=True) if lock else contextlib.nullcontext():
            self.client = MlflowClient(self.uri)
            self.experiment_id = self._experiment_id(experiment_name(profile))

    def _experiment_id(self, name: str) -> str:
        """The id of experiment ``name``, created on first use as a training-runs experiment (a
        concurrent creator elsewhere is tolerated; an older one without the kind tag gets it)."""
        import mlflow

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            for key, value in EXPERIMENT_TAGS.items():
                if experiment.tags.get(key) != value:
                    self.client.set_experiment_tag(experiment.experiment_id, key, value)
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifact_root(self.uri).as_uri(),
                                                 tags=EXPERIMENT_TAGS)
        except mlflow.exceptions.MlflowException:
            return self.client.get_experiment_by_name(name).experiment_id  # created meanwhile

    def start(self, run_name: str, params: dict, run_id: str | None = None) -> str:
        """Reopen ``run_id`` (a resumed run) or create a run with the common param keys and tags."""
        import mlflow
        from mlflow.entities import Param, RunStatus

        if run_id is not None:
            try:
                self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
                return run_id
            except mlflow.exceptions.MlflowException:
                pass  # the store was reset: start a new run
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=run_tags())
        run_id = run.info.run_id
        self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in common_params(params).items()])
        return run_id

    def close_stale(self, run_name: str, keep: str) -> list[str]:
        """Mark FAILED every other RUNNING run named ``run_name``: a trainer killed so hard that it
        could not say so (SIGKILL, power loss). Returns their ids."""
        query = f"attributes.run_name = '{run_name}' and attributes.status = 'RUNNING'"
        runs = self.client.search_runs([self.experiment_id], query, max_results=1000)
        stale = [r.info.run_id for r in runs if r.info.run_id != keep]
        for run_id in stale:
            self.set_tag(run_id, "closed_as_stale_by", keep)
            self.end(run_id, failed=True)
        return stale

    def has_run(self, run_id: str) -> bool:
        """Whether the store holds ``run_id`` (a model trained against another store, or before a
        reset, has a run id this one never saw)."""
        import mlflow

        try:
            self.client.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            return False
        return True

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0, timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric

        now = timestamp_ms or int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_metrics_once(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        """Log each metric unless the run has it at ``step`` already (a stage run again)."""
        new = {k: v for k, v in metrics.items()
               if all(m.step != step for m in self.client.get_metric_history(run_id, k))}
        if new:
            self.log_metrics(run_id, new, step)

    def log_artifact(self, run_id: str, path: str | Path, folder: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), folder)

    def log_datasets(self, run_id: str, datasets: list[dict]) -> None:
        """The splits the run used (`data.dataset_input`) as MLflow dataset inputs, each tagged with
        its context; logging one a run already has adds nothing (MLflow keys them by name and digest)."""
        import mlflow
        from mlflow.entities import Dataset, DatasetInput, InputTag

        inputs = [DatasetInput(Dataset(d["name"], d["digest"], "local", json.dumps({"uri": shown_path(d["source"])}),
                                       profile=json.dumps(d["profile"])),
                               [InputTag("mlflow.data.context", d["context"])]) for d in datasets]
        for attempt in range(3):
            try:
                self.client.log_inputs(run_id, inputs)
                return
            except mlflow.exceptions.MlflowException as err:
                # Two trainers logging one new dataset at once (fanned-out seeds on one server):
                # MLflow looks the dataset up, then inserts it, and the slower insert breaks the
                # table's unique key (seen on PostgreSQL, tests/test_scale.py). Logging again finds
                # the dataset the other one wrote and links it to this run.
                if attempt == 2 or "unique" not in str(err).lower():
                    raise

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def end(self, run_id: str, failed: bool = False, end_time_ms: int | None = None) -> None:
        self.client.set_terminated(run_id, "FAILED" if failed else "FINISHED", end_time=end_time_ms)

    def log_report(self, files: list[Path], profile: str, metrics: dict[str, float]) -> str:
        """A `report` run beside the training runs, tagged with the commit, holding the report files
        and its headline numbers as metrics."""
        tags = {"git_commit": git_commit(repo_root()), "profile": profile, "kind": "report",
                "dvc_stage": os.environ.get("DVC_STAGE", "")}
        run_id = self.client.create_run(self.experiment_id, run_name="report", tags=tags).info.run_id
        try:
            self.log_metrics(run_id, metrics)
            for path in files:
                self.log_artifact(run_id, path, "report" if path.suffix != ".png" else "report/figures")
        except BaseException:
            self.end(run_id, failed=True)
            raise
        self.end(run_id)
        return run_id

    def epoch_logger(self, run_id: str) -> "EpochLogger":
        return EpochLogger(self, run_id)

    def synced_journals(self) -> dict[str, str]:
        """{journal run id: MLflow run id} of every run replayed into this store's capsnet experiments."""
        experiments = [e.experiment_id for e in self.client.search_experiments(filter_string=f"name LIKE '{EXPERIMENT}%'")]
        runs = self.client.search_runs(experiments, max_results=50000) if experiments else []
        return {r.data.tags["journal_run_id"]: r.info.run_id for r in runs if "journal_run_id" in r.data.tags}

    def synced_journal_ids(self) -> set[str]:
        return set(self.synced_journals())

    def mark_published(self, journal_ids: set[str]) -> list[str]:
        """Tag the runs replayed from ``journal_ids`` `published = true` (the filter `make ui` opens on);
        returns their experiments' ids, the most runs first."""
        synced = self.synced_journals()
        experiments: dict[str, int] = {}
        for journal_id in journal_ids & synced.keys():
            run = self.client.get_run(synced[journal_id])
            if run.data.tags.get(PUBLISHED_TAG) != "true":
                self.set_tag(run.info.run_id, PUBLISHED_TAG, "true")
            experiments[run.info.experiment_id] = experiments.get(run.info.experiment_id, 0) + 1
        return sorted(experiments, key=lambda e: -experiments[e])

    def replay(self, journal: Path) -> str | None:
        """Replay one journal file into this store as a new run, in its profile's experiment; None if
        it was synced before. A torn last line (a trainer killed mid-write) is left out with a
        warning (`read_journal`)."""
        from mlflow.entities import Param

        events = read_journal(journal)
        if not events or events[0]["event"] != "start":
            raise ValueError(f"{journal}: not a capsnet tracking journal (no start event first)")
        journal_id = journal.stem
        if journal_id in self.synced_journal_ids():
            return None
        start = events[0]
        tags = {**start["tags"], "journal_run_id": journal_id}
        profile = start["params"].get("profile") or start["tags"].get("profile") or "paper"
        run_id = self.client.create_run(self._experiment_id(experiment_name(profile)), run_name=start["run_name"],
                                        tags=tags, start_time=start["time_ms"]).info.run_id
        if start["params"]:
            self.client.log_batch(run_id, params=[Param(k, str(v)) for k, v in start["params"].items()])
        status, end_ms = "RUNNING", None
        for e in events[1:]:
            if e["event"] == "metrics":
                self.log_metrics(run_id, e["metrics"], e["step"], e["time_ms"])
            elif e["event"] == "artifact":
                path = Path(e["path"]) if Path(e["path"]).is_absolute() else repo_root() / e["path"]
                if path.is_file():
                    self.log_artifact(run_id, path, e["folder"])
                else:
                    self.set_tag(run_id, f"missing_artifact.{Path(e['path']).name}", e["path"])
            elif e["event"] == "tag":
                self.set_tag(run_id, e["key"], e["value"])
            elif e["event"] == "datasets":
                self.log_datasets(run_id, e["datasets"])
            elif e["event"] == "end":
                status, end_ms = e["status"], e["time_ms"]
        if not any(e["event"] == "datasets" for e in events) and start["params"]:
            self.log_datasets(run_id, unrecorded_datasets(start["params"]))
        if status != "RUNNING":
            self.end(run_id, failed=status == "FAILED", end_time_ms=end_ms)
        return run_id


def unrecorded_datasets(params: dict) -> list[dict]:
    """The dataset inputs of a run journalled before runs logged them (the published 2026-11-23 GPU
    runs): its training split, and its clean test split where its params give the image size, with
    "unrecorded" for the digest (only the machine that trained it could have computed it) and the
    sizes only where its params recorded them (those runs' params did not)."""
    note = "the run predates dataset logging: its digest was not recorded"
    splits = [("train", "n_train", "training")]
    if params.get("experiment") or str(params.get("image_size")).isdigit():
        size = int(params["image_size"]) if str(params.get("image_size")).isdigit() else None
        test_set = registry.load(registry.of_record(params.get("experiment"), size)).TEST_SETS[0]
        splits.append((test_set, "n_test", "testing"))
    return [{"name": name, "digest": "unrecorded", "source": f"data/prepared/{name}.safetensors", "context": context,
             "profile": {"source": note, **({"num_rows": int(params[n])} if str(params.get(n)).isdigit() else {})}}
            for name, n, context in splits]


def open_tracker(profile: str) -> Tracker | JournalTracker:
    """A journal when $CAPSNET_TRACKING_JOURNAL names a folder, else the MLflow store's experiment of
    ``profile`` (a journal's runs go to theirs when replayed)."""
    folder = os.environ.get(JOURNAL_ENV)
    return JournalTracker(folder) if folder else Tracker(profile=profile)


def port_problem(port: int) -> str | None:
    """Why no server could listen on 127.0.0.1:``port`` (probed as uvicorn binds, SO_REUSEADDR), or None:
    `capsnet ui` asks before it starts `mlflow ui`, which would log a failed bind and exit 0."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            return "is taken (another `mlflow ui`?)" if err.errno == errno.EADDRINUSE else f"cannot be used ({err.strerror})"
    return None
