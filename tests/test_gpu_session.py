"""scripts/gpu_session.sh and gpu_plan.sh as the device tool runs them, with python3 stubbed: benching once
per GPU model and within its budget, torch's bytecode, the checks a call brings back, jobs evaluated or
trained again, the CUDA tests beside the first jobs, and what the plan queues again."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, script
from gpu_device import (CAPS, STUB_FINGERPRINT, STUB_GPU, device_tree, plan_until_the_queue, publish_seed0,
                        python3_on_path, rows, session_log)

gpu_levers, gpu_queue = script("gpu_levers"), script("gpu_queue")


def test_a_window_does_not_bench_again_what_an_earlier_window_on_its_gpu_model_benched(tmp_path):
    """gpu_session.sh: an entry whose rows reports/bench/<this device>/ holds counts as benched (the levers
    read them, no bench runs, nothing goes to bench.jsonl), and an entry with no rows waits for the next
    window once benching has had its --bench-budget."""
    from pipeline.training.bench import device_name, device_slug, resolve_device

    work = device_tree(tmp_path)
    kept = work / "reports" / "bench" / device_slug(device_name(resolve_device("auto")))
    kept.mkdir(parents=True)
    (kept / "capsnet_r3_recon@bf16#1.jsonl").write_text(json.dumps(rows()[2]) + "\n")
    (kept / "jobs").mkdir()
    (kept / "jobs" / "seconds.jsonl").write_text('{"variant": "capsnet_r1", "seconds": 70}\n')  # an earlier window's
    env = python3_on_path(tmp_path, f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',  # this venv's
                          CAPSNET_GPU_PROFILE="smoke",  # a bench that runs: brief
                          CAPSNET_GPU_BENCH_ARGS="--batch 2 --steps 1 --warmup 0 --no-reference --device cpu")
    log = session_log(work, env, "--bench", "capsnet_r3_recon@bf16#1 baseline_cnn@bf16#1", "--bench-budget", "0",
                      "--deadline", "300")
    assert "rows of an earlier window on this GPU model" in log
    assert "bench capsnet_r3_recon@bf16#1 done before" in log
    assert "bench baseline_cnn@bf16#1 not started: benching had its 0 s" in log
    assert (work / "logs" / "bench" / "capsnet_r3_recon@bf16#1.jsonl").read_text() == json.dumps(rows()[2]) + "\n"
    assert not (tmp_path / "out" / "bench.jsonl").exists()
    assert (work / "logs" / "bench" / ".device").read_text().strip() == kept.name  # what gpu_import.sh files them under
    assert (work / "logs" / "jobs" / "seconds.jsonl").read_text() == (kept / "jobs" / "seconds.jsonl").read_text()
    assert "1 jobs measured by earlier windows on this GPU model" in log


def test_benching_spends_the_seconds_its_benches_ran_over_the_machines_calls_not_the_time_since_the_first(tmp_path):
    """gpu_session.sh's --bench-budget counts what benches ran, summed over a machine's calls: a call whose deadline
    left it no time for its benches spends none of it, however long before the next call it began (2026-12-03's
    rehearsal: call 2 refused the two benches call 1 had left, 105 s benched), and each bench adds its seconds,
    one the deadline stops too."""
    import re
    import time

    work = device_tree(tmp_path)
    env = python3_on_path(tmp_path, f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pipeline.cli bench" ]; then
  sleep 1; case "$*" in *"--mode bf16"*) exit 124 ;; esac  # as the deadline's timeout stops one
  echo '{{"variant": "baseline_cnn", "mode": "fp32"}}'; exit 0
fi
exec "{sys.executable}" "$@"
""", CAPSNET_GPU_PROFILE="smoke")

    def took(log: str, entry: str, status: int = 0) -> int:
        (seconds,) = re.findall(rf"bench {re.escape(entry)} exit {status} after (\d+) s", log)
        return int(seconds)

    first = session_log(work, env, "--bench", "baseline_cnn@fp32#1 baseline_cnn@bf16#1 capsnet_r1@fp32#1",
                        "--deadline", "300", "--window", "100")  # the call ends with the window, the nearer end
    assert first.count("not started: under 120 s left") == 3
    time.sleep(1.5)  # more than the budget below since call 1 began
    second = session_log(work, env, "--bench", "baseline_cnn@fp32#1 baseline_cnn@bf16#1 capsnet_r1@fp32#1",
                         "--bench-budget", "1", "--deadline", "300")
    a = took(second, "baseline_cnn@fp32#1")
    assert a >= 1
    assert f"bench baseline_cnn@bf16#1 not started: benching had its 1 s on this machine ({a} s benched)" in second
    third = session_log(work, env, "--bench", "baseline_cnn@bf16#1 capsnet_r1@fp32#1", "--bench-budget", str(a + 1),
                        "--deadline", "300")
    b = took(third, "baseline_cnn@bf16#1", status=124)
    assert f"bench capsnet_r1@fp32#1 not started: benching had its {a + 1} s on this machine ({a + b} s benched)" in third


