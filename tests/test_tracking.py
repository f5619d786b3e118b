"""Deferred tracking: runs journalled without MLflow, replayed later into a store, once."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO
from mlflow.tracking import MlflowClient

from pipeline.cli import main
from pipeline.core import provenance, tracking
from pipeline.core.journal import JournalTracker, read_journal

PARAMS = {k: k.upper() for k in provenance.PARAM_KEYS}
DATASET = {"name": "train", "digest": "0123456789abcdef", "source": "data/prepared/train.safetensors",
           "context": "training", "profile": {"num_rows": 60000, "source": "MNIST train set"}}


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A sqlite MLflow store in tmp_path, which is also the repository root that runs name paths by."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    return f"sqlite:///{tmp_path}/m.db"


def journal_a_run(folder, root):
    """The calls `capsnet train` and `evaluate` make, against a journal; returns the journal run id."""
    journal = JournalTracker(folder)
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    for epoch in (1, 2):
        journal.log_metrics(run_id, {"train_loss": 1.0 / epoch, "test_error_pct": 5.0 - epoch}, step=epoch)
    (root / "models").mkdir()
    (root / "models" / "config.json").write_text("{}")
    journal.log_artifact(run_id, root / "models" / "config.json")
    journal.log_artifact(run_id, root / "models" / "model.safetensors")  # not brought home: tagged as missing
    journal.log_datasets(run_id, [DATASET | {"source": str(root / DATASET["source"])}])  # as the repository names it
    journal.end(run_id)
    assert journal.start("capsnet_r1-seed0", PARAMS, run_id=run_id) == run_id  # a resumed run appends
    journal.log_metrics(run_id, {"test_error_pct": 2.5}, step=3)
    journal.end(run_id)
    return run_id


def test_journal_replays_into_mlflow_once(tmp_path, store):
    journal_id = journal_a_run(tmp_path / "journal", tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "journal" / f"{journal_id}.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and lines[0]["params"] == PARAMS
    assert {"event": "artifact", "path": "models/config.json", "folder": None}.items() <= lines[3].items()
    assert [e["datasets"][0]["source"] for e in lines if e["event"] == "datasets"] == [DATASET["source"]]

    result = CliRunner().invoke(main, ["track", "sync", str(tmp_path / "journal")])
    assert result.exit_code == 0, result.output
    assert "1 run(s) added" in result.output
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(tracking.experiment_name(PARAMS["profile"]))  # its profile's own
    assert experiment.name == "capsnet-repro-PROFILE" and tracking.experiment_name("paper") == "capsnet-repro"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "capsnet_r1-seed0" and run.info.status == "FINISHED"
    assert run.data.params == PARAMS and run.data.tags["journal_run_id"] == journal_id
    assert run.data.tags["missing_artifact.model.safetensors"] == "models/model.safetensors"
    history = client.get_metric_history(run.info.run_id, "test_error_pct")
    assert [(m.step, m.value) for m in history] == [(1, 4.0), (2, 3.0), (3, 2.5)]
    assert [m.timestamp for m in history] == [e["time_ms"] for e in lines if "test_error_pct" in e.get("metrics", {})]
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.json"]
    assert run.info.start_time == lines[0]["time_ms"]  # the original timestamps, not the sync's
    assert lines[-1]["event"] == "end" and run.info.end_time == lines[-1]["time_ms"]
    (dataset_input,) = run.inputs.dataset_inputs
    dataset = dataset_input.dataset
    assert (dataset.name, dataset.digest, json.loads(dataset.profile)) == ("train", DATASET["digest"], DATASET["profile"])
    assert json.loads(dataset.source) == {"uri": "data/prepared/train.safetensors"}
    assert [(t.key, t.value) for t in dataset_input.tags] == [("mlflow.data.context", "training")]

    again = CliRunner().invoke(main, ["track", "sync", str(tmp_path / "journal")])
    assert again.exit_code == 0 and "0 run(s) added" in again.output and "synced before" in again.output


def test_a_stage_run_again_logs_its_metrics_once_and_a_failed_run_stays_failed(tmp_path, store):
    """`capsnet evaluate` run twice logs each metric once per step, in a journal and in a store; a run
    that ended failed is FAILED in the journal, after its replay, and in a store it logs to directly."""
    journal = JournalTracker(tmp_path / "journal")
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    journal.log_metrics_once(run_id, {"error_pct": 0.5}, step=3)
    journal.log_metrics_once(run_id, {"error_pct": 0.5, "transformed_error_pct": 9.0}, step=3)
    journal.log_datasets(run_id, [DATASET])
    journal.end(run_id, failed=True)
    events = read_journal(tmp_path / "journal" / f"{run_id}.jsonl")
    assert [e["metrics"] for e in events if e["event"] == "metrics"] == [{"error_pct": 0.5}, {"transformed_error_pct": 9.0}]
    assert events[-1]["status"] == "FAILED"

    tracker = tracking.Tracker(profile=PARAMS["profile"])
    replayed = tracker.client.get_run(tracker.replay(tmp_path / "journal" / f"{run_id}.jsonl"))
    assert replayed.info.status == "FAILED"
    direct = tracker.start("capsnet_r1-seed0", PARAMS)
    for _ in range(2):
        tracker.log_metrics_once(direct, {"error_pct": 0.5}, step=3)
    tracker.end(direct, failed=True)
    for run in (replayed.info.run_id, direct):
        assert [(m.step, m.value) for m in tracker.client.get_metric_history(run, "error_pct")] == [(3, 0.5)]
    assert tracker.client.get_run(direct).info.status == "FAILED"


def test_the_report_run_files_its_figures_apart_from_its_tables(tmp_path, store, monkeypatch):
    """`capsnet report`'s own run, journalled or in a store: its files under report/, the figures under
    report/figures/, its headline numbers as metrics, tagged as the report."""
    files = [tmp_path / "ablation.md", tmp_path / "table1.png"]
    for path in files:
        path.write_text("x")
    journal = JournalTracker(tmp_path / "journal")
    run_id = journal.log_report(files, "gpu", {"capsnet_r3_recon.error_pct": 0.3})
    events = read_journal(tmp_path / "journal" / f"{run_id}.jsonl")
    assert events[0]["tags"]["kind"] == "report" and events[0]["tags"]["profile"] == "gpu"
    assert [(e["path"], e["folder"]) for e in events if e["event"] == "artifact"] == [
        ("ablation.md", "report"), ("table1.png", "report/figures")]
    tracker = tracking.Tracker(profile="gpu")
    stored = tracker.log_report(files, "gpu", {"capsnet_r3_recon.error_pct": 0.3})
    assert [a.path for a in tracker.client.list_artifacts(stored, "report")] == ["report/ablation.md", "report/figures"]
    assert [a.path for a in tracker.client.list_artifacts(stored, "report/figures")] == ["report/figures/table1.png"]
    assert tracker.client.get_run(stored).data.metrics == {"capsnet_r3_recon.error_pct": 0.3}

    def full_disk(*args):
        raise OSError("disk full")

    monkeypatch.setattr(tracker, "log_artifact", full_disk)
    with pytest.raises(OSError):
        tracker.log_report(files, "gpu", {})
    (cut,) = [r for r in tracker.client.search_runs([tracker.experiment_id]) if r.info.run_id != stored]
    assert cut.info.status == "FAILED"  # not left RUNNING, not FINISHED with files missing


def test_a_resumed_run_logs_on_into_its_run_and_one_the_store_lost_starts_anew(tmp_path, store):
    tracker = tracking.Tracker(profile="gpu")
    first = tracker.start("capsnet_r1-seed0", PARAMS)
    tracker.end(first, failed=True)  # stopped by a call's time limit
    assert tracker.start("capsnet_r1-seed0", PARAMS, run_id=first) == first
    assert tracker.client.get_run(first).info.status == "RUNNING"
    fresh = tracker.start("capsnet_r1-seed0", PARAMS, run_id="0" * 32)  # trained against another store
    assert fresh not in (first, "0" * 32) and tracker.client.get_run(fresh).data.params == PARAMS


def test_each_epochs_metrics_are_logged_at_the_epoch_as_their_step(tmp_path):
    """Training hands each epoch's metrics (1-based `epoch` among them) to the tracker's epoch logger:
    the epoch is the step, never a metric of its own, so a curve's x axis is the epoch trained."""
    journal = JournalTracker(tmp_path)
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    logger = journal.epoch_logger(run_id)
    for epoch in (1, 2):
        logger.log_epoch(epoch, {"epoch": epoch, "train_loss": 1.0 / epoch})
    events = [e for e in read_journal(tmp_path / f"{run_id}.jsonl") if e["event"] == "metrics"]
    assert [(e["step"], e["metrics"]) for e in events] == [(1, {"train_loss": 1.0}), (2, {"train_loss": 0.5})]


