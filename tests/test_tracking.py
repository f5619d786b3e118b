"""Tracking at its one boundary (pipeline.core.tracking): what a run logs to MLflow and when (metrics
once per step, a resumed run, the report's run, datasets, an evaluation), each profile's experiment, and
the provenance a run records. Journalled runs: tests/test_journal.py; the MLflow UI: tests/test_ui.py."""

from pathlib import Path

import pytest
from journals import DATASET, PARAMS
from mlflow.tracking import MlflowClient

from pipeline.core import provenance, tracking
from pipeline.core.journal import JournalTracker, read_journal


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


def test_a_metric_logged_once_is_once_per_step_not_once_per_run(tmp_path, store):
    """log_metrics_once (a stage run again) skips a (step, metric) the journal or the store holds, and
    only that: the same metric at another step (a run evaluated again after it trained on) is logged."""
    journal = JournalTracker(tmp_path)
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    tracker = tracking.Tracker(profile=PARAMS["profile"])
    direct = tracker.start("capsnet_r1-seed0", PARAMS)
    for step, value in ((1, 4.0), (2, 3.0), (2, 9.0)):
        journal.log_metrics_once(run_id, {"test_error_pct": value}, step)
        tracker.log_metrics_once(direct, {"test_error_pct": value}, step)
    logged = [(e["step"], e["metrics"]) for e in read_journal(tmp_path / f"{run_id}.jsonl") if e["event"] == "metrics"]
    assert logged == [(1, {"test_error_pct": 4.0}), (2, {"test_error_pct": 3.0})]
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(direct, "test_error_pct")] == [(1, 4.0), (2, 3.0)]


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