def test_the_session_log_says_whether_torch_is_compiled_where_python_writes_no_bytecode(tmp_path):
    """gpu_session.sh's header: whether the machine's torch has its bytecode (a venv made without it compiles torch
    in every process where PYTHONDONTWRITEBYTECODE is set, scripts/torch_floor.sh), and that setting."""
    import importlib.util

    import torch

    work = device_tree(tmp_path)
    env = python3_on_path(tmp_path, f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', CAPSNET_GPU_PROFILE="smoke",
                          PYTHONDONTWRITEBYTECODE="1")
    log = session_log(work, env, "--deadline", "300")
    if Path(importlib.util.cache_from_source(torch.__file__)).exists():
        assert "torch bytecode compiled; PYTHONDONTWRITEBYTECODE 1; PYTHONPYCACHEPREFIX unset" in log
        assert "torch has no bytecode" not in log
    else:  # a venv installed without it: the test below's case
        assert f"PYTHONDONTWRITEBYTECODE unset; PYTHONPYCACHEPREFIX {work / '.gpu-cache' / 'pycache'}" in log


def test_where_python_writes_no_bytecode_and_torch_has_none_the_session_writes_it_once_for_every_process(tmp_path):
    """gpu_session.sh: torch without its bytecode (here a module standing in for it, CAPSNET_BYTECODE_OF) where
    PYTHONDONTWRITEBYTECODE is set has it written under .gpu-cache/pycache, which the warm machine keeps, for every
    process after the first to read (the session's own imports of torch and the package land there)."""
    import torch

    work = device_tree(tmp_path)
    (work / "stand_in_for_torch.py").write_text("")  # no bytecode beside it
    env = python3_on_path(tmp_path, f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', CAPSNET_GPU_PROFILE="smoke",
                          PYTHONDONTWRITEBYTECODE="1", CAPSNET_BYTECODE_OF="stand_in_for_torch")
    log = session_log(work, env, "--deadline", "300")
    prefix = work / ".gpu-cache" / "pycache"
    assert "torch has no bytecode: it is written once under .gpu-cache/pycache for every process" in log
    assert f"PYTHONDONTWRITEBYTECODE unset; PYTHONPYCACHEPREFIX {prefix}" in log
    assert "torch bytecode not compiled;" in log  # what the machine's torch came with, not what the prefix now holds
    assert list((prefix / Path(torch.__file__).parent.relative_to("/")).glob("__init__.*.pyc")), "torch's bytecode unwritten"
    assert list((prefix / work.relative_to("/") / "pipeline").glob("*.pyc")), "the session's own processes' unwritten"