def test_each_profile_has_its_experiment_its_runs_table_its_order_and_a_sqlite_store_its_lock():
    """Records from before the profile key ("") are the paper protocol's; the UI's runs table is sorted
    by variant, ascending; only a sqlite store needs a lock beside it (a server serialises its own)."""
    assert [tracking.experiment_name(p) for p in ("paper", "", "gpu")] == [
        "capsnet-repro", "capsnet-repro", "capsnet-repro-gpu"]
    url = tracking.runs_url(5000, "7")
    assert url.startswith("http://127.0.0.1:5000/#/experiments/7/runs?") and url.endswith(
        "orderByKey=params.%60variant%60&orderByAsc=true")
    assert tracking._store_lock("sqlite:////data/m.db") == Path("/data/m.db.lock")
    assert tracking._store_lock("postgresql://u@db/mlflow") is None


def test_a_sqlite_stores_runs_keep_their_files_beside_it_wherever_the_process_runs(tmp_path, monkeypatch):
    """A store in a scratch folder (a test's, a rehearsal's) keeps its runs' artifacts in mlruns/ beside
    its file, not in the directory the process ran from; a relative sqlite path is the process's
    directory's, as MLflow reads it; a server's store, the repository's mlruns/."""
    elsewhere, store = tmp_path / "elsewhere", tmp_path / "store"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}/m.db")
    store.mkdir()
    (tmp_path / "config.json").write_text("{}")
    tracker = tracking.Tracker(profile="gpu")
    run_id = tracker.start("capsnet_r1-seed0", PARAMS)
    tracker.log_artifact(run_id, tmp_path / "config.json")
    assert [p.relative_to(store) for p in store.rglob("config.json")] == [
        Path("mlruns", run_id, "artifacts", "config.json")]
    assert not (elsewhere / "mlruns").exists()
    assert tracking.artifact_root("sqlite:///m.db") == elsewhere / "mlruns"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    assert tracking.artifact_root("postgresql://u@db/mlflow") == tmp_path / "repo" / "mlruns"


