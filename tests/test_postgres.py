"""The cluster tracking stack for real: PostgreSQL (Debian's packages) under `mlflow server`, with
four trainers logging to it at once, as fanned-out stages do (README, "Scaling out").

Everything lives in a temporary directory on loopback ports: the database cluster (initdb, run as
an unprivileged user when the tests run as root, which PostgreSQL refuses), the server's artifact
store, the trainers' outputs; the server and the database are stopped and removed at the end.
Skipped, saying why, where PostgreSQL's server binaries or the psycopg driver are missing
(.ci/run installs both: Debian's postgresql, and psycopg from the lockfile's dev group).
"""

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import tiny_pipeline, tool_env

RUNS = [("capsnet_r1", 0), ("capsnet_r1", 1), ("capsnet_r1_official", 0), ("capsnet_r1_official", 1)]


def postgres_bin() -> Path | None:
    """The directory of PostgreSQL's initdb/pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)),
                                            None)
    return Path(found).resolve().parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def postgres_cluster():
    """A fresh PostgreSQL cluster on a loopback port with an empty database `mlflow`; yields its
    SQLAlchemy URI. As root, the cluster runs as the `postgres` user (or `nobody`)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL's server is not installed (Debian: apt-get install postgresql; .ci/run does)")
    psycopg = pytest.importorskip("psycopg", reason="the psycopg driver is missing: `make venv` installs the dev group")

    folder = Path(tempfile.mkdtemp(prefix="capsnet-pg-"))
    prefix = []
    if os.geteuid() == 0:
        user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
        if user is None:
            pytest.skip("running as root with no unprivileged user (postgres, nobody) to run PostgreSQL as")
        shutil.chown(folder, user)
        prefix = ["runuser", "-u", user, "--"]
    data, port = folder / "data", free_port()
    run = lambda *cmd: subprocess.run([*prefix, *cmd], capture_output=True, text=True, check=True)  # noqa: E731
    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "capsnet", "--auth=trust", "--no-sync")
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-t", "60", "start",
            "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off")
        with psycopg.connect(host="127.0.0.1", port=port, user="capsnet", dbname="postgres", autocommit=True) as c:
            c.execute("CREATE DATABASE mlflow")
        yield f"postgresql://capsnet@127.0.0.1:{port}/mlflow"
    except subprocess.CalledProcessError as err:
        log = (folder / "server.log").read_text() if (folder / "server.log").is_file() else ""
        raise AssertionError(f"{err.cmd} failed:\n{err.stdout}\n{err.stderr}\n{log}") from err
    finally:
        if (data / "postmaster.pid").is_file():
            subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                           capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextlib.contextmanager
def mlflow_server(backend: str, artifacts: Path):
    """`mlflow server` on ``backend``, serving artifacts from ``artifacts``; yields its URL once it answers."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend, "--artifacts-destination",
         artifacts.as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None and time.time() < deadline, server.stdout.read()
                time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=60)


def test_four_trainers_log_to_mlflow_server_on_postgresql_at_once(tmp_path):
    root = tiny_pipeline(tmp_path)
    with postgres_cluster() as database, mlflow_server(database, tmp_path / "artifacts") as url:
        env = tool_env(MLFLOW_TRACKING_URI=url, DVC_ROOT=str(root), PYTHONPATH=str(Path(__file__).parents[1]))
        trainers = [subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "train", variant, str(seed), str(root / "prepared"),
             str(root / "models" / variant / f"seed{seed}"), "--checkpoint", str(root / "ckpt" / f"{variant}-{seed}.pt"),
             "--params", str(root / "params.yaml")], cwd=root, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) for variant, seed in RUNS]
        for trainer in trainers:
            output = trainer.communicate(timeout=600)[0]
            assert trainer.returncode == 0, output

        from mlflow.tracking import MlflowClient

        from pipeline import tracking

        client = MlflowClient(url)
        runs = client.search_runs([client.get_experiment_by_name(tracking.EXPERIMENT).experiment_id])
        assert sorted(r.info.run_name for r in runs) == sorted(f"{v}-seed{s}" for v, s in RUNS)
        for run in runs:
            config = json.loads((root / "models" / run.data.params["variant"] / f"seed{run.data.params['seed']}"
                                 / "config.json").read_text())
            assert run.info.status == "FINISHED" and config["run_id"] == run.info.run_id
            assert run.data.params["recipe"] == ("official" if "official" in run.info.run_name else "paper")
            assert {"train_loss", "test_error_pct", "lr", "epochs_trained"} <= set(run.data.metrics)
            assert {i.dataset.name for i in run.inputs.dataset_inputs} == {"train", "test"}
            assert "model.safetensors" in {a.path for a in client.list_artifacts(run.info.run_id)}