def test_a_call_brings_back_its_checks_as_one_file_within_the_device_tools_eight(tmp_path):
    """gpu_session.sh packs the checks' files (the bench rows, the CUDA tests' logs, the fingerprint pins and
    probe) into checks.tar.gz: with session.log, the inductor cache and the runs' parts a call's first
    window held nine files, and the device tool brings back eight."""
    work = device_tree(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    checks = ["gpu_tests.txt", "gpu_diffs.jsonl", "fingerprint_pins.txt", "fingerprint_probe.jsonl", "fingerprint_probe.txt",
              "fingerprint_trace.jsonl.gz", "fingerprint_trace.txt"]
    for name in checks:  # what the CUDA tests beside the jobs leave there
        (out / name).write_text(f"{name}\n")
    (work / ".gpu-cache" / "inductor").mkdir(parents=True)  # the warm machine's, outside the carried .gpu/
    (work / ".gpu-cache" / "inductor" / "kernel.py").write_text("cached")
    stub = f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pipeline.cli bench" ]; then echo '{{"variant": "capsnet_r1", "cache": "'"$TORCHINDUCTOR_CACHE_DIR"'"}}'; exit 0; fi
exec "{sys.executable}" "$@"
"""
    env = python3_on_path(tmp_path, stub, CAPSNET_GPU_PROFILE="smoke")
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "--bench", "capsnet_r1@fp32#1", "--deadline", "300"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    back = sorted(p.name for p in out.iterdir())
    assert len(back) == 4 and back[2].startswith("runs-"), back
    assert [back[0], back[1], back[3]] == ["checks.tar.gz", "inductor-cache.tar.gz", "session.log"], back
    with tarfile.open(out / "inductor-cache.tar.gz") as tar:
        assert tar.getnames() == ["inductor", "inductor/kernel.py"]
    with tarfile.open(out / "checks.tar.gz") as tar:
        assert sorted(tar.getnames()) == sorted(["bench.jsonl", *checks])
        row = json.loads(tar.extractfile("bench.jsonl").read())
        # compiled kernels where the next call's carry of .gpu/ leaves them (and a job training on since the last call)
        assert row["variant"] == "capsnet_r1" and row["cache"] == str(work / ".gpu-cache" / "inductor"), row
    assert "over 8 files" not in (out / "session.log").read_text()


def test_a_cold_machine_unpacks_the_inductor_cache_the_last_window_brought_back(tmp_path):
    """gpu_session.sh: the compiled kernels an earlier window brought back (.gpu/inductor-cache.tar.gz, carried in)
    are unpacked where torch.compile looks (.gpu-cache/inductor) on a machine's first call; a warm machine's later
    call keeps what it compiled since."""
    work = device_tree(tmp_path)
    (tmp_path / "inductor").mkdir()
    (tmp_path / "inductor" / "kernel.py").write_text("cached")
    (work / ".gpu").mkdir()
    with tarfile.open(work / ".gpu" / "inductor-cache.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "inductor", arcname="inductor")
    env = python3_on_path(tmp_path, f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', CAPSNET_GPU_PROFILE="smoke")
    kernel = work / ".gpu-cache" / "inductor" / "kernel.py"
    assert "inductor cache unpacked" in session_log(work, env, "--deadline", "60") and kernel.read_text() == "cached"
    kernel.write_text("compiled since")
    assert "inductor cache unpacked" not in session_log(work, env, "--deadline", "60")
    assert kernel.read_text() == "compiled since"


STUB_CLI = """#!/bin/sh
# python3 with `python3 -m pipeline.cli train|evaluate|fingerprint` recorded and faked (the job logic under test)
if [ "$1 $2" = "-m pipeline.cli" ]; then
  echo "$3 $4 $5" >>calls.log
  case "$3" in
    train) for s in $(echo "$5" | tr , ' '); do mkdir -p "models/$4/seed$s" && echo {} >"models/$4/seed$s/config.json"; done ;;
    evaluate) [ -f "$4/broken" ] && exit 1; mkdir -p "$6" && echo {} >"$6/metrics.json" ;;
  esac
  exit 0