def test_the_report_run_is_tagged_with_its_commit_and_stage_and_ends_finished_and_a_lost_run_is_not_had(
        tmp_path, store, monkeypatch):
    """The store's report run names the commit and DVC stage that wrote it and ends FINISHED; has_run
    answers no for a run id the store never saw (a model trained against another store)."""
    monkeypatch.setenv("CAPSNET_GIT_COMMIT", "abc1234")
    monkeypatch.setenv("DVC_STAGE", "report")
    (tmp_path / "ablation.md").write_text("x")
    tracker = tracking.Tracker(profile="gpu")
    run = tracker.client.get_run(tracker.log_report([tmp_path / "ablation.md"], "gpu", {}))
    assert {k: run.data.tags[k] for k in ("git_commit", "dvc_stage", "kind", "profile")} == {
        "git_commit": "abc1234", "dvc_stage": "report", "kind": "report", "profile": "gpu"}
    assert run.info.status == "FINISHED" and tracker.has_run(run.info.run_id)
    assert not tracker.has_run("0" * 32)


def test_a_journalled_report_replays_into_its_profiles_experiment_with_its_tags(tmp_path, store):
    """A report run's journal names its profile in its tags alone (it logs no params): replayed, it lands
    in that profile's experiment, with every tag it set."""
    (tmp_path / "ablation.md").write_text("x")
    journal = JournalTracker(tmp_path / "journal")
    run_id = journal.log_report([tmp_path / "ablation.md"], "gpu", {})
    journal.set_tag(run_id, "note", "rehearsal")
    tracker = tracking.Tracker(profile="paper")
    replayed = tracker.client.get_run(tracker.replay(tmp_path / "journal" / f"{run_id}.jsonl"))
    assert tracker.client.get_experiment(replayed.info.experiment_id).name == "capsnet-repro-gpu"
    assert replayed.data.tags["note"] == "rehearsal" and replayed.data.tags["kind"] == "report"


