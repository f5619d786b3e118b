"""Scale-out for real, on CPU: `make gpus`' fan-out (scripts/fanout.sh) of three items (a stacked
variant with its two seeds, and a separate variant's two seeds) over three fake GPU slots into one
DVC workspace, logging to an MLflow server on loopback (on PostgreSQL, started here, where it can run:
tests/tracking_stack.py); the
SLURM array script's tasks run as local processes (SLURM variables set) against a DVC remote, with
deferred tracking, then gathered from the run-cache in another clone; the stage list they share.
"""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import BIN, REPO, dvc_repo, sh
from conftest import tool_env as env
from tracking_stack import Unavailable, mlflow_server, postgres_cluster

from pipeline.core import stage_names as stages
from pipeline.core.errors import UserError
from pipeline.core.params import load_params

pytest.importorskip("dvc")

STACKED, SEPARATE, SEEDS = ["capsnet_r1"], ["capsnet_r3"], [0, 1]
ITEMS = ["capsnet_r1", "capsnet_r3-0", "capsnet_r3-1"]  # stacked variants first
STAGES = {"capsnet_r1": ["train_stacked@capsnet_r1", "evaluate_stacked@capsnet_r1-0", "evaluate_stacked@capsnet_r1-1"],
          "capsnet_r3-0": ["train@capsnet_r3-0", "evaluate@capsnet_r3-0"],
          "capsnet_r3-1": ["train@capsnet_r3-1", "evaluate@capsnet_r3-1"]}
RUNS = {"capsnet_r1-seed0": "capsnet_r1", "capsnet_r1-seed1": "capsnet_r1",  # MLflow run -> its item
        "capsnet_r3-seed0": "capsnet_r3-0", "capsnet_r3-seed1": "capsnet_r3-1"}
FAKE_GPUS = ["0", "1", "2"]


def lock_stages(repo: Path) -> set[str]:
    return set(yaml.safe_load((repo / "dvc.lock").read_text())["stages"])


def every_stage() -> set[str]:
    return {stage for item in ITEMS for stage in STAGES[item]}


def scale_repo(root: Path) -> Path:
    """The tiny pipeline with the scripts, ignoring what this repository ignores (models/, results/ but
    their metrics, …), so that what a script commits is what it would commit here; but data/, where the
    tiny pipeline's prepared data is `dvc add`-ed (a .dvc file DVC refuses to read in an ignored folder)."""
    repo = dvc_repo(root, SEPARATE, SEEDS, stacked=STACKED, scripts=True)
    ignores = [line for line in (REPO / ".gitignore").read_text().splitlines() if line != "/data/"]
    (repo / ".gitignore").write_text("\n".join(ignores) + "\n")
    sh(repo, "git", "add", ".gitignore")
    sh(repo, "git", "commit", "-qm", "this repository's ignores")
    return repo


# ---- the stage list ---------------------------------------------------------------------------


def test_stage_list_is_dvc_matrix_names_in_params_order():
    """What every engine fans out: the items of the committed params.yaml, each with its DVC stages
    named as dvc.yaml's matrices name them, and together every train and evaluate stage once."""
    params = load_params(REPO / "params.yaml")
    names = stages.items(params)
    listed = sh(REPO, "dvc", "stage", "list", "--name-only").split()
    fanned = [stage for n in names for stage in stages.stage_names(params, n)]
    assert sorted(fanned) == sorted(s for s in listed if s.split("@")[0] in
                                    ("train", "train_stacked", "evaluate", "evaluate_stacked"))
    assert len(set(fanned)) == len(fanned)
    assert names[:len(params.ablation.stacked)] == list(params.ablation.stacked)
    assert sh(REPO, "capsnet", "stages").split() == names
    assert sh(REPO, "capsnet", "stages", "--count").strip() == str(len(names))
    assert sh(REPO, "capsnet", "stages", "--index", "0", "--kind", "stages").split() == [
        f"train_stacked@{names[0]}", *(f"evaluate_stacked@{names[0]}-{k}" for k in params.ablation.seeds)]
    last = names[-1]
    assert sh(REPO, "capsnet", "stages", "--index", str(len(names) - 1), "--kind", "stages").split() == [
        f"train@{last}", f"evaluate@{last}"]
    with pytest.raises(UserError, match="not an item"):
        stages.stage_names(params, "capsnet_r9")


