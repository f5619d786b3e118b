"""The warm interpreter (pipeline/warm.py): a stage forked from it is the process a cold `capsnet`
would be (arguments, working directory, environment, streams, exit status), signals reach it, a
killed `capsnet` takes it down, and whatever it cannot run as a cold process would, starts cold."""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, REPO, tiny_pipeline, write_mnist
from warm_stage import proc_stat

from pipeline import warm
from pipeline.core.files import file_lock

CAPSNET = str(BIN / "capsnet")


@pytest.fixture
def server(warm_server):
    return warm_server


def capsnet(cwd, *args, address=None, **env):
    """`capsnet ARGS` in ``cwd``, warm when ``address`` is given; (status, stdout, stderr)."""
    environ = {k: v for k, v in os.environ.items() if k != warm.WARM_ENV}
    environ.update(env, **({warm.WARM_ENV: address} if address else {}))
    done = subprocess.run([CAPSNET, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def forked(log, *args) -> int:
    """The pid the server forked for the command ``args`` (waits for its log line)."""
    line = f": {' '.join(args)}"
    for _ in range(300):
        for entry in log.read_text().splitlines():
            if entry.endswith(line):
                return int(entry.split()[2].rstrip(":"))
        time.sleep(0.1)
    raise AssertionError(f"no stage {line!r} in the warm log:\n{log.read_text()}")


def cmdline(proc: Path) -> bytes:
    """/proc/<pid>/cmdline, or nothing where the process ended meanwhile."""
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def held_stage(root, address, log, seed="0", **popen):
    """`capsnet train` of one seed of ``root``'s tiny pipeline, forked warm by the server at ``address``
    and held at the MLflow store's lock, which the caller holds: (its `capsnet` client, the stage's pid)."""
    env = {**os.environ, warm.WARM_ENV: address, "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db",
           "DVC_ROOT": str(root)}
    # absolute paths: the command, as the server's log shows it, is this test's alone
    args = ("train", "capsnet_r1", seed, "prepared", f"{root}/models{seed}", "--checkpoint", f"{root}/ckpt/{seed}.pt")
    client = subprocess.Popen([CAPSNET, *args], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, **popen)
    stage, lock = forked(log, *args), str(root / "mlflow.db.lock")
    for _ in range(600):  # its pid is logged at the fork, before it takes its streams: wait for it at the lock
        with contextlib.suppress(FileNotFoundError):  # a descriptor closed between the listing and its read
            if lock in {os.readlink(f"/proc/{stage}/fd/{fd}") for fd in os.listdir(f"/proc/{stage}/fd")}:
                return client, stage
        time.sleep(0.1)
    raise AssertionError(f"the stage {stage} never reached the store's lock")


def test_a_warm_stage_is_the_cold_one(server, tmp_path):
    """Same stdout, stderr and exit status as a cold `capsnet`, for a command that succeeds and for
    one that fails; relative paths resolve in the caller's directory and the caller's environment
    reaches the stage (the mirror it names, the params file it reads)."""
    address, log = server
    write_mnist(tmp_path / "mirror", n_train=8, n_test=4)  # not MNIST: its SHA-256 check fails
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    commands = [("stages", "--kind", "stages"), ("download", "raw")]
    for args in commands:
        cold = capsnet(tmp_path, *args, CAPSNET_MNIST_MIRROR=str(tmp_path / "mirror"))
        hot = capsnet(tmp_path, *args, address=address, CAPSNET_MNIST_MIRROR=str(tmp_path / "mirror"))
        assert hot == cold
        forked(log, *args)  # it did run warm
    assert cold[0] == 1 and str(tmp_path / "mirror") in cold[2]  # the download refused the fake files
    assert capsnet(tmp_path, "stages", "--kind", "stages", address=address)[1].startswith("train_stacked@")


def test_signals_reach_the_stage_and_a_killed_capsnet_takes_it_down(server, tmp_path):
    """SIGTERM to `capsnet` reaches the stage (the trainer's Terminated path: status 143, from the
    client, not a client killed by the signal); SIGINT (a Ctrl-C) reaches it as KeyboardInterrupt (click's
    "Aborted!", status 1); SIGKILL of `capsnet` (nothing to forward) ends the stage too. Each stage is
    held at the MLflow store's lock, which the test holds."""
    address, log = server
    tiny_pipeline(tmp_path)
    with file_lock(tmp_path / "mlflow.db.lock", wait=False):
        for sig, seed in ((signal.SIGTERM, "0"), (signal.SIGKILL, "1"), (signal.SIGINT, "2")):
            client, pid = held_stage(tmp_path, address, log, seed)
            time.sleep(1)  # the client has its forwarding handlers once it has read the pid
            assert os.path.exists(f"/proc/{pid}")  # held at the lock
            client.send_signal(sig)
            _, err = client.communicate(timeout=60)
            expected = {signal.SIGTERM: 143, signal.SIGKILL: -signal.SIGKILL, signal.SIGINT: 1}[sig]
            assert client.returncode == expected, err
            assert sig != signal.SIGINT or err.endswith("Aborted!\n")  # a Ctrl-C: click's KeyboardInterrupt path
            for _ in range(100):
                if not os.path.exists(f"/proc/{pid}"):  # ended and reaped by the server
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"the stage {pid} outlived its capsnet ({sig.name})")


def test_what_a_cold_process_would_run_differently_starts_cold(server, tmp_path):
    """An import-time setting that differs from the server's: the stage starts cold, saying so, and
    still runs. A changed pipeline/**/*.py or another checkout's package is refused by name."""
    address, log = server
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    status, out, err = capsnet(tmp_path, "stages", "--count", address=address, MKL_NUM_THREADS="7")
    assert status == 0 and out.strip().isdigit()
    assert "capsnet: starting cold (MKL_NUM_THREADS differ" in err
    code, env = warm.fingerprint(), dict(os.environ)
    request = {"package": str(warm.PACKAGE), "env": env}
    assert warm.refusal(request, code, env) is None
    assert "pipeline/training/train.py changed" in warm.refusal(request, {**code, "training/train.py": "0" * 64}, env)
    assert "pipeline/experiments/new.py changed" in warm.refusal(request, {**code, "experiments/new.py": "0" * 64}, env)
    assert "runs" in warm.refusal({**request, "package": "/elsewhere/pipeline"}, code, env)


def test_a_warm_stage_runs_on_the_thread_count_it_was_given(server, tmp_path):
    """OMP_NUM_THREADS, which torch reads once at import (the server's), is the stage's own: the
    fan-out gives each slot its share of the cores that way. `capsnet bench` names torch's count."""
    import json

    import torch

    address, log = server
    threads = str(torch.get_num_threads() + 1)  # not the server's count
    args = ("bench", "--variant", "capsnet_r1", "--batch", "2", "--steps", "1", "--warmup", "0", "--no-reference",
            "--device", "cpu", "--params", str(REPO / "params.yaml"))
    status, out, err = capsnet(tmp_path, *args, address=address, OMP_NUM_THREADS=threads)
    assert status == 0, err
    forked(log, *args)  # it did run warm
    assert json.loads(out.splitlines()[-1])["device"] == f"cpu ({threads} threads)"
    assert "OMP_NUM_THREADS differ" in warm.refusal(  # unset for the stage, set for the server: cold
        {"package": str(warm.PACKAGE), "env": {}}, warm.fingerprint(), {"OMP_NUM_THREADS": "1"})


def test_without_a_server_capsnet_starts_cold_silently(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    status, out, err = capsnet(tmp_path, "stages", "--count", address=str(tmp_path / "no-socket"))
    assert (status, err) == (0, "") and out.strip().isdigit()


def test_a_stage_whose_warm_interpreter_dies_fails_saying_so(tmp_path):
    """The server gone before its stage ended (killed, say): `capsnet` fails (status 1, so DVC never
    records the stage as done) and says why. The stage is held at the MLflow store's lock, which the
    test holds; this test runs its own server, as it kills it."""
    tiny_pipeline(tmp_path)
    with warm.running(tmp_path / "warm.log") as address, file_lock(tmp_path / "mlflow.db.lock", wait=False):
        client, stage = held_stage(tmp_path, address, tmp_path / "warm.log")
        server = int(proc_stat(stage)[1])  # the stage's parent
        os.kill(server, signal.SIGKILL)
        client.wait(timeout=60)
        os.kill(stage, signal.SIGKILL)  # the orphan, which nobody is left to end, holds the client's streams
        _, err = client.communicate(timeout=60)
    assert client.returncode == 1 and "the warm interpreter stopped before the stage ended" in err


def test_the_server_hashes_every_file_of_the_package_and_refuses_one_added_since_it_started():
    """`fingerprint` covers pipeline/**/*.py, nested packages included, by content; a file that is there
    now but was not when the server started is a change too (the server never imported it)."""
    import hashlib

    code, env = warm.fingerprint(), dict(os.environ)
    train = warm.PACKAGE / "training" / "train.py"
    assert code["training/train.py"] == hashlib.sha256(train.read_bytes()).hexdigest()
    assert {"cli.py", "experiments/table1.py", "report/runs.py"} <= set(code)
    request = {"package": str(warm.PACKAGE), "env": env}
    started_without = {name: digest for name, digest in code.items() if name != "experiments/table1.py"}
    assert "pipeline/experiments/table1.py changed" in warm.refusal(request, started_without, env)


def test_a_server_that_does_not_start_leaves_every_stage_cold_and_says_so(tmp_path, monkeypatch, capsys):
    """...as soon as its process has ended, not at the 120 s a server that still imports is given."""
    monkeypatch.setattr(warm.sys, "executable", "/bin/false")  # an interpreter that exits at once
    began = time.monotonic()
    with warm.running(tmp_path / "warm.log") as address:
        assert address is None
        assert time.monotonic() - began < 60, "waited for the socket of a server that had ended"
    err = capsys.readouterr().err
    assert err == f"warm: the server did not start (see {tmp_path / 'warm.log'}); every stage starts cold\n"


@pytest.mark.parametrize("name", ["OMP_SCHEDULE", "MKL_NUM_THREADS", "KMP_AFFINITY", "OPENBLAS_NUM_THREADS",
                                  "GOMP_SPINCOUNT", "PYTHONHASHSEED", "TORCH_SHOW_CPP_STACKTRACES", "MPLBACKEND",
                                  "LD_PRELOAD", "CUBLAS_WORKSPACE_CONFIG"])
def test_every_kind_of_import_time_setting_that_differs_is_refused(name):
    """Each family of settings a library reads once, when it loads (OpenMP's, BLAS', Python's, torch's,
    matplotlib's, the loader's, cuBLAS'): set for the stage and not for the server, it starts cold."""
    request = {"package": str(warm.PACKAGE), "env": {name: "1"}}
    assert warm.refusal(request, warm.fingerprint(), {}) == f"{name} differ from the warm interpreter's"
    assert warm.refusal({**request, "env": {"CAPSNET_SOMETHING": "1"}}, warm.fingerprint(), {}) is None


def test_a_stage_started_with_its_standard_input_closed_reads_dev_null_there(server, tmp_path):
    """DVC may start a stage with a stream closed: the stage gets /dev/null in its place (as the server
    needs three descriptors to send), not the socket `capsnet` opened in the free descriptor. The stage is
    held at the MLflow store's lock, which the test holds, while its descriptors are read."""
    address, log = server
    tiny_pipeline(tmp_path)
    with file_lock(tmp_path / "mlflow.db.lock", wait=False):
        client, stage = held_stage(tmp_path, address, log, preexec_fn=lambda: os.close(0))
        stdin, stdout = (os.readlink(f"/proc/{stage}/fd/{fd}") for fd in (0, 1))
        client.send_signal(signal.SIGTERM)
        client.communicate(timeout=60)
    assert stdin == os.devnull and stdout.startswith("pipe:")


def test_a_stopped_server_ends_the_stages_still_running(tmp_path):
    """The server stopped (the end of `make smoke`'s block, or a Ctrl-C there) terminates its stages: none
    outlives it, held as it is at the MLflow store's lock, which the test holds."""
    tiny_pipeline(tmp_path)
    with file_lock(tmp_path / "mlflow.db.lock", wait=False):
        with warm.running(tmp_path / "warm.log") as address:
            client, stage = held_stage(tmp_path, address, tmp_path / "warm.log")
        client.communicate(timeout=60)
        for _ in range(100):
            if not os.path.exists(f"/proc/{stage}") or proc_stat(stage)[0] == "Z":  # gone, or ended unreaped
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the stage {stage} outlived its server")
    assert client.returncode != 0


def test_a_stage_forked_warm_builds_its_model_and_optimizer_from_modules_the_server_imported():
    """What the server preloads covers what a train stage imports before it computes: building a run's model
    and Adam (whose constructor imports torch._dynamo, about 2 s) imports nothing beyond the package's own
    modules, so no forked stage pays a library's import."""
    probe = """
import sys
from pipeline import warm
for name in warm.PRELOAD:
    __import__(name)
before = set(sys.modules)
import torch
from pipeline.core.params import load_params
from pipeline.training.config import run_config
from pipeline.training.train import build_model, make_optimizer
cfg = run_config(load_params(sys.argv[1]), "capsnet_r3_recon", 0)
make_optimizer(build_model(cfg), cfg, torch.device("cpu"))
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] != "pipeline"))
"""
    done = subprocess.run([str(BIN / "python"), "-c", probe, str(REPO / "params.yaml")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"], done.stdout


# a server's fork of `capsnet --help`, a stop (SIGTERM) reaching the stage before its own first line runs
EARLY_STOP = """
import json, os, signal, socket, sys
from pipeline import warm
stopping = []
warm._server_signals(stopping)
os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
conn, client = socket.socketpair()
socket.send_fds(client, [b"F"], [0, 1, 2])
request = {"argv": ["capsnet", "--help"], "cwd": os.getcwd(), "env": dict(os.environ), "package": str(warm.PACKAGE)}
client.sendall(json.dumps(request).encode() + b"\\n")
pid = warm._accept(conn, warm.fingerprint(), dict(os.environ), {}, keep=(client,))
print(json.dumps({"exit": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), "server_stopping": stopping}))
"""


def test_a_stop_sent_the_moment_a_stage_is_forked_ends_it(tmp_path):
    """A stage inherits the server's handlers, which only note a stop, until it sets its own: the server
    holds the stop signals across the fork and the stage takes them once its handlers are set, so a
    SIGTERM in between (the server stopping just as it forked the stage: CI's run of 2026-12-02 had the stage
    outlive its server so, held at the store's lock) ends it rather than being noted and forgotten."""
    done = subprocess.run([str(BIN / "python"), "-c", EARLY_STOP], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"exit": -signal.SIGTERM, "server_stopping": []}


def test_an_omp_thread_count_torch_would_not_take_is_a_setting_that_differs():
    """OMP_NUM_THREADS is the stage's own only as a positive count; anything else (a word, 0) is an
    import-time setting like the others: refused by name, not a crash of the server reading it."""
    assert [warm.thread_count(value) for value in ("3", "four", "0", None)] == [3, None, None, None]
    request = {"package": str(warm.PACKAGE), "env": {"OMP_NUM_THREADS": "four"}}
    refused = warm.refusal(request, warm.fingerprint(), {"OMP_NUM_THREADS": "1"})
    assert refused == "OMP_NUM_THREADS differ from the warm interpreter's"


def test_the_server_imports_the_installed_package_in_a_session_of_its_own_and_leaves_no_folder(tmp_path, monkeypatch):
    """`make smoke` starts the server from the repository; a `pipeline/` in the working directory that is not
    the installed package is not what it imports (-P). It runs in its own session, so a Ctrl-C at the terminal
    reaches the stages through `capsnet` only, and its socket's folder goes with it."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "__init__.py").write_text('raise SystemExit("the working directory\'s package")\n')
    monkeypatch.chdir(tmp_path)
    with warm.running(tmp_path / "warm.log") as address:
        assert address is not None, (tmp_path / "warm.log").read_text()
        (server,) = [int(p.name) for p in Path("/proc").glob("[0-9]*") if address.encode() in cmdline(p)]
        assert proc_stat(server)[3] != str(os.getsid(0))  # its session: a terminal's Ctrl-C does not reach it
    assert not os.path.exists(os.path.dirname(address))


def test_a_hangup_reaches_the_stage_as_itself(server, tmp_path):
    """SIGHUP (the terminal closed) sent to `capsnet` reaches its stage, which ends by it as a cold stage
    would: status 129, from the client (not the SIGTERM the server sends the stage of a client that died of it).
    The stage is held at the MLflow store's lock, which the test holds."""
    address, log = server
    tiny_pipeline(tmp_path)
    with file_lock(tmp_path / "mlflow.db.lock", wait=False):
        client, _ = held_stage(tmp_path, address, log)
        time.sleep(1)  # the client has its forwarding handlers once it has read the pid
        client.send_signal(signal.SIGHUP)
        client.communicate(timeout=60)
    assert client.returncode == 128 + signal.SIGHUP


def test_a_server_started_by_hand_removes_its_socket_when_stopped(tmp_path):
    """`python -m pipeline.warm serve SOCKET` outside `warm.running` (which removes its folder): SIGTERM
    stops it, and no stale socket is left for the next server to trip on."""
    address = tmp_path / "socket"
    server = subprocess.Popen([str(BIN / "python"), "-P", "-m", "pipeline.warm", "serve", str(address)], cwd=tmp_path)
    try:
        for _ in range(1200):
            if address.exists() or server.poll() is not None:
                break
            time.sleep(0.1)
        assert address.exists()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert not address.exists()


def forked_stage(tmp_path, *argv, tty=False, env=None, imported=None) -> dict:
    """A stage forked by the server's own `_accept` and reaped by its `_reap` (tests/warm_stage.py, in a
    process of its own), the command its stand-in `capsnet`: what the client was told and the stage wrote."""
    request = tmp_path / "request.json"  # this call's alone: one left by an earlier call is removed
    request.unlink(missing_ok=True)
    if env or imported:
        request.write_text(json.dumps({"env": env or {}, "imported": imported or {}}))
    return warm_stage(tmp_path, "accept", *argv, *(["--tty"] if tty else []))


def warm_stage(out, *args) -> dict:
    """tests/warm_stage.py ARGS, its stdout to a file block-buffered (this machine's PYTHONUNBUFFERED dropped):
    the result.json it writes in ``out``."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([str(BIN / "python"), str(REPO / "tests" / "warm_stage.py"), args[0], str(out), *args[1:]],
                          capture_output=True, text=True, timeout=120, env=environ)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "result.json").read_text())


@pytest.mark.parametrize("how,status,stderr", [
    ("bare", 0, ""), ("none", 0, ""),  # sys.exit() and sys.exit(None): success, as for a cold process
    ("message", 1, "the stage stopped: its message\n"),  # sys.exit("…"): the message on stderr, status 1
    ("raise", 1, "RuntimeError: nobody catches this\n"),  # the traceback's last line
])
def test_a_warm_stage_ends_as_a_cold_process_would(tmp_path, how, status, stderr):
    """Each way a command can end gives the client the status and stderr a cold `capsnet` would: SystemExit's
    code (None and no code are 0, a message is printed and is 1), an uncaught exception's traceback and 1."""
    result = forked_stage(tmp_path, "ends", how)
    assert result["exit"] == status and result["stderr"].endswith(stderr), result
    assert how != "raise" or result["stderr"].startswith("Traceback (most recent call last):"), result


def test_a_warm_stage_flushes_its_output_runs_its_exit_functions_and_is_named_capsnet(tmp_path):
    """What a process that ends normally does, a forked stage does before it leaves by os._exit: its buffered
    stdout written (a file, not a terminal: block-buffered), its atexit functions run (MLflow's and logging's
    in a real stage). Its usage errors name `capsnet`, the command's name, not the server's; stdout is
    line-buffered where it is a terminal, as Python sets it up for a cold process, and not where it is a file."""
    result = forked_stage(tmp_path, "sees", str(tmp_path))
    assert result["exit"] == 0 and result["stdout"] == "a last line, unflushed\n", result
    assert (tmp_path / "atexit").read_text() == "ran"
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen["cwd"] == str(tmp_path) and seen["line_buffering"] is False
    forked_stage(tmp_path, "sees", str(tmp_path), tty=True)
    assert json.loads((tmp_path / "seen.json").read_text())["line_buffering"] is True
    usage = forked_stage(tmp_path, "no-such-command")
    assert usage["exit"] == 2 and usage["stderr"].startswith("Usage: capsnet [OPTIONS] COMMAND"), usage


def test_a_warm_stage_gets_what_the_servers_imports_set_unless_its_own_environment_sets_it(tmp_path):
    """A cold stage's imports set variables (torch's TORCHINDUCTOR_CACHE_DIR, MLflow's session id): a warm one
    gets the server's, and its own where its environment has one."""
    result = forked_stage(tmp_path, "sees", str(tmp_path), env={"CAPSNET_SET_BY_BOTH": "the stage's"},
                          imported={"CAPSNET_SET_BY_IMPORTS": "the server's", "CAPSNET_SET_BY_BOTH": "the server's"})
    assert result["exit"] == 0, result
    env = json.loads((tmp_path / "seen.json").read_text())["env"]
    assert env["CAPSNET_SET_BY_IMPORTS"] == "the server's" and env["CAPSNET_SET_BY_BOTH"] == "the stage's"


def test_stages_that_end_at_once_are_each_answered(tmp_path):
    """Signals do not queue: one SIGCHLD can stand for two stages that ended together, so one reaping answers
    every ended stage's client, or one of them would wait for ever."""
    assert warm_stage(tmp_path, "reap") == {"exits": {"3": 3, "4": 4}, "left": 0}