fi
exec "%s" "$@"
"""


def test_a_window_evaluates_what_an_earlier_call_trained_and_trains_seeds_one_by_one_where_stacking_is_slower(tmp_path):
    """gpu_session.sh's jobs: a seed whose training an earlier call finished (config.json, written last)
    but whose evaluation the deadline cut is evaluated, not trained again; where the bench rows say
    stacked seeds train slower, the job trains one seed per process and asks again for the next."""
    work = device_tree(tmp_path)
    (work / "models" / "capsnet_r3" / "seed0").mkdir(parents=True)
    (work / "models" / "capsnet_r3" / "seed0" / "config.json").write_text("{}")  # trained; evaluation cut
    subprocess.run([sys.executable, "-m", "pipeline.profiles", "smoke", "--write", "params.gpu.yaml"], cwd=work, check=True)
    mode = gpu_queue.trained_mode(yaml.safe_load((work / "params.gpu.yaml").read_text())["train"], "capsnet")
    (work / "logs" / "bench").mkdir(parents=True)
    (work / "logs" / "bench" / "capsnet.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"variant": "capsnet_r3_recon", "mode": mode, "seeds": 1, "train_images_per_s": 1.0},  # slow enough for the
        {"variant": "capsnet_r3_recon", "mode": mode, "seeds": 3, "stack": "fused", "train_images_per_s": 0.2}]) + "\n")  # startups not to matter
    env = python3_on_path(tmp_path, STUB_CLI % sys.executable, CAPSNET_GPU_PROFILE="smoke", CAPSNET_GIT_COMMIT="")
    log = session_log(work, env, "--train", "capsnet_r3:0,1,2", "--deadline", "300")
    calls = [c for c in (work / "calls.log").read_text().splitlines() if not c.startswith("fingerprint")]
    assert calls == ["evaluate models/capsnet_r3/seed0 data/prepared", "train capsnet_r3 1", "evaluate models/capsnet_r3/seed1 data/prepared",
                     "train capsnet_r3 2", "evaluate models/capsnet_r3/seed2 data/prepared"], calls
    assert "capsnet_r3:0 trained before, evaluated: exit 0" in log and "seed(s) 2 after it" in log
    # the jobs that trained and evaluated are measured (seed 0's evaluation alone is not), and price the next seed
    measured = gpu_queue.job_rows([work / "logs" / "jobs" / "seconds.jsonl"])
    assert [(r["variant"], r["seeds"], r["parallel"]) for r in measured] == [("capsnet_r3", 1, 1)] * 2, measured
    assert "capsnet_r3:2: " in log and "(capsnet_r3 ×1 measured: " in log
    # an evaluation that fails is not asked again (the job would loop to the deadline), nor trained again
    (work / "models" / "capsnet_r1" / "seed0").mkdir(parents=True)
    (work / "models" / "capsnet_r1" / "seed0" / "config.json").write_text("{}")
    (work / "models" / "capsnet_r1" / "seed0" / "broken").write_text("")
    (work / "calls.log").unlink()
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "--train", "capsnet_r1:0,1", "--deadline", "90"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    calls = [c for c in (work / "calls.log").read_text().splitlines() if not c.startswith("fingerprint")]
    assert done.returncode == 0 and calls == ["evaluate models/capsnet_r1/seed0 data/prepared"], calls


def test_a_mistyped_commit_gives_way_to_the_trees_head(tmp_path):
    """scripts/gpu_plan.sh: where the copy has .git (the device tool's does), the runs record its HEAD,
    not a CAPSNET_GIT_COMMIT that differs from it (a padded b8f3efe named the first H200 window's runs)."""
    plan = (REPO / "scripts" / "gpu_plan.sh").read_text()
    check = plan[plan.index("if head=$(git rev-parse HEAD"):]
    check = check[:check.index("\nfi\n") + 4]
    tree = {"cwd": tmp_path, "capture_output": True, "text": True, "check": True}  # a copy with .git, as the device's
    subprocess.run(["git", "init", "-q"], **tree)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"], **tree)
    head = subprocess.run(["git", "rev-parse", "HEAD"], **tree).stdout.strip()
    for given, said in (("b8f3efe000", "is not this tree's HEAD"), (head, ""), ("", "")):
        env = {**os.environ, "CAPSNET_GIT_COMMIT": given} if given else {k: v for k, v in os.environ.items()
                                                                        if k != "CAPSNET_GIT_COMMIT"}
        done = subprocess.run(["bash", "-c", check + 'echo "${CAPSNET_GIT_COMMIT:-unset}"'], cwd=tmp_path, env=env,
                              capture_output=True, text=True, check=True)
        assert done.stdout.strip() == (given and head or "unset") and said in done.stderr


def test_the_window_queues_again_what_other_training_code_published(tmp_path):
    """scripts/gpu_plan.sh writes its commit's fingerprint table before it asks the queue, and the queue
    lists again a seed published by other training code (a commit since changed what training computes)."""
    script = plan_until_the_queue(tmp_path)
    publish_seed0(tmp_path, "a" * 16, "torch 2.11.0+cu130, CPU AVX2 capped")
    for fingerprint, queued in (("a" * 16, "capsnet_r3_recon:1,2"), ("b" * 16, "capsnet_r3_recon:0,1,2")):
        shutil.rmtree(tmp_path / "fingerprints", ignore_errors=True)
        env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CAPSNET_GIT_COMMIT": "c0ffee1",
               "STUB_FP": fingerprint, "PYTHONPATH": str(REPO)}
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        assert (tmp_path / "fingerprints" / "c0ffee1.json").is_file()
        assert queued in done.stdout.split(), done.stdout
        assert ("queued again" in done.stderr) == (fingerprint != "a" * 16), done.stderr


def test_the_window_carries_runs_of_another_environment_through_tables_it_computes_on_its_host(tmp_path):
    """scripts/gpu_plan.sh: a seed published in another fingerprint environment, whose commit's table there
    vouches for it, is carried by that commit's table computed on this host (scripts/fingerprint_at.py,
    only the variants it needs) when that table gives this code's fingerprint; queued again when it gives
    another, or when the table fails (its line says so); asked once per warm machine."""
    script = plan_until_the_queue(tmp_path)
    old, commit = "torch 2.11.0+cu130, CPU AVX2 capped, MKL COMPATIBLE", "d0" * 20
    publish_seed0(tmp_path, "a" * 16, old, commit)
    (tmp_path / "reports" / "runs" / "fingerprints").mkdir()
    (tmp_path / "reports" / "runs" / "fingerprints" / f"{commit}.json").write_text(json.dumps(
        {"commit": commit, "environment": old, "fingerprints": {"capsnet_r3_recon": "a" * 16}}))
    here = f"{old}, GenuineIntel, glibc 2.39"
    for at, queued in (("b" * 16, "capsnet_r3_recon:1,2"), ("c" * 16, "capsnet_r3_recon:0,1,2"), ("", "capsnet_r3_recon:0,1,2")):
        shutil.rmtree(tmp_path / "fingerprints", ignore_errors=True)
        (tmp_path / "at.log").unlink(missing_ok=True)
        env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CAPSNET_GIT_COMMIT": "c0ffee1",
               "STUB_FP": "b" * 16, "STUB_AT": at, "STUB_ENV": here, "PYTHONPATH": str(REPO)}
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        assert (tmp_path / "at.log").read_text().split()[:2] == [commit, "fingerprints/" + f"{commit}-" +
                                                                hashlib.sha256(here.encode()).hexdigest()[:8] + ".json"]
        assert (tmp_path / "at.log").read_text().split()[2:] == ["--variants", "capsnet_r3_recon"]
        assert queued in done.stdout.split(), done.stdout
        assert ("queued again" in done.stderr) == (at != "b" * 16), done.stderr
        assert ("on this host failed" in done.stdout) == (not at), done.stdout
        if at:  # the next call of the warm machine finds the table beside its own and asks for none
            again = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
            assert len((tmp_path / "at.log").read_text().splitlines()) == 1 and queued in again.stdout.split()
    # a table that takes its time is waited for; one past BRIDGE_SECONDS is given up, its runs queued again
    for seconds, queued in (("150", "capsnet_r3_recon:1,2"), ("1", "capsnet_r3_recon:0,1,2")):
        shutil.rmtree(tmp_path / "fingerprints")
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True,
                              env=env | {"STUB_AT": "b" * 16, "STUB_AT_SLEEP": "3", "BRIDGE_SECONDS": seconds})
        assert queued in done.stdout.split() and ("on this host failed" in done.stdout) == (seconds == "1"), done.stdout


