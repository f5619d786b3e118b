"""A GPU window's calls (issue #36): a job that outlasts its call trains on in a process session of its own
(the device tool ends a call's processes when it returns, but not such a one), and the next call of the warm
machine waits for it rather than start it again, which cost a process start, the epochs since its last
checkpoint and the seconds between the calls (about 30 s of a paper seed's 15-minute window)."""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import script
from gpu_device import STUB_GPU, device_tree, python3_on_path

gpu_queue = script("gpu_queue")

TRAIN_SECONDS = 28  # the stub's training of capsnet_r3: longer than the first call's deadline below

# the GPU machine's python3 (STUB_GPU), capsnet_r3's training taking TRAIN_SECONDS (the others none)
SLOW_TRAIN = """#!/usr/bin/env bash
[ "$1 $2 $3 $4" = "-m pipeline.cli train capsnet_r3" ] && sleep %d
exec "%s" "$@"
"""


def device_call(work: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """gpu_session.sh run as the device tool runs a call: its output read to the end, then every process left
    in the call's process session ended; and the call's seconds."""
    shutil.rmtree(Path(env["OUT"]), ignore_errors=True)
    began = time.monotonic()
    call = subprocess.Popen(["bash", "scripts/gpu_session.sh", *args], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = call.communicate(timeout=120)
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(call.pid)], check=False)
    return subprocess.CompletedProcess(call.args, call.returncode, out, err), time.monotonic() - began


def test_a_job_that_outlasts_its_call_trains_on_and_the_next_call_waits_for_it(tmp_path):
    """The first call returns at its deadline while its job trains on (its streams not holding the call's
    open); the second benches nothing on the GPU that job shares, counts it as sharing the GPU with its own
    jobs, waits for it, evaluates it and measures its whole time; the seed is trained once."""
    work = device_tree(tmp_path)
    (tmp_path / "stub.py").write_text(STUB_GPU % sys.executable)
    (tmp_path / "stub.py").chmod(0o755)
    env = python3_on_path(tmp_path, SLOW_TRAIN % (TRAIN_SECONDS, tmp_path / "stub.py"), CAPSNET_GPU_PROFILE="smoke",
                          CAPSNET_GIT_COMMIT="")
    (work / "logs" / "bench").mkdir(parents=True)
    (work / "logs" / "bench" / ".device").write_text("stub-gpu\n")  # no torch import to name the GPU
    first, seconds = device_call(work, env, "--train", "capsnet_r3:0", "--parallel", "1", "--deadline", "20",
                                 "--window", "120")  # a window longer than the call
    log = (tmp_path / "out" / "session.log").read_text()
    assert first.returncode == 0, first.stderr + log
    assert seconds < TRAIN_SECONDS - 2, f"the call waited for its job: {seconds:.0f} s\n{log}"
    assert "capsnet_r3:0 trains on past this call's deadline" in log, log
    assert not (work / "models" / "capsnet_r3" / "seed0").exists()
    second, _ = device_call(work, env, "--bench", "capsnet_r3_recon@fp32#1", "--train", "capsnet_r1:0 capsnet_r3:0",
                            "--parallel", "1", "--deadline", "150")
    log = (tmp_path / "out" / "session.log").read_text()
    assert second.returncode == 0, second.stderr + log
    assert "bench capsnet_r3_recon@fp32#1 not started: capsnet_r3 trains on this GPU since an earlier call" in log, log
    assert "capsnet_r3:0 exit 0 after" in log, log
    assert (work / "gpu_results" / "capsnet_r3" / "seed0" / "metrics.json").is_file()
    calls = (work / "calls.log").read_text().splitlines()  # capsnet_r3's train logged as its sleep ends
    assert calls == ["train capsnet_r1 0 params.gpu.yaml", "evaluate models/capsnet_r1/seed0 data/prepared",
                     "train capsnet_r3 0 params.gpu.yaml", "evaluate models/capsnet_r3/seed0 data/prepared"], calls
    measured = gpu_queue.job_rows([work / "logs" / "jobs" / "seconds.jsonl"])
    # capsnet_r1 trained beside capsnet_r3, which trained on from the first call (two on the GPU)
    assert [(r["variant"], r["seeds"], r["parallel"]) for r in measured] == [("capsnet_r1", 1, 2), ("capsnet_r3", 1, 1)], measured
    assert measured[1]["seconds"] >= TRAIN_SECONDS, measured  # from its start in the first call
    assert not list((work / "logs" / "detached").iterdir())  # done with: a third call starts nothing, waits for nothing
    third, _ = device_call(work, env, "--train", "capsnet_r1:0 capsnet_r3:0", "--parallel", "1", "--deadline", "60")
    assert "capsnet_r3:0 done before" in (tmp_path / "out" / "session.log").read_text()
    assert (work / "calls.log").read_text().splitlines() == calls


@pytest.mark.parametrize("named", [True, False])
def test_a_job_that_ended_without_its_exit_status_is_not_waited_for(tmp_path, named):
    """A job whose process is gone with no exit status written (killed with what ran it), or that never named
    its process, counts as stopped at the deadline: the call neither waits for it to the deadline nor
    evaluates it."""
    work = device_tree(tmp_path)
    env = python3_on_path(tmp_path, STUB_GPU % sys.executable, CAPSNET_GPU_PROFILE="smoke", CAPSNET_GIT_COMMIT="")
    detached = work / "logs" / "detached"
    detached.mkdir(parents=True)
    (detached / "capsnet_r3-0.job").write_text(f"{int(time.time())} 1 0 params.gpu.yaml\n")
    if named:
        (detached / "capsnet_r3-0.pid").write_text(f"{2 ** 22 + 1}\n")  # over the kernel's largest pid: no such process
    done, seconds = device_call(work, env, "--train", "capsnet_r3:0", "--parallel", "1", "--deadline", "60")
    log = (tmp_path / "out" / "session.log").read_text()
    assert done.returncode == 0, done.stderr + log
    assert "capsnet_r3:0 exit 137 after" in log and seconds < 30, log
    assert not (work / "calls.log").exists() and not list(detached.iterdir())
