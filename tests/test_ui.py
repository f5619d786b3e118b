"""`capsnet ui` (`make ui`): the published runs loaded once into a store and served by `mlflow ui`, on
the experiment with the most runs; a taken port, a failed or interrupted server."""

import json

from click.testing import CliRunner
from conftest import REPO
from journals import DATASET, PARAMS
from mlflow.tracking import MlflowClient

from pipeline.cli import main
from pipeline.core import tracking
from pipeline.core.journal import JournalTracker


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