ACCOUNT = re.compile(r"\[plan\] LEFT (\d+) s, read (?:(\d+) s|an unknown time) before this plan; the plan took (\d+) s "
                     r"from \d+ .*; the session has (-?\d+) s of window, (-?\d+) s of call; ")  # an unknown time: 0


def test_each_call_hands_the_session_its_share_of_the_window_and_the_cuda_tests_once(tmp_path):
    """scripts/gpu_plan.sh whole, as the device tool runs it, with gpu_session.sh stubbed (what it is handed):
    the fingerprint table is written once per warm machine, and one that fails leaves the queue going by
    protocol, not the call ended; the CUDA tests go to a machine's first call alone; a call's deadline is its
    560 s less the plan's seconds, its window LEFT less the plan's seconds and, read at T, the seconds since T
    and those after the call (60 after a cold start, 30 after a warm one), without T 165 s cold and 75 s warm;
    the session trains two jobs at a time, with the levers; CAPSNET_GPU_PROFILE and CAPSNET_GPU_BENCH (the
    rehearsal's) are what it plans with."""
    work = device_tree(tmp_path)
    (work / "tests").symlink_to(REPO / "tests")  # the device tool's copy has them (what the CUDA tests' key hashes)
    (work / "scripts" / "gpu_session.sh").write_text('echo "$*" >>session.args\n')
    # the table and the window's choice each take a second, so the plan's seconds count before and after the window
    env = python3_on_path(tmp_path, STUB_FINGERPRINT % sys.executable, CAPSNET_GIT_COMMIT="c0ffee1", STUB_FP="b" * 16,
                          STUB_FP_SLEEP="1", STUB_CHOICE_SLEEP="1", PYTHONPATH=str(work))
    log = Path(env["OUT"]) / "session.log"

    def call(left: int, read_before: int | None = None, **extra: str) -> tuple[dict, tuple]:
        at = {} if read_before is None else {"CAPSNET_GPU_LEFT_AT": str(int(time.time()) - read_before)}
        done = subprocess.run(["bash", "scripts/gpu_plan.sh"], cwd=work, capture_output=True, text=True, timeout=300,
                              env=env | {"CAPSNET_GPU_LEFT": str(left)} | at | extra)
        assert done.returncode == 0, done.stderr
        args = (work / "session.args").read_text().splitlines()[-1].split()
        handed = {"tests": "--tests" in args, **{k: args[args.index(f"--{k}") + 1] for k in ("deadline", "window", "bench")},
                  "levers": "--levers" in args, "parallel": args[args.index("--parallel") + 1], "stdout": done.stdout}
        account = log.read_text().splitlines()[-1]
        match = ACCOUNT.match(account)
        assert match, account
        return handed, tuple(int(g or 0) for g in match.groups())

    handed, (left, since, took, window, deadline) = call(900)  # a cold machine's first call, LEFT's time unknown
    assert took >= 2 and window == left - 165 - took and deadline == 560 - took
    assert handed["tests"] and handed["levers"] and handed["parallel"] == "2"
    assert (handed["deadline"], handed["window"]) == (str(deadline), str(window))
    assert handed["bench"].startswith("capsnet_r3_recon@bf16-compile,") and yaml.safe_load(
        (work / "params.gpu.yaml").read_text())["base"]["profile"] == "gpu"
    handed, (left, since, took, window, deadline) = call(600, read_before=20)  # the warm machine's next call
    assert since >= 20 and window == left - since - 30 - took and deadline == 560 - took and not handed["tests"]
    _, (left, _, took, window, _) = call(500)  # without LEFT's time: 75 s
    assert window == left - 75 - took
    assert len((work / "fp.log").read_text().splitlines()) == 1  # the table written once per warm machine

    for fresh in ("logs", "fingerprints"):  # a fresh machine, whose fingerprint table fails, in the rehearsal's profile
        shutil.rmtree(work / fresh)
    handed, (left, since, took, window, deadline) = call(
        800, read_before=10, STUB_FP="", CAPSNET_GPU_PROFILE="smoke", CAPSNET_GPU_BENCH="capsnet_r1@fp32#1")
    assert "fingerprint table failed" in handed["stdout"] and "the queue goes by protocol only" in handed["stdout"]
    assert window == left - since - 60 - took and handed["tests"] and handed["bench"] == "capsnet_r1@fp32#1"
    assert yaml.safe_load((work / "params.gpu.yaml").read_text())["base"]["profile"] == "smoke"