def test_a_journalled_report_run_replays_as_the_stores_with_its_commit_stage_metrics_and_end(tmp_path, store,
                                                                                              monkeypatch):
    """As the store's report run (above): the journal's names the commit and DVC stage that wrote it,
    logs the headline metrics and, replayed, ends FINISHED."""
    monkeypatch.setenv("CAPSNET_GIT_COMMIT", "abc1234")
    monkeypatch.setenv("DVC_STAGE", "report")
    (tmp_path / "ablation.md").write_text("x")
    run_id = JournalTracker(tmp_path / "journal").log_report([tmp_path / "ablation.md"], "gpu", {"error_pct": 0.3})
    tracker = tracking.Tracker(profile="gpu")
    run = tracker.client.get_run(tracker.replay(tmp_path / "journal" / f"{run_id}.jsonl"))
    assert {k: run.data.tags[k] for k in ("git_commit", "dvc_stage", "kind", "profile")} == {
        "git_commit": "abc1234", "dvc_stage": "report", "kind": "report", "profile": "gpu"}
    assert run.data.metrics == {"error_pct": 0.3} and run.info.status == "FINISHED"


def test_a_run_journalled_before_dataset_logging_gets_its_splits_by_image_size_and_the_sizes_it_recorded():
    """unrecorded_datasets: a record from before the experiment key finds its test split by its image size;
    a size is given where the params recorded it, and nowhere else."""
    train, test = tracking.unrecorded_datasets({"image_size": "40", "n_train": "60000"})
    assert (train["name"], test["name"]) == ("train", "expanded_test")
    assert train["profile"]["num_rows"] == 60000 and "num_rows" not in test["profile"]
    assert [d["name"] for d in tracking.unrecorded_datasets({"image_size": "None"})] == ["train"]


def test_a_port_another_server_holds_is_taken_and_one_refused_otherwise_says_why(monkeypatch):
    """`capsnet ui`'s port check: a port another server listens on is taken; one refused for another
    reason (a privileged port, say) is not called taken."""
    import errno
    import socket

    class Refused(socket.socket):
        def bind(self, address):
            raise OSError(errno.EACCES, "Permission denied")

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert tracking.port_problem(server.getsockname()[1]) == "is taken (another `mlflow ui`?)"
    monkeypatch.setattr(tracking.socket, "socket", Refused)
    assert tracking.port_problem(80) == "cannot be used (Permission denied)"


def test_an_experiment_another_process_creates_first_is_found_not_an_error(store, monkeypatch):
    """Two stages start at once on a fresh store: the slower create_experiment fails, and the tracker
    takes the one the faster made."""
    import mlflow

    real = MlflowClient.create_experiment

    def raced(client, name, **kwargs):
        real(client, name, **kwargs)  # the other process, first
        raise mlflow.exceptions.MlflowException(f"Experiment '{name}' already exists.")

    monkeypatch.setattr(MlflowClient, "create_experiment", raced)
    tracker = tracking.Tracker(store, profile="raced")
    assert tracker.experiment_id == tracker.client.get_experiment_by_name("capsnet-repro-raced").experiment_id


def test_published_runs_open_on_the_experiment_with_the_most_and_every_experiment_is_model_training(
        tmp_path, store):
    """`capsnet ui` opens the experiment holding most of the published runs (mark_published's first);
    an experiment an older version made without MLflow's model-training kind gets it. (mark_published
    counts runs in a set's order, so an unsorted answer would pass here by chance: scripts/mutate.py
    has no entry for it.)"""
    MlflowClient(store).create_experiment(tracking.experiment_name("smoke"))
    journal = JournalTracker(tmp_path / "journal")
    ids = []
    for profile in ("smoke", "gpu", "gpu"):
        ids.append(journal.start("capsnet_r1-seed0", PARAMS | {"profile": profile}))
        journal.log_datasets(ids[-1], [DATASET])
        journal.end(ids[-1])
    tracker = tracking.Tracker(profile="gpu")
    for run_id in ids:
        tracker.replay(tmp_path / "journal" / f"{run_id}.jsonl")
    by_name = {e.name: e for e in tracker.client.search_experiments()}
    smoke, gpu = by_name["capsnet-repro-smoke"], by_name["capsnet-repro-gpu"]
    assert tracker.mark_published(set(ids)) == [gpu.experiment_id, smoke.experiment_id]
    assert smoke.tags["mlflow.experimentKind"] == "custom_model_development"