def test_an_array_index_outside_the_list_names_the_range_to_submit():
    with pytest.raises(UserError, match=r"index 3 is outside the 3 .* submit the array as 0-2"):
        stages.item_at(ITEMS, 3)
    with pytest.raises(UserError, match="outside"):
        stages.item_at(ITEMS, -1)
    assert [stages.item_at(ITEMS, i) for i in range(3)] == ITEMS


def test_kubernetes_example_runs_the_task_script_once_per_item():
    job = yaml.safe_load((REPO / "scripts" / "cluster" / "k8s_indexed_job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == len(stages.items(load_params(REPO / "params.yaml")))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert 'task.sh "$JOB_COMPLETION_INDEX"' in container["args"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}


def test_train_and_evaluate_run_where_dvc_is_not_installed():
    """A GPU box with only torch: no module of the package imports dvc anywhere (imports inside
    functions included), and the CLI with every stage module loads where an import of dvc fails.
    (scripts/gpu_session.sh runs the stages that way on the GPU machine for real.)"""
    import ast

    for path in (REPO / "pipeline").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            assert not any(n == "dvc" or n.startswith("dvc.") for n in names), f"{path.name} imports dvc"
    block = ("import sys; sys.modules['dvc'] = None; import pipeline.stages.train, pipeline.stages.evaluate, "
             "pipeline.stages.prepare; from pipeline.cli import main; main()")
    out = sh(REPO, sys.executable, "-c", block, "train", "--help", PYTHONPATH=str(REPO))
    assert "VARIANT" in out


# ---- one node: make gpus ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tracking_server(tmp_path_factory):
    """`mlflow server` on loopback as README's "Scaling out" runs it: on PostgreSQL (Debian's, started
    in a temporary directory by tracking_stack) where it can run, else on sqlite on its own disk."""
    root = tmp_path_factory.mktemp("mlflow")
    with contextlib.ExitStack() as stack:
        try:
            backend, why = stack.enter_context(postgres_cluster()), ""
        except Unavailable as err:
            backend, why = f"sqlite:///{root}/store.db", str(err)
        yield {"uri": stack.enter_context(mlflow_server(backend, root / "artifacts")), "backend": backend, "why": why}


@pytest.fixture(scope="module")
def fanned_out(tmp_path_factory, tracking_server, warm_server):
    """scripts/fanout.sh over three fake GPU slots: three items, each its train and evaluate stages
    (their processes forked warm: conftest.warm_server)."""
    repo = scale_repo(tmp_path_factory.mktemp("node") / "repo")
    t0 = time.perf_counter()
    done = subprocess.run(["bash", "scripts/fanout.sh"], cwd=repo, capture_output=True, text=True,
                          env=env(GPUS=" ".join(FAKE_GPUS), BIN=str(BIN), MLFLOW_TRACKING_URI=tracking_server["uri"],
                                  CAPSNET_WARM=warm_server[0]))
    return {"repo": repo, "done": done, "seconds": time.perf_counter() - t0, "uri": tracking_server["uri"],
            "server": tracking_server}


def test_fanned_out_stages_all_succeed_and_dvc_holds_every_one(fanned_out):
    repo, done = fanned_out["repo"], fanned_out["done"]
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "fanning out 3 items (stacked variants, (variant, seed) pairs) over 3 slot(s)" in done.stdout
    for item in ITEMS:
        assert f"{item}: done in slot" in done.stdout
        log = (repo / "logs" / "fanout" / f"{item}.log").read_text()
        assert all(f"Running stage '{stage}'" in log for stage in STAGES[item])
    assert lock_stages(repo) == every_stage()
    assert "up to date" in sh(repo, "dvc", "status")
    again = sh(repo, "dvc", "repro")
    assert "Running stage" not in again and "up to date" in again


STUB_DVC = """#!/usr/bin/env bash
echo "dvc $*" >>"$CALLS"
case "$*" in
  "stage list --name-only") printf 'prepare\\ntrain_stacked@good\\nevaluate_stacked@good-0\\n' ;;
  *"repro -s train@bad-0"*) echo "Running stage 'train@bad-0':"; echo "ERROR: failed to reproduce 'train@bad-0': boom" >&2; exit 1 ;;
  *) echo "Running stage: $*" ;;
esac
"""
STUB_ITEMS = ["train_stacked@good evaluate_stacked@good-0", "train@bad-0 evaluate@bad-0", "train@ok-1 evaluate@ok-1"]


def stub_fanout(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """scripts/fanout.sh in a folder of its own, with `dvc`, `capsnet` and `nvidia-smi` stubs first on
    its PATH (what it runs, not what they do): its result and the DVC calls it made."""
    (tmp_path / "scripts").mkdir(parents=True)
    (tmp_path / "scripts" / "fanout.sh").write_text((REPO / "scripts" / "fanout.sh").read_text())
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("dvc", STUB_DVC), ("nvidia-smi", "#!/bin/sh\nexit 9\n"),
                       ("capsnet", "#!/bin/sh\nprintf '%s\\n' " + " ".join(f"'{i}'" for i in STUB_ITEMS) + "\n")):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    done = subprocess.run(["bash", "scripts/fanout.sh"], cwd=tmp_path, capture_output=True, text=True,
                          env={**env(BIN=str(stubs), CALLS=str(calls)), **extra})
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_a_failed_item_fails_the_fan_out_saying_which_and_why_and_the_others_still_run(tmp_path):
    """An item whose stages fail: its line names it, its slot and DVC's last line (the stage and why)
    and its log; every other item still trains; the fan-out exits 1 saying a rerun skips what is done,
    without the closing `dvc repro`. No GPU found and none named: one line saying how to name them."""
    done, calls = stub_fanout(tmp_path, GPUS="g0 g1")
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    [failed] = [line for line in done.stderr.splitlines() if "FAILED" in line]
    assert re.fullmatch(r"bad-0: FAILED in slot g[01] after \d+ s: ERROR: failed to reproduce 'train@bad-0': boom; "
                        r"see logs/fanout/bad-0\.log", failed), failed
    assert "some items failed (xargs status 123)" in done.stderr and "done items are skipped" in done.stderr
    assert all(f"{item}: done in slot g" in done.stdout for item in ("good", "ok-1"))
    assert sorted(calls) == sorted(["dvc stage list --name-only", "dvc --wait-for-lock repro prepare",
                                    *(f"dvc --wait-for-lock repro -s {stages}" for stages in STUB_ITEMS)])
    none, calls = stub_fanout(tmp_path / "none", GPUS="")
    assert none.returncode == 2 and calls == []
    assert none.stderr.strip() == 'no GPU found (nvidia-smi lists none): set GPUS to the device indices to use, e.g. GPUS="0 1"'


def test_concurrent_stages_log_to_one_tracking_server_each_with_its_slot(fanned_out):
    from mlflow.tracking import MlflowClient

    from pipeline.core import tracking

    client = MlflowClient(fanned_out["uri"])
    experiment = client.get_experiment_by_name(tracking.experiment_name("smoke"))
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == set(RUNS)  # one run per seed, stacked or not
    head = sh(fanned_out["repo"], "git", "rev-parse", "HEAD").strip()
    slots, cores = {}, len(os.sched_getaffinity(0))
    for name, item in RUNS.items():
        variant, seed = name.rsplit("-seed", 1)
        run = runs[name]
        assert run.info.status == "FINISHED"
        tags = run.data.tags
        assert tags["dvc_stage"] == STAGES[item][0] and tags["host"] == socket.gethostname()
        assert tags["git_commit"] == head
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test_error_pct")] == [1]
        assert "eval_test_error_pct" in run.data.metrics  # the evaluate stage logged to the same run
        assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"train", "test", "affine_test"}
        assert "model.safetensors" in {a.path for a in client.list_artifacts(run.info.run_id)}
        config = json.loads((fanned_out["repo"] / "models" / variant / f"seed{seed}" / "config.json").read_text())
        assert config["environment"]["dvc_stage"] == STAGES[item][0]
        assert config["environment"]["cuda_visible_devices"] == tags["cuda_visible_devices"]
        # each slot's share of the cores (fanout.sh's OMP_NUM_THREADS), not torch's default of all
        assert config["environment"]["cpu_threads"] == tags["cpu_threads"] == str(max(1, cores // len(FAKE_GPUS)))
        assert slots.setdefault(item, tags["cuda_visible_devices"]) == tags["cuda_visible_devices"]
    assert sorted(slots.values()) == FAKE_GPUS  # one item per slot, each slot's GPU its own


def test_the_tracking_server_keeps_the_fanned_out_runs_in_postgresql(fanned_out):
    """README's cluster recipe for real: the server the stages above logged to at once ran on
    PostgreSQL, and the runs are rows of its database (skipped, saying why, where PostgreSQL cannot run)."""
    server = fanned_out["server"]
    if not server["backend"].startswith("postgresql"):
        pytest.skip(server["why"])
    import psycopg

    with psycopg.connect(server["backend"]) as connection:
        rows = connection.execute("SELECT name, status FROM runs").fetchall()
    assert sorted(rows) == sorted((name, "FINISHED") for name in RUNS)


# ---- a cluster: the SLURM array script, its tasks as local processes, then the gather step -------


def origin_with_remote(root: Path) -> Path:
    """The repository every task clones: its data in a DVC remote (a folder), no shared cache."""
    origin = scale_repo(root / "origin")
    sh(origin, "dvc", "remote", "add", "-d", "store", str(root / "remote"))
    sh(origin, "dvc", "push", "-q")
    sh(origin, "dvc", "config", "--unset", "cache.dir")  # each clone its own cache: only the remote is shared
    sh(origin, "git", "commit", "-qam", "remote")
    (root / "scratch").mkdir()
    return origin


def task_env(root: Path, origin: Path) -> dict:
    return {"CAPSNET_REPO": str(origin), "CAPSNET_VENV": str(BIN.parent), "CAPSNET_SCRATCH": str(root / "scratch"),
            "CAPSNET_TRACKING_JOURNAL": str(root / "journal")}


def gather(root: Path, origin: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    login = root / "login"
    sh(root, "git", "clone", "-q", str(origin), str(login))
    return login, subprocess.run(["bash", "scripts/cluster/gather.sh", *args], cwd=login, capture_output=True,
                                 text=True, env=env(BIN=str(BIN)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The SLURM script's array tasks run at once as local processes with SLURM's variables (one index
    too many), journalling their runs; then gather.sh in a new clone. (Cold stages: each task runs its
    own clone's pipeline/, which a warm interpreter of this checkout refuses.)"""
    root = tmp_path_factory.mktemp("cluster")
    origin = origin_with_remote(root)
    rev = sh(origin, "git", "rev-parse", "--short", "HEAD").strip()  # what the array runs (README: CAPSNET_REV)
    (origin / "LATER").write_text("committed after the array was submitted\n")
    sh(origin, "git", "add", "LATER")
    sh(origin, "git", "commit", "-qm", "later")  # the branch moves on; the tasks must still run rev
    common = {**task_env(root, origin), "SLURM_SUBMIT_DIR": str(origin), "SLURM_ARRAY_JOB_ID": "77", "CAPSNET_REV": rev}
    tasks = [subprocess.Popen(["bash", str(origin / "scripts/cluster/slurm_array.sbatch")], cwd=root, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=env(**common, SLURM_ARRAY_TASK_ID=str(i), CUDA_VISIBLE_DEVICES=str(i),
                                      OMP_NUM_THREADS="1"))  # a core each, as --cpus-per-task=1 would give
             for i in range(len(ITEMS) + 1)]  # one index too many: its task must refuse
    outputs = [(task.wait(600), task.stdout.read()) for task in tasks]
    login, gathered = gather(root, origin, "--commit")
    return {"root": root, "outputs": outputs, "login": login, "gather": gathered, "rev": rev}


def test_each_array_task_runs_the_item_of_its_index(cluster):
    """Task i runs item i's stages and no other (not even the prepared data's, which it pulls), at
    CAPSNET_REV though the branch has moved on since, with its own clone's code, on its own GPU."""
    for index, (status, output) in enumerate(cluster["outputs"][:len(ITEMS)]):
        assert status == 0, output
        clone = cluster["root"] / "scratch" / f"capsnet-77-{index}"
        assert (f"task {index}: {ITEMS[index]} on " in output and f"CUDA_VISIBLE_DEVICES={index}, "
                f"commit {cluster['rev']}, code {clone / 'pipeline'}\n" in output), output
        assert set(re.findall(r"[Ss]tage '([^']+)'", output)) == set(STAGES[ITEMS[index]]), output
        assert f"task {index}: {ITEMS[index]} done" in output
    status, output = cluster["outputs"][len(ITEMS)]
    assert status != 0 and "submit the array as 0-2" in output
    assert not list((cluster["root"] / "scratch").iterdir())  # every task removed its clone, the refused one too


def test_gather_restores_every_stage_from_the_run_cache(cluster):
    gather = cluster["gather"]
    assert gather.returncode == 0, f"{gather.stdout}\n{gather.stderr}"
    out = gather.stdout + gather.stderr
    for stage in every_stage():
        assert f"Stage '{stage}' is cached - skipping run, checking out outputs" in out
    assert "Running stage" not in out
    assert lock_stages(cluster["login"]) == every_stage()
    assert "up to date" in sh(cluster["login"], "dvc", "status")
    assert not (cluster["login"] / "mlflow.db").exists()  # nothing trained or logged at the gather
    # --commit: dvc.lock and the metrics committed, nothing of them left out
    assert sh(cluster["login"], "git", "log", "-1", "--format=%s").strip() == (
        f"Cluster run: dvc.lock and metrics of {len(ITEMS)} fanned-out items")
    assert sh(cluster["login"], "git", "status", "--porcelain") == ""
    assert set(yaml.safe_load(sh(cluster["login"], "git", "show", "HEAD:dvc.lock"))["stages"]) == every_stage()


def test_deferred_runs_synced_later_equal_the_directly_logged_ones(cluster, fanned_out, tmp_path):
    """The same items: journalled on the array tasks and synced at the gather checkout (which holds the
    restored outputs) against logged live to the tracking server by the fan-out."""
    from mlflow.tracking import MlflowClient

    from pipeline.core import tracking

    store = f"sqlite:///{tmp_path}/synced.db"
    out = sh(cluster["login"], "capsnet", "track", "sync", str(cluster["root"] / "journal"), MLFLOW_TRACKING_URI=store)
    assert f"{len(RUNS)} run(s) added" in out
    synced, live = MlflowClient(store), MlflowClient(fanned_out["uri"])

    def by_name(client):
        experiment = client.get_experiment_by_name(tracking.experiment_name("smoke"))
        return {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}

    def artifacts(client, run_id, path=None):
        found = []
        for a in client.list_artifacts(run_id, path):
            found += artifacts(client, run_id, a.path) if a.is_dir else [a.path]
        return sorted(found)

    synced_runs, live_runs = by_name(synced), by_name(live)
    assert set(synced_runs) == set(live_runs)
    for name, run in synced_runs.items():
        other = live_runs[name]
        assert run.info.status == other.info.status == "FINISHED"
        assert run.data.params == other.data.params
        assert set(run.data.metrics) == set(other.data.metrics)
        for key in run.data.metrics:
            mine = [(m.step, m.value) for m in synced.get_metric_history(run.info.run_id, key)]
            theirs = [(m.step, m.value) for m in live.get_metric_history(other.info.run_id, key)]
            assert [s for s, _ in mine] == [s for s, _ in theirs], key
            if key.endswith("error_pct"):
                assert [v for _, v in mine] == [v for _, v in theirs], key  # same seed, data and code
        assert artifacts(synced, run.info.run_id) == artifacts(live, other.info.run_id)
        assert run.data.tags["dvc_stage"] == other.data.tags["dvc_stage"]
        assert run.data.tags["cuda_visible_devices"] in FAKE_GPUS


def slurm_answers() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not slurm_answers(), reason="no SLURM cluster answers here (scripts/cluster/one_node_slurm.sh "
                                                 "makes one on loopback)")
def test_the_array_script_on_a_real_slurm_cluster(tmp_path):
    """README's sbatch command, submitted for real (one node on loopback: scripts/cluster/one_node_slurm.sh);
    SLURM chooses the index and the GPU of each task; the gather step restores every stage."""
    origin = origin_with_remote(tmp_path)
    (origin / "logs" / "slurm").mkdir(parents=True)
    out = sh(origin, "sbatch", "--wait", f"--array=0-{len(ITEMS) - 1}", "--cpus-per-task=1", "--mem=2G",
             "scripts/cluster/slurm_array.sbatch", **task_env(tmp_path, origin))
    job = out.split()[-1]
    logs = {int(p.stem.rsplit("_", 1)[1]): p.read_text() for p in (origin / "logs" / "slurm").glob(f"{job}_*.out")}
    assert sorted(logs) == list(range(len(ITEMS)))
    for index, log in logs.items():
        assert f"task {index}: {ITEMS[index]} done" in log, log
        assert "CUDA_VISIBLE_DEVICES=unset" not in log  # SLURM gave each task a GPU slot
    login, gathered = gather(tmp_path, origin)
    assert gathered.returncode == 0, gathered.stdout + gathered.stderr
    assert "Running stage" not in gathered.stdout + gathered.stderr
    assert lock_stages(login) == every_stage()