@pytest.mark.parametrize("capture_test", ["PASSED", "FAILED"])
def test_the_cuda_tests_run_beside_the_first_jobs_and_a_seed_they_do_not_prove_trains_again(tmp_path, capture_test):
    """gpu_session.sh --tests with training: the tests run beside the first job, which trains with the
    profile's settings (compiled and captured); once they pass, its seed is evaluated as trained; where
    the capture test fails, the levers fall back to eager bf16 and the seed trains again with them
    before it is evaluated."""
    work = device_tree(tmp_path)
    (work / "logs" / "bench").mkdir(parents=True)
    (work / "logs" / "bench" / "caps.jsonl").write_text(json.dumps(  # fast enough to fit any window
        {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "captured": True, "train_images_per_s": 1e9}) + "\n")
    capture = "tests/test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    tests = "\n".join([f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed] {capture_test} [ 1%]",
                       "tests/test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon] PASSED"])
    env = python3_on_path(tmp_path, STUB_GPU % sys.executable, CAPSNET_GPU_PROFILE="gpu", CAPSNET_GIT_COMMIT="",
                          STUB_TESTS=tests)
    log = session_log(work, env, "--tests", "--levers", "--train", "capsnet_r3:0", "--deadline", "300")
    assert "CUDA tests beside the first jobs" in log
    calls = (work / "calls.log").read_text().splitlines()
    if capture_test == "PASSED":
        assert calls == ["train capsnet_r3 0 params.gpu.yaml", "evaluate models/capsnet_r3/seed0 data/prepared"], calls
        return
    assert "the profile's bf16-compile-capture is not proven either" in log and "bf16, eager" in log
    assert "capsnet_r3:0 trained with settings its CUDA tests do not prove, removed to train again" in log
    assert calls == ["train capsnet_r3 0 params.gpu.yaml", "train capsnet_r3 0 params.gpu.capsnet.yaml",
                     "evaluate models/capsnet_r3/seed0 data/prepared"], calls
    retrained = json.loads((work / "models" / "capsnet_r3" / "seed0" / "config.json").read_text())["config"]
    assert (retrained["compile"], retrained["cuda_graph"], retrained["amp"]) == (False, False, True)