def test_open_tracker_defers_when_a_journal_folder_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(tracking.JOURNAL_ENV, str(tmp_path / "j"))
    assert isinstance(tracking.open_tracker("smoke"), JournalTracker)
    monkeypatch.delenv(tracking.JOURNAL_ENV)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    assert isinstance(tracking.open_tracker("smoke"), tracking.Tracker)


def test_sync_says_how_many_runs_it_added_and_found_there_and_warns_of_a_torn_tail(tmp_path, store):
    """Each `capsnet track sync` says how many runs it added and how many an earlier sync had; a journal
    cut mid-line (its process killed mid-write) replays up to the torn line, with a warning naming it."""
    folder = tmp_path / "journal"
    journal = JournalTracker(folder)

    def started(name):
        run_id = journal.start(name, PARAMS)
        journal.log_datasets(run_id, [DATASET])
        return run_id

    journal.end(started("capsnet_r1-seed0"))
    torn = started("capsnet_r1-seed1")
    with (folder / f"{torn}.jsonl").open("a") as f:
        f.write('{"event": "metr')
    result = CliRunner().invoke(main, ["track", "sync", str(folder)])
    assert result.exit_code == 0, result.output
    assert f"warning: {folder / torn}.jsonl: line 3 is torn" in result.output
    assert "2 run(s) added to " in result.output and ", 0 already there" in result.output
    journal.end(started("capsnet_r1-seed2"))
    again = CliRunner().invoke(main, ["track", "sync", str(folder)])
    assert "1 run(s) added to " in again.output and ", 2 already there" in again.output, again.output


def test_a_journal_reads_past_a_blank_line_and_its_torn_tail_warning_counts_the_records_kept(tmp_path):
    """A blank line (journals joined by hand, say) is no record and no error; a torn last line's warning
    names its line and how many complete records before it replay."""
    path = tmp_path / "run.jsonl"
    path.write_text('{"event": "start"}\n\n{"event": "end"}\n{"event": "metr')
    with pytest.warns(UserWarning, match=r"line 4 is torn .*replaying the 2 complete record\(s\) before it"):
        assert read_journal(path) == [{"event": "start"}, {"event": "end"}]


