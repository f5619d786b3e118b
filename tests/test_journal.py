"""Deferred tracking: runs journalled without MLflow (on the GPU machine), replayed later into a store,
once; `capsnet track sync` and a journal's torn or foreign lines."""

import json

import pytest
from click.testing import CliRunner
from journals import DATASET, PARAMS, journal_a_run
from mlflow.tracking import MlflowClient

from pipeline.cli import main
from pipeline.core import tracking
from pipeline.core.journal import JournalTracker, read_journal


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


def test_a_journal_without_its_end_replays_as_a_run_still_running(tmp_path, store):
    """A journal whose trainer never wrote its end (training on past a GPU call's deadline, or killed with
    no word) says nothing of how the run ended: replayed, the run stays RUNNING, not FINISHED (the
    train stage marks it FAILED when that seed trains again: `Tracker.close_stale`)."""
    journal = JournalTracker(tmp_path / "journal")
    run_id = journal.start("capsnet_r1-seed0", PARAMS)
    journal.log_datasets(run_id, [DATASET])
    journal.log_metrics(run_id, {"test_error_pct": 4.0}, step=1)
    tracker = tracking.Tracker(profile=PARAMS["profile"])
    run = tracker.client.get_run(tracker.replay(tmp_path / "journal" / f"{run_id}.jsonl"))
    assert run.info.status == "RUNNING" and not run.info.end_time


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


def test_journal_needs_the_common_param_keys(tmp_path):
    with pytest.raises(ValueError, match="run params lack"):
        JournalTracker(tmp_path).start("x", {"variant": "v"})


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
