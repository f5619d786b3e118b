"""The DVC pipeline for real, on tiny synthetic data: run-cache restores across clones, and a smoke
experiment that leaves the workspace's params.yaml and dvc.lock as committed.

A throwaway git + DVC repository holds this repository's dvc.yaml cut down to the train and
evaluate stages of one stacked variant with two seeds (train_stacked@capsnet_r1_recon and
evaluate_stacked@capsnet_r1_recon-<seed>; a reconstruction variant, whose evaluation draws the most
figures; the separate stages are run by tests/test_scale.py), the
prepared data as a `dvc add`ed folder, and pipeline/ (the stages' code dependencies). The stages
run this checkout's `capsnet` command.
"""

import json
import sys
import time
from pathlib import Path

import conftest
import pytest
from conftest import dvc_repo

pytest.importorskip("dvc")


def sh(cwd: Path, *command: str) -> str:
    """conftest.sh with the MLflow store in ``cwd`` (each clone its own)."""
    return conftest.sh(cwd, *command, MLFLOW_TRACKING_URI=f"sqlite:///{cwd}/mlflow.db")


SEEDS = [0, 1]
VARIANT = "capsnet_r1_recon"
MODELS = [Path(f"models/{VARIANT}/seed{k}/model.safetensors") for k in SEEDS]
METRICS = [Path(f"results/{VARIANT}/seed{k}/metrics.json") for k in SEEDS]
STAGES = [f"train_stacked@{VARIANT}", *(f"evaluate_stacked@{VARIANT}-{k}" for k in SEEDS)]


def outputs(repo: Path) -> set[str]:
    """Every file the train and evaluate stages left under models/ and results/."""
    return {str(p.relative_to(repo)) for folder in ("models", "results") for p in (repo / folder).rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def ran(tmp_path_factory, warm_server) -> dict:
    """A git + DVC repo (its DVC cache outside it) at tag `before` without dvc.lock; then `dvc repro`
    (its stages forked from the session's warm interpreter: a cold stage process under DVC is
    tests/test_scale.py's cluster tasks) and its dvc.lock and metrics committed on top. Returns the
    repo and what the run wrote."""
    root = tmp_path_factory.mktemp("dvc")
    repo = dvc_repo(root / "a", [], SEEDS, stacked=[VARIANT], scripts=True)  # scripts/fanout.sh: smoke's prefill
    sh(repo, "git", "tag", "before")
    conftest.sh(repo, "dvc", "repro", "-q", MLFLOW_TRACKING_URI=f"sqlite:///{repo}/mlflow.db", CAPSNET_WARM=warm_server[0])
    assert f"train {VARIANT} all data/prepared" in warm_server[1].read_text()  # it did run warm
    sh(repo, "git", "add", "dvc.lock", "results")
    sh(repo, "git", "commit", "-qm", "ran")
    return {"repo": repo, "outputs": outputs(repo), "models": [(repo / m).read_bytes() for m in MODELS],
            "metrics": [json.loads((repo / m).read_text()) for m in METRICS]}


def test_a_stacked_stage_trains_each_seed_into_its_own_directory(ran):
    """train_stacked@<variant> writes models/<variant>/seed<k>/ for every seed of ablation.seeds, each
    seed its own weights, and its config says the seeds trained together."""
    repo = ran["repo"]
    assert ran["models"][0] != ran["models"][1]  # two seeds, two initialisations
    for k in SEEDS:
        config = json.loads((repo / f"models/{VARIANT}/seed{k}/config.json").read_text())
        assert config["config"]["seed"] == k and config["stacked_seeds"] == SEEDS
        assert config["environment"]["dvc_stage"] == f"train_stacked@{VARIANT}"


def test_a_second_clone_sharing_the_cache_restores_train_and_evaluate_from_the_run_cache(ran, tmp_path):
    """What scale-out relies on: a stage run in one clone is restored, not rerun, in another, every
    file it wrote with it (the report reads the evaluation's figures: one DVC did not know of would
    be missing here)."""
    assert (ran["repo"] / f"checkpoints/{VARIANT}/stacked.pt").is_file()  # resume state, outside DVC
    b = tmp_path / "b"
    sh(tmp_path, "git", "clone", "-q", "--branch", "before", str(ran["repo"]), str(b))  # no dvc.lock
    sh(b, "dvc", "checkout", "-q", "data/prepared.dvc")
    out = sh(b, "dvc", "repro")
    for stage in STAGES:
        assert f"Stage '{stage}' is cached - skipping run, checking out outputs" in out
    assert [(b / m).read_bytes() for m in MODELS] == ran["models"]
    assert [json.loads((b / m).read_text()) for m in METRICS] == ran["metrics"]
    assert {f"results/{VARIANT}/seed{k}/figures/{name}.png" for k in SEEDS
            for name in ("confusion", "reconstructions", "fig4")} <= ran["outputs"]
    assert outputs(b) == ran["outputs"]
    assert not (b / "checkpoints").exists() and not (b / "mlflow.db").exists()  # nothing trained, nothing logged
    assert "up to date" in sh(b, "dvc", "status")


def test_a_smoke_experiment_leaves_params_and_lock_as_committed(ran):
    """`make smoke`'s command, for real: its prefill runs every item's stages two at a time
    (scripts/fanout.sh), each forked from the warm interpreter and logged to MLflow once; the `dvc
    exp run` after it finds them up to date (trains and logs nothing again); the
    experiment is in `dvc exp show` with its metrics, and the workspace's params.yaml and dvc.lock
    are what git has."""
    a = ran["repo"]
    started_ms = int(time.time() * 1000)
    out = sh(a, sys.executable, "-m", "pipeline.profiles", "smoke", "--warm", "--prefill", "2", "--exec",
             "dvc", "exp", "run")
    assert "prefill: every item's stages, 2 at a time" in out and f"{VARIANT}: done in slot" in out
    warm_log = (a / "logs" / "warm.log").read_text()
    for command in (f"train {VARIANT} all", *(f"evaluate models/{VARIANT}/seed{k} " for k in SEEDS)):
        assert f": {command}" in warm_log, warm_log  # forked warm, none started cold
    assert "starting cold" not in out
    for stage in STAGES:  # the exp run found the prefill's stages in dvc.lock: ran none again
        assert f"Stage '{stage}' didn't change, skipping" in out
    assert "restored params.yaml" in out and "restored dvc.lock" in out
    from mlflow.tracking import MlflowClient

    from pipeline.profiles import PROFILES
    from pipeline.core.tracking import experiment_name

    batch = PROFILES["smoke"]["train.batch_size"]  # not the committed params.yaml's
    client = MlflowClient(f"sqlite:///{a}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name(experiment_name("smoke")).experiment_id],
                              f"attributes.start_time >= {started_ms}")
    assert sorted(r.info.run_name for r in runs) == [f"{VARIANT}-seed{k}" for k in SEEDS]  # the smoke's, once each
    assert all(r.data.params["batch_size"] == str(batch) for r in runs)
    assert sh(a, "git", "status", "--porcelain", "params.yaml", "dvc.lock") == ""
    [baseline] = [row for row in json.loads(sh(a, "dvc", "exp", "show", "--json")) if row.get("experiments")]
    [experiment] = baseline["experiments"]
    result = experiment["revs"][0]["data"]
    assert result["params"]["params.yaml"]["data"]["train"]["batch_size"] == batch  # the smoke value
    for metrics in METRICS:  # each stacked seed's own metrics file, as a separate run's
        assert 0 <= result["metrics"][str(metrics)]["data"]["error_pct"] <= 100