def test_sync_rejects_an_empty_folder_and_a_foreign_file(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    (tmp_path / "j").mkdir()
    result = CliRunner().invoke(main, ["track", "sync", str(tmp_path / "j")])
    assert result.exit_code == 1 and "holds no *.jsonl journal" in result.output
    (tmp_path / "j" / "x.jsonl").write_text(json.dumps({"event": "metrics"}) + "\n")
    result = CliRunner().invoke(main, ["track", "sync", str(tmp_path / "j")])
    assert result.exit_code == 1 and "not a capsnet tracking journal" in result.output


def test_a_journal_starts_a_run_with_its_tags_and_resumes_only_a_run_it_holds_tagging_it_resumed(tmp_path,
                                                                                                  monkeypatch):
    """A run starts with where it ran (commit, stage, host: provenance.run_tags) and when, in milliseconds
    since the epoch (MLflow's timestamps, which a replay keeps). Its id given back (a checkpoint's, on
    resume) appends to its journal, tagged resumed; an id this folder holds no journal of (a run of
    another store) starts a run of its own instead of a journal without a start."""
    import time

    monkeypatch.setattr("pipeline.core.journal.run_tags", lambda: {"git_commit": "c0ffee", "host": "gpu-box"})
    journal = JournalTracker(tmp_path)
    before = time.time() * 1000
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    [start] = read_journal(tmp_path / f"{run_id}.jsonl")
    assert start["tags"] == {"git_commit": "c0ffee", "host": "gpu-box"}
    assert before - 1 <= start["time_ms"] <= time.time() * 1000
    assert journal.start("capsnet_r1-seed0", PARAMS, run_id=run_id) == run_id
    last = read_journal(tmp_path / f"{run_id}.jsonl")[-1]
    assert (last["event"], last["key"], last["value"]) == ("tag", "resumed", "true")
    elsewhere = "0" * 32
    fresh = journal.start("capsnet_r1-seed0", PARAMS, run_id=elsewhere)
    assert fresh not in (elsewhere, run_id) and not (tmp_path / f"{elsewhere}.jsonl").exists()
    assert read_journal(tmp_path / f"{fresh}.jsonl")[0]["event"] == "start"


def test_a_metric_logged_once_is_once_per_step_not_once_per_run(tmp_path):
    """log_metrics_once (a stage run again) skips a (step, metric) the journal holds, and only that:
    the same metric at another step is logged."""
    journal = JournalTracker(tmp_path)
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    for step, value in ((1, 4.0), (2, 3.0), (2, 9.0)):
        journal.log_metrics_once(run_id, {"test_error_pct": value}, step)
    logged = [(e["step"], e["metrics"]) for e in read_journal(tmp_path / f"{run_id}.jsonl") if e["event"] == "metrics"]
    assert logged == [(1, {"test_error_pct": 4.0}), (2, {"test_error_pct": 3.0})]


def test_journal_needs_the_common_param_keys(tmp_path):
    with pytest.raises(ValueError, match="run params lack"):
        JournalTracker(tmp_path).start("x", {"variant": "v"})


def test_a_run_records_its_commit_stage_experiment_host_slot_threads_and_versions(monkeypatch):
    """What run_tags and environment record comes from where it ran: the commit it was told, DVC's
    stage and experiment, the host, the GPUs the slot was given, torch's threads and the versions."""
    import platform

    import torch

    for name, value in (("CAPSNET_GIT_COMMIT", "abc1234"), ("DVC_STAGE", "train_stacked@capsnet_r1"),
                        ("DVC_EXP_NAME", "smoke-exp"), ("CUDA_VISIBLE_DEVICES", "3")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 5)
    monkeypatch.setattr(platform, "node", lambda: "node-7")
    where = {"git_commit": "abc1234", "dvc_stage": "train_stacked@capsnet_r1", "host": "node-7",
             "cuda_visible_devices": "3", "cpu_threads": "5"}
    tags, env = provenance.run_tags(), provenance.environment()
    assert tags.items() >= (where | {"dvc_exp_name": "smoke-exp"}).items() and env.items() >= where.items()
    assert (env["torch_version"], env["python_version"]) == (torch.__version__, platform.python_version())


def test_git_commit_is_dirty_for_code_changes_but_not_for_report_outputs(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.delenv("CAPSNET_GIT_COMMIT", raising=False)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "ablation.md").write_text("old\n")
    (tmp_path / "train.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "reports" / "ablation.md").write_text("rewritten by the report stage\n")
    (tmp_path / "notes.txt").write_text("a file git does not track is no code the run ran\n")
    assert provenance.git_commit(tmp_path) == head
    (tmp_path / "train.py").write_text("x = 2\n")
    assert provenance.git_commit(tmp_path) == head + "-dirty"


def test_a_tree_without_git_records_the_commit_it_was_told_or_unknown(tmp_path, monkeypatch):
    """A GPU box gets the working tree without .git: its runs record $CAPSNET_GIT_COMMIT (set by the
    window's scripts), and 'unknown' without it, never a commit guessed from elsewhere."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path
    monkeypatch.delenv("CAPSNET_GIT_COMMIT", raising=False)
    assert provenance.git_commit(tmp_path) == "unknown"
    monkeypatch.setenv("CAPSNET_GIT_COMMIT", "abc1234")
    assert provenance.git_commit(tmp_path) == "abc1234"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))  # what config.json and the run's tags record
    assert provenance.environment()["git_commit"] == provenance.run_tags()["git_commit"] == "abc1234"


def test_a_torn_last_line_replays_the_complete_records_and_a_torn_middle_refuses(tmp_path, store):
    """A trainer killed mid-write leaves a partial last line: its complete epochs are still replayed,
    with a one-line warning naming the file and the line; a malformed line before the end is not a
    torn tail, and the file is refused naming that line."""
    journal_id = journal_a_run(tmp_path / "journal", tmp_path)
    path = tmp_path / "journal" / f"{journal_id}.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + '\n{"event": "end", "sta')  # killed while writing its last line
    result = CliRunner().invoke(main, ["track", "sync", str(tmp_path / "journal")])
    assert result.exit_code == 0, result.output
    assert f"warning: {path}: line {len(lines)} is torn" in result.output
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(tracking.experiment_name(PARAMS["profile"]))  # its profile's own
    (run,) = client.search_runs([experiment.experiment_id])
    history = client.get_metric_history(run.info.run_id, "test_error_pct")
    assert [(m.step, m.value) for m in history] == [(1, 4.0), (2, 3.0), (3, 2.5)]  # every complete epoch

    other = tmp_path / "j2"
    other.mkdir()
    (other / "x.jsonl").write_text(lines[0] + '\n{"event": "metr\n' + lines[1] + "\n")
    result = CliRunner().invoke(main, ["track", "sync", str(other)])
    assert result.exit_code == 1 and "line 2 is not a journal record" in result.output


def test_ui_loads_the_published_journals_once_and_serves_them(tmp_path, monkeypatch):
    """`capsnet ui` (make ui): the published journals go into the store once (a second start adds
    none), into their profile's own experiment, tagged published; the URL it prints is the runs
    table (not MLflow 3's GenAI overview) filtered on that tag; `mlflow ui` on loopback serves them."""
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from conftest import tool_env

    journals = sorted((REPO / "reports" / "runs" / "journal").glob("*.jsonl"))[:2]
    (tmp_path / "journal").mkdir()
    for journal in journals:
        shutil.copy(journal, tmp_path / "journal")
    env = tool_env(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/ui.db", PYTHONPATH=str(REPO))
    ui = [sys.executable, "-m", "pipeline.cli", "ui", "--journal", str(tmp_path / "journal")]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])  # the first start: here
    first = CliRunner().invoke(main, ["ui", "--journal", str(tmp_path / "journal"), "--dry-run"])
    assert first.exit_code == 0, first.output
    assert "2 published run(s) loaded, 0 already" in first.stdout and "/#/experiments/" in first.stdout
    assert "-> run" not in first.stdout  # a count, not a line per journal
    url = first.stdout.split("the published runs (experiment capsnet-repro-gpu): ")[1].split()[0]
    experiment_id = url.split("/#/experiments/")[1].split("/")[0]
    assert url == tracking.runs_url(5000, experiment_id, "tags.published = 'true'")
    assert "/runs?" in url and "searchFilter=tags.published+%3D+%27true%27" in url and "orderByKey=params." in url
    store = MlflowClient(env["MLFLOW_TRACKING_URI"])
    assert store.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    assert all(r.data.tags["published"] == "true" for r in store.search_runs([experiment_id]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([*ui, "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 180
        while True:
            try:
                body = json.dumps({"experiment_ids": [experiment_id]}).encode()
                request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search", data=body,
                                                 headers={"Content-Type": "application/json"})
                runs = json.loads(urllib.request.urlopen(request, timeout=5).read())["runs"]
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, server.stdout.read()
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the UI and the server processes it started
        output = server.communicate(timeout=60)[0]
    assert "0 published run(s) loaded, 2 already" in output  # the second start added nothing
    assert sorted(r["info"]["run_name"] for r in runs) == sorted(
        json.loads(j.read_text().splitlines()[0])["run_name"] for j in journals)
    # journalled before runs logged their datasets: the training split (and the clean test split where
    # the params name the image size), digest unrecorded
    for run in runs:
        datasets = {i["dataset"]["name"]: i["dataset"] for i in run["inputs"]["dataset_inputs"]}
        assert "train" in datasets and set(datasets) <= {"train", "test", "expanded_test", "multimnist_test"}
        assert {d["digest"] for d in datasets.values()} == {"unrecorded"}


def test_ui_on_a_taken_port_says_so_before_loading_anything(tmp_path, monkeypatch):
    """`mlflow ui` on a port another server holds logs the failed bind among its start-up lines and
    exits 0; `capsnet ui` refuses first, in one line naming the port and a command that serves on
    another, and loads nothing; a port outside 1-65535 is a usage error."""
    import socket

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/ui.db")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = CliRunner().invoke(main, ["ui", "--journal", str(REPO / "reports" / "runs" / "journal"),
                                           "--port", str(port)])
    assert result.exit_code == 1 and f"port {port} on 127.0.0.1 is taken" in result.output
    assert f"`capsnet ui --port {port + 1}`" in result.output and "loaded" not in result.output
    assert not (tmp_path / "ui.db").exists()
    result = CliRunner().invoke(main, ["ui", "--port", "99999"])
    assert result.exit_code == 2 and "99999 is not in the range" in result.output
    monkeypatch.setattr(tracking, "port_problem", lambda port: "is taken (another `mlflow ui`?)")
    for taken in (65535, 80):  # the next port does not exist, or is a privileged one: the default's neighbour
        result = CliRunner().invoke(main, ["ui", "--port", str(taken)])
        assert result.exit_code == 1 and "serve on another one: `capsnet ui --port 5001` (make ui PORT=5001)" in (
            result.output), result.output


def test_ui_says_when_mlflow_ui_stops_with_an_error_and_stops_quietly_on_ctrl_c(tmp_path, monkeypatch, store):
    """...and starts `mlflow ui` without MLflow's job runner (its huey consumers), unless the
    environment asks for it."""
    import subprocess

    def mlflow_ui(status, jobs):
        def run(command, check, env):
            assert command[1:4] == ["-m", "mlflow", "ui"] and check
            assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == jobs and env["MLFLOW_TRACKING_URI"] == store
            if status is None:
                raise KeyboardInterrupt
            raise subprocess.CalledProcessError(status, command)
        return run

    monkeypatch.setattr(tracking, "port_problem", lambda port: None)
    monkeypatch.delenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", raising=False)
    for status, code, line in ((3, 1, "Error: mlflow ui stopped with status 3 (is port 5000 taken? use --port)"),
                               (None, 0, "Ctrl-C stops the UI")):
        monkeypatch.setattr(subprocess, "run", mlflow_ui(status, "false"))
        result = CliRunner().invoke(main, ["ui", "--journal", str(tmp_path / "none")])
        assert result.exit_code == code and line in result.output, result.output
    monkeypatch.setenv("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "true")
    monkeypatch.setattr(subprocess, "run", mlflow_ui(None, "true"))
    assert CliRunner().invoke(main, ["ui", "--journal", str(tmp_path / "none")]).exit_code == 0


def test_two_writers_logging_one_new_dataset_at_once_both_get_it(tmp_path, monkeypatch):
    """MLflow's log_inputs looks a dataset up and then inserts it: of two trainers logging the same new
    dataset at once, the second insert breaks the unique key (seen on PostgreSQL in the fan-out
    test). The loser logs again and finds the dataset; any other error still stops the run."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/m.db")
    tracker = tracking.Tracker()
    run_id = tracker.start("capsnet_r1-seed0", {k: "0" for k in provenance.PARAM_KEYS})
    real, calls = tracker.client.log_inputs, []

    def racing(run, inputs, errors):
        calls.append(run)
        if errors:
            raise mlflow.exceptions.MlflowException(errors.pop(0))
        real(run, inputs)

    lost = ["(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint \"dataset_pk\""]
    monkeypatch.setattr(tracker.client, "log_inputs", lambda run, inputs: racing(run, inputs, lost))
    tracker.log_datasets(run_id, [DATASET])
    assert len(calls) == 2
    assert [i.dataset.digest for i in tracker.client.get_run(run_id).inputs.dataset_inputs] == [DATASET["digest"]]
    other = ["RESOURCE_DOES_NOT_EXIST: run not found"]
    monkeypatch.setattr(tracker.client, "log_inputs", lambda run, inputs: racing(run, inputs, other))
    with pytest.raises(mlflow.exceptions.MlflowException, match="not found"):
        tracker.log_datasets(run_id, [DATASET])


def test_an_evaluation_is_logged_to_its_training_run_at_the_last_epoch_under_evaluation(tmp_path, store):
    """What `capsnet evaluate` adds to the run its model trained as: the metrics at the epoch training
    ended (the learning curve's last step), its files under evaluation/, its test sets as datasets."""
    from pipeline.stages.evaluate import log_evaluation

    run_id = tracking.open_tracker("smoke").start("capsnet_r1-seed0", PARAMS)
    out = tmp_path / "results"
    (out / "figures").mkdir(parents=True)
    (out / "metrics.json").write_text("{}")
    (out / "figures" / "confusion.png").write_bytes(b"png")
    saved = {"config": {"profile": "smoke"}, "run_id": run_id, "epochs_trained": 7}
    log_evaluation(saved, tmp_path / "models", out, {"eval_test_error_pct": 1.5},
                   ["metrics.json", "figures/confusion.png"], [DATASET | {"source": str(tmp_path / DATASET["source"])}])
    client = MlflowClient(store)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval_test_error_pct")] == [(7, 1.5)]
    assert [a.path for a in client.list_artifacts(run_id)] == ["evaluation"]
    assert {a.path for a in client.list_artifacts(run_id, "evaluation")} == {"evaluation/metrics.json",
                                                                             "evaluation/confusion.png"}  # by name
    assert [i.dataset.name for i in client.get_run(run_id).inputs.dataset_inputs] == [DATASET["name"]]
