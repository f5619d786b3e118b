"""The cluster tracking stack of README's "Scaling out", started for a test: PostgreSQL from
Debian's packages and `mlflow server` on it, both on loopback ports, everything in a temporary
directory that is removed at the end (tests/test_scale.py's fan-out logs to it).

PostgreSQL refuses to run as root: under root the cluster runs as the `postgres` user (or
`nobody`). Where the server binaries or the psycopg driver are missing, `postgres_cluster` raises
`Unavailable` saying which (.ci/run installs Debian's postgresql; psycopg is in the lockfile's dev
group).
"""

import contextlib
import glob
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

from conftest import tool_env

from pipeline.core.tracking import SERVER_ENV


class Unavailable(Exception):
    """PostgreSQL cannot run here; the message says why and what installs it."""


def postgres_bin() -> Path | None:
    """The directory of PostgreSQL's initdb/pg_ctl: on PATH, or Debian's /usr/lib/postgresql/<v>/bin."""
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)),
                                            None)
    return Path(found).resolve().parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextlib.contextmanager
def postgres_cluster():
    """A fresh PostgreSQL cluster on a loopback port with an empty database `mlflow`; yields its
    SQLAlchemy URI; stops the server and removes the cluster at the end."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise Unavailable("PostgreSQL's server is not installed (Debian: apt-get install postgresql; .ci/run does)")
    try:
        import psycopg
    except ImportError as err:
        raise Unavailable("the psycopg driver is missing: `make venv` installs the dev group") from err
    prefix = []
    if os.geteuid() == 0:
        user = next((u for u in ("postgres", "nobody") if _has_user(u)), None)
        if user is None:
            raise Unavailable("running as root with no unprivileged user (postgres, nobody) to run PostgreSQL as")
        prefix = ["runuser", "-u", user, "--"]
    folder = Path(tempfile.mkdtemp(prefix="capsnet-pg-"))
    if prefix:
        shutil.chown(folder, prefix[2])
    data, port = folder / "data", free_port()

    def run(*command: str) -> None:
        subprocess.run([*prefix, *command], capture_output=True, text=True, check=True)

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


@contextlib.contextmanager
def mlflow_server(backend: str, artifacts: Path):
    """`mlflow server` on ``backend`` serving artifacts from ``artifacts``; yields its URL once it answers."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", backend, "--artifacts-destination",
         str(artifacts), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env=tool_env(**SERVER_ENV),  # as `capsnet ui` starts one: without MLflow's job runner
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
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