def test_a_run_is_checked_against_the_cuda_tests_of_the_speed_settings_it_recorded():
    """gpu_levers.run_unproven (gpu_session.sh's proofs): a run's recorded settings name its bench mode,
    whose proving tests on its model's timed variant must all have passed; eager needs none; a model
    the levers do not choose for keeps the profile, unchecked."""
    capture = "test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    passed = {f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed]": "PASSED",
              "test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon]": "PASSED",
              "test_gpu.py::test_compiled_fp32_step_matches_eager_fp32[capsnet_r3_recon]": "FAILED",
              f"{capture}[baseline_cnn-bf16-eager-fused-3seed]": "PASSED"}

    def run(model, amp, compile_, cuda_graph):
        return {"config": {"model": model, "amp": amp, "compile": compile_, "compile_mode": "default",
                           "channels_last": False, "cuda_graph": cuda_graph}}

    assert gpu_levers.run_unproven(run("capsnet", True, True, True), passed) == ""  # the gpu profile's CapsNets
    assert gpu_levers.run_unproven(run("baseline_cnn", True, False, True), passed) == ""  # its CNN, captured eager
    assert "FAILED" in gpu_levers.run_unproven(run("capsnet", False, True, False), passed)  # paper-gpu's compiled fp32
    assert "did not run" in gpu_levers.run_unproven(run("capsnet", True, True, True), {})
    assert gpu_levers.run_unproven(run("capsnet", False, False, False), {}) == ""  # eager fp32: nothing to prove
    assert gpu_levers.run_unproven(run("multimnist_cnn", True, False, True), {}) == ""  # no lever chosen for it
    assert "no CUDA test proves" in gpu_levers.run_unproven(
        {"config": {**run("capsnet", True, True, False)["config"], "compile_mode": "reduce-overhead"}}, passed)


def test_a_session_refuses_an_argument_it_does_not_know_before_any_work(tmp_path):
    """A mistyped option (--deadlin) would otherwise be a window of the default 560 s, spent on other work."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_session.sh"), "--deadlin", "300"], cwd=tmp_path,
                          env=os.environ | {"OUT": str(tmp_path / "out")}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "unknown argument --deadlin (see the header of "
                                                 f"{REPO / 'scripts' / 'gpu_session.sh'})\n")
    assert not (tmp_path / "out").exists()


def test_gpu_session_writes_only_git_ignored_paths():
    """The device tool re-sends the working tree each call and deletes there what git does not
    ignore: a run output of scripts/gpu_session.sh or gpu_plan.sh outside .gitignore (results/**/metrics.json was)
    vanishes between calls of one session."""
    script = (REPO / "scripts" / "gpu_session.sh").read_text() + (REPO / "scripts" / "gpu_plan.sh").read_text()
    written = ["models/v/seed0/model.safetensors", "checkpoints/v/seed0.pt", "gpu_results/v/seed0/metrics.json",
               "logs/bench/v@bf16-graphs.jsonl", "journal/run.jsonl", "logs/v-0.log", "params.gpu.yaml",
               "params.gpu.$key.yaml", "logs/gpu_tests.txt", "fingerprints/0953adc.json", "params.paper-gpu.yaml",
               "logs/tests.kept",
               "data/prepared/train.safetensors"]
    for path in written:
        assert path.split("/")[0] in script, path
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=REPO, capture_output=True,
                             text=True).stdout.split()
    assert ignored == written
    assert '"results/$variant' not in script  # evaluate never writes into the committed results/ tree


def test_the_gpu_scripts_call_capsnet_with_options_it_has():
    """The GPU session runs where no test runs before it: every `capsnet` command its scripts call,
    and every option they pass, must exist (a renamed option fails there, in the GPU's minutes)."""
    import re

    from pipeline.cli import main

    calls = []
    for shell in ("gpu_session.sh", "gpu_plan.sh", "gpu_import.sh"):
        text = (REPO / "scripts" / shell).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            for m in re.finditer(r'(?:\$CLI|pipeline\.cli|capsnet)\s+([a-z][\w-]*)([^|;&]*)', line):
                calls.append((shell, m.group(1), re.findall(r"(--[a-z][\w-]*)", m.group(2))))
    assert any(command == "prepare" for _, command, _ in calls)  # the scan sees the calls
    for shell, command, options in calls:
        if command not in main.commands:
            continue  # `capsnet` in prose, or another program's word
        known = {o for p in main.commands[command].params for o in p.opts}
        assert set(options) <= known, f"{shell}: capsnet {command} has no {sorted(set(options) - known)}"
