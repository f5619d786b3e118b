"""A lent GPU window is 15 device-minutes: scripts/gpu_queue.py --fit starts only jobs whose estimate
fits what is left of it, and scripts/gpu_session.sh never benches again what an earlier window on the
same GPU model benched (gpu_import.sh keeps its rows in reports/bench/<model>/)."""

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, bench_table, script, write_profile

gpu_levers, gpu_queue = script("gpu_levers"), script("gpu_queue")


@pytest.fixture(scope="module")
def gpu_params(tmp_path_factory):
    return yaml.safe_load(write_profile(tmp_path_factory.mktemp("params") / "params.gpu.yaml").read_text())


CAPS, CNN = "bf16-compile-capture", "bf16-capture"  # the gpu profile's bench modes (asserted below)


def rows(capsnet_three=60_000.0, capsnet_one=24_000.0, cnn_one=27_000.0):
    return [{"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 3, "stack": "fused",
             "train_images_per_s": capsnet_three},
            {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "train_images_per_s": capsnet_one},
            {"variant": "capsnet_r3_recon", "mode": "bf16", "seeds": 1, "train_images_per_s": 1.0},  # not how it trains
            {"variant": "baseline_cnn", "mode": CNN, "seeds": 1, "train_images_per_s": cnn_one},
            {"variant": "baseline_cnn", "mode": "bf16-compile", "seeds": 1, "train_images_per_s": 1.0}]


def test_the_estimate_is_the_bench_row_of_the_settings_the_job_trains_with(gpu_params):
    """The gpu profile compiles the CapsNets, not the CNNs (compile_cnns: false), and captures every step
    (cuda_graph): each job is priced by
    its model's row in that mode; three stacked seeds at the three-seed row, shared by the processes."""
    assert gpu_queue.trained_mode(gpu_params["train"], "capsnet") == CAPS
    assert gpu_queue.trained_mode(gpu_params["train"], "baseline_cnn") == CNN
    epochs, margin = gpu_params["train"]["epochs"], gpu_queue.MARGIN
    evaluation = gpu_queue.EVAL_SECONDS + epochs * gpu_queue.EPOCH_EVAL_SECONDS  # a seed's: at its end and every epoch
    start = gpu_queue.STARTUP_SECONDS  # once per process
    seconds, source = gpu_queue.job_seconds(gpu_params, "capsnet_r3_recon", 3, rows(), parallel=2)
    assert seconds == pytest.approx(start + margin * 3 * epochs * 60_000 / (60_000 / 2) + 3 * evaluation)
    assert f"capsnet_r3_recon {CAPS} ×3: 60,000 images/s over 2" in source
    one, _ = gpu_queue.job_seconds(gpu_params, "capsnet_r1", 1, rows(), parallel=1)  # every CapsNet: r3_recon's row
    assert one == pytest.approx(start + margin * epochs * 60_000 / 24_000 + evaluation)
    # MultiMNIST's 36×36 and §5.2's 40×40 CapsNets cost their counted FLOP over capsnet_r3_recon's (more
    # primary capsules to route: more than the area), their CNNs at least their area over MNIST's 28×28
    flops = json.loads(gpu_queue.FLOPS.read_text())
    for variant, side in (("multimnist_r3_recon", 36), ("capsnet_affnist", 40)):
        canvas, source = gpu_queue.job_seconds(gpu_params, variant, 1, rows(), parallel=1)
        ratio = flops[variant] / flops["capsnet_r3_recon"]
        assert ratio > (side / 28) ** 2 and f"×{ratio:.2f} its FLOP per image" in source
        assert canvas - evaluation - start == pytest.approx((one - evaluation - start) * ratio)
    pooled, source = gpu_queue.job_seconds(gpu_params, "cnn_affnist", 1, rows(), parallel=1)
    alone, _ = gpu_queue.job_seconds(gpu_params, "baseline_cnn", 1, rows(), parallel=1)
    assert pooled - evaluation - start == pytest.approx((alone - evaluation - start) * (40 / 28) ** 2)
    assert "×2.04 its image area" in source
    # two seeds stacked, no two-seed row: at the three-seed row's images/s, all seeds together; no
    # stacked row at all: training counts as no faster than one seed after another
    two, source = gpu_queue.job_seconds(gpu_params, "capsnet_r3", 2, rows(), parallel=1)
    assert two == pytest.approx(start + margin * 2 * epochs * 60_000 / 60_000 + 2 * evaluation) and "×3" in source
    two, _ = gpu_queue.job_seconds(gpu_params, "capsnet_r3", 2, rows()[1:], parallel=1)
    assert two - start == pytest.approx(2 * (one - start))
    cnn, source = gpu_queue.job_seconds(gpu_params, "baseline_cnn", 1, rows(), parallel=1)
    assert cnn == pytest.approx(start + margin * epochs * 60_000 / 27_000 + evaluation) and f"baseline_cnn {CNN} ×1" in source
    assert gpu_queue.job_seconds(gpu_params, "baseline_cnn", 1, rows()[:3], parallel=1) is None  # no CNN row


def test_a_job_starts_only_as_far_as_the_window_allows(gpu_params):
    """All its seeds when they fit, else its first seeds (the rest wait for the next window), else nothing;
    with no bench row to estimate from, it starts as it is."""
    bench = rows(capsnet_three=30_000.0)  # stacking pays (3 seeds sooner stacked), two stacked outlast one
    three, _ = gpu_queue.job_seconds(gpu_params, "capsnet_r3_recon", 3, bench, parallel=2)
    one, _ = gpu_queue.job_seconds(gpu_params, "capsnet_r3_recon", 1, bench, parallel=2)
    two, _ = gpu_queue.job_seconds(gpu_params, "capsnet_r3_recon", 2, bench, parallel=2)
    assert one < two < three  # the test's premise: one seed is the smallest job
    assert gpu_queue.fit("capsnet_r3_recon:0,1,2", three + 1, gpu_params, bench, 2)[0] == "capsnet_r3_recon:0,1,2"
    start, why = gpu_queue.fit("capsnet_r3_recon:0,1,2", one + 1, gpu_params, bench, 2)
    assert start == "capsnet_r3_recon:0" and "seed(s) 1,2 next window" in why
    start, why = gpu_queue.fit("capsnet_r3_recon:0,1,2", one - 1, gpu_params, bench, 2)
    assert start is None and "not started" in why
    assert gpu_queue.fit("baseline_cnn:1,2", 10, gpu_params, rows()[:3], 2)[0] == "baseline_cnn:1,2"


def test_where_stacked_seeds_train_slower_a_job_trains_one_seed_and_asks_again_for_the_next(gpu_params):
    """The H200's rows (2026-11-26): three stacked seeds 0.48x one seed's images/s; one seed per process
    then, gpu_session.sh's job asking again after each; a faster stack, or none measured (the startups it
    saves), stacked as before; where startups outweigh training (a few images per seed), stacked too."""
    slow = rows(capsnet_three=20_000.0, capsnet_one=24_000.0)
    assert not gpu_queue.stacking_pays(gpu_params, "capsnet_r3_recon", 3, slow, 2)
    assert gpu_queue.stacking_pays(gpu_params, "capsnet_r3_recon", 3, rows(), 2)  # 60k stacked beats 24k alone
    assert gpu_queue.stacking_pays(gpu_params, "baseline_cnn", 3, slow, 2)  # no stacked CNN row: startups saved
    brief = {**gpu_params, "train": {**gpu_params["train"], "epochs": 1}, "prepare": {**gpu_params["prepare"], "train_subset": 32}}
    assert gpu_queue.stacking_pays(gpu_params | brief, "capsnet_r3_recon", 3, rows(capsnet_three=2.0, capsnet_one=3.0), 1)
    start, why = gpu_queue.fit("capsnet_r3_recon:0,1,2", 10_000, gpu_params, slow, 2)
    assert start == "capsnet_r3_recon:0" and "seed(s) 1,2 after it" in why and "×1: 24,000" in why
    assert gpu_queue.fit("capsnet_r3_recon:2", 10_000, gpu_params, slow, 2)[0] == "capsnet_r3_recon:2"


def test_a_job_the_last_call_stopped_resumes_whatever_the_estimate(gpu_params, tmp_path):
    """Its checkpoint, of seeds that still lack metrics, resumes (it was started to end in the window; a
    new estimate would start it afresh or not at all); a checkpoint holding a seed with metrics does not."""
    (tmp_path / "seed0.pt").write_bytes(b"stopped")  # started as the item's first seed, stopped by the deadline
    (tmp_path / "seed1-3.pt").write_bytes(b"old")  # seed 3 is not wanted: not this item's job
    start, why = gpu_queue.fit("capsnet_r3_recon:0,1,2", 1, gpu_params, rows(), 2, tmp_path)
    assert start == "capsnet_r3_recon:0" and "resume" in why
    assert gpu_queue.fit("capsnet_r3_recon:1,2", 1, gpu_params, rows(), 2, tmp_path)[0] is None
    assert gpu_queue.fit("capsnet_r3_recon:1,2", 1, gpu_params, rows(), 2, tmp_path / "absent")[0] is None


def test_a_job_measured_before_is_priced_by_its_measured_seconds(gpu_params, tmp_path):
    """The bench row of capsnet_r3_recon over-priced the H200 window of 2026-11-27 (155 s estimated for a
    seed that trained and evaluated in 118 s at routing 3, 49-87 s at routing 1): a variant's seeds
    measured under the same protocol and mode price its next ones, each an upper bound where as many
    processes shared the GPU or more, scaled by the sharing where fewer did; the least bound, with MARGIN."""
    bench_price, _ = gpu_queue.job_seconds(gpu_params, "capsnet_r1", 1, rows(), 2)
    measured = [gpu_queue.job_row(gpu_params, "capsnet_r1", 1, 70.0, 2),
                gpu_queue.job_row(gpu_params, "capsnet_r1", 1, 50.0, 1),  # alone: twice that beside another
                gpu_queue.job_row(gpu_params, "capsnet_r1", 1, 192.0, 3)]  # compiling beside the CUDA tests
    seconds, source = gpu_queue.measured_seconds(gpu_params, "capsnet_r1", 1, measured, 2)
    assert seconds == pytest.approx(gpu_queue.MARGIN * 70.0) and "70 s with 2 sharing" in source
    assert gpu_queue.measured_seconds(gpu_params, "capsnet_r1", 1, measured, 1)[0] == pytest.approx(gpu_queue.MARGIN * 50.0)
    assert gpu_queue.measured_seconds(gpu_params, "capsnet_r1", 1, measured[1:2], 2)[0] == pytest.approx(gpu_queue.MARGIN * 100.0)
    # another variant, seed count, mode or protocol: not this job's measurement
    other = {**gpu_params, "train": {**gpu_params["train"], "epochs": gpu_params["train"]["epochs"] * 2}}
    for who, n, params in (("capsnet_r3", 1, gpu_params), ("capsnet_r1", 2, gpu_params), ("capsnet_r1", 1, other)):
        assert gpu_queue.measured_seconds(params, who, n, measured, 2) is None
    assert gpu_queue.measured_seconds(gpu_params, "capsnet_r1", 1, [{**measured[0], "mode": "fp32"}], 2) is None
    # the window's last minutes: the bench price does not fit, the measured one does, and it starts
    left = bench_price - 1
    assert left > gpu_queue.MARGIN * 70.0  # the test's premise
    assert gpu_queue.fit("capsnet_r1:2", left, gpu_params, rows(), 2)[0] is None
    start, why = gpu_queue.fit("capsnet_r1:2", left, gpu_params, rows(), 2, jobs=measured)
    assert start == "capsnet_r1:2" and "measured" in why
    # measured slower than the bench says: the measurement holds it back
    assert gpu_queue.fit("capsnet_r1:2", bench_price + 1, gpu_params, rows(), 2,
                         jobs=[gpu_queue.job_row(gpu_params, "capsnet_r1", 1, bench_price, 2)])[0] is None
    # recorded from the command line (gpu_session.sh after each job), read back by --fit
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(gpu_params))
    jobs = tmp_path / "jobs" / "seconds.jsonl"
    common = [sys.executable, "scripts/gpu_queue.py", "--params", str(tmp_path / "params.yaml"), "--jobs", str(jobs)]
    subprocess.run([*common, "--record", "capsnet_r1:1", "--seconds", "70", "--parallel", "2", "--commit", "abcdef0123"],
                   cwd=REPO, check=True)
    assert gpu_queue.job_rows([jobs, tmp_path / "absent"]) == [{**measured[0], "commit": "abcdef0"}]
    fits = subprocess.run([*common, "--fit", "capsnet_r1:2", "--left", "80", "--parallel", "2", "--bench", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, check=True)
    assert fits.stdout.strip() == "capsnet_r1:2" and "measured: 70 s" in fits.stderr


def test_fit_from_the_command_line(gpu_params, tmp_path):
    """What gpu_session.sh runs before each job: the item to start on stdout, why on stderr."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(gpu_params))
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / f"capsnet_r3_recon@{CAPS}#1,3.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows()[1:]) + "\nnot JSON\n")
    (tmp_path / "bench" / f"capsnet_r3_recon@{CAPS}#3.jsonl.tmp").write_text(  # a bench the deadline cut
        json.dumps(rows()[0]) + '\n{"variant": "capsnet_r3_')
    args = [sys.executable, "scripts/gpu_queue.py", "--fit", "capsnet_r3_recon:0,1,2", "--params",
            str(tmp_path / "params.yaml"), "--bench", str(tmp_path / "bench"), "--parallel", "2",
            "--checkpoints", str(tmp_path / "checkpoints"), "--left"]
    fits = subprocess.run([*args, "10000"], cwd=REPO, capture_output=True, text=True, check=True)
    assert fits.stdout.strip() == "capsnet_r3_recon:0,1,2" and "estimated of 10000 s left" in fits.stderr
    assert "×3: 60,000 images/s" in fits.stderr  # the three-seed row, from the bench cut short
    late = subprocess.run([*args, "20"], cwd=REPO, capture_output=True, text=True, check=True)
    assert late.stdout.strip() == "" and "not started" in late.stderr
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "seed0-1-2.pt").write_bytes(b"stopped")
    resumed = subprocess.run([*args, "20"], cwd=REPO, capture_output=True, text=True, check=True)
    assert resumed.stdout.strip() == "capsnet_r3_recon:0,1,2" and "resume from" in resumed.stderr


def device_tree(tmp_path: Path) -> Path:
    """The working tree as the device tool sends it to the GPU machine (scripts, package, params),
    its data prepared before (no download there)."""
    work = tmp_path / "device"
    for part in ("scripts", "pipeline", "params.yaml"):
        (shutil.copytree if (REPO / part).is_dir() else shutil.copy)(REPO / part, work / part)
    (work / "data" / "prepared").mkdir(parents=True)
    (work / "data" / "prepared" / "train.safetensors").write_text("prepared before")
    return work


def python3_on_path(tmp_path: Path, script: str, **env: str) -> dict:
    """The session's environment: ``script`` as its `python3` (first on PATH), $OUT under tmp_path, ``env``."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(script)
    (tmp_path / "bin" / "python3").chmod(0o755)
    return {**os.environ, "OUT": str(tmp_path / "out"), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", **env}


def session_log(work: Path, env: dict, *args: str, timeout: int = 300) -> str:
    """One gpu_session.sh call with ``args`` in ``work``, which must pass; its own session.log ($OUT's)."""
    log = Path(env["OUT"]) / "session.log"
    log.unlink(missing_ok=True)
    done = subprocess.run(["bash", "scripts/gpu_session.sh", *args], cwd=work, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr + (log.read_text() if log.exists() else "")
    return log.read_text()


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
                        "--deadline", "100")
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


def test_an_image_costs_its_area_or_its_flop_whichever_is_more_and_the_table_is_what_torch_counts():
    """gpu_queue.image_cost prices a variant nobody timed from the variant timed for its model:
    reports/bench/flop_per_image.json must hold what scripts/flop_table.py counts for every variant."""
    flop_table = script("flop_table")
    committed = json.loads(gpu_queue.FLOPS.read_text())
    counted = flop_table.count(REPO / "params.yaml")
    assert committed.keys() == counted.keys(), "run .venv/bin/python scripts/flop_table.py"
    assert all(committed[v] == pytest.approx(counted[v], rel=1e-6) for v in counted), \
        "reports/bench/flop_per_image.json is not what the code counts: run .venv/bin/python scripts/flop_table.py"
    flops = {"timed": 1e9, "more": 4e9, "less": 0.5e9}
    assert gpu_queue.image_cost("more", "timed", "affnist", flops) == (4.0, "×4.00 its FLOP per image")
    assert gpu_queue.image_cost("less", "timed", "affnist", flops) == (pytest.approx((40 / 28) ** 2), "×2.04 its image area")
    assert gpu_queue.image_cost("unknown", "timed", "multimnist", flops)[1] == "×1.65 its image area"  # not counted: area
    assert gpu_queue.image_cost("less", "timed", "table1", flops) == (1.0, "")


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


def test_the_import_reads_a_calls_checks_from_their_archive_and_from_an_older_calls_loose_files(tmp_path):
    script = (REPO / "scripts" / "gpu_import.sh").read_text()
    fragment = script[script.index("n=0\nfor folder in"):]
    fragment = fragment[:fragment.index("\ndone\n") + 6]
    new, old = tmp_path / "1", tmp_path / "2"
    new.mkdir(), old.mkdir()
    (tmp_path / "fingerprint_pins.txt").write_text("...\n5 passed in 90s\n")
    with tarfile.open(new / "checks.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "fingerprint_pins.txt", arcname="fingerprint_pins.txt")
    (old / "fingerprint_pins.txt").write_text("1 failed in 80s\n")
    done = subprocess.run(["bash", "-c", f"folders=({new} {old}); BIN=/nowhere\n{fragment}"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.stdout.splitlines() == [f"fingerprint pins on the GPU host's CPU ({new}): 5 passed in 90s",
                                        f"fingerprint pins on the GPU host's CPU ({old}): 1 failed in 80s"], done.stdout + done.stderr
    assert [p.name for p in new.iterdir()] == ["checks.tar.gz"]  # the device tool's folders are read-only: unpacked elsewhere


# the tools gpu_import.sh calls, each logging its call: `capsnet publish` makes its folder, `capsnet report`
# writes a metrics file and ablation.md; `python -m pipeline.profiles NAME --write PATH` writes "profile NAME";
# `python -c CODE FILE…` (lineage.keep_tables) logs its files
IMPORT_CAPSNET = """#!/bin/sh
echo "capsnet $*" >>calls.log
if [ "$1" = publish ]; then mkdir -p "$4"; fi
if [ "$1" = report ]; then
  mkdir -p "$4/metrics" && echo {} >"$4/metrics/capsnet_r1.json" && echo "# written" >"$4/ablation.md"
fi
"""
IMPORT_PYTHON = """#!/bin/sh
case "$1" in
  -m) echo "python $*" >>calls.log; echo "profile $3" >"$5" ;;
  -c) shift 2; echo "keep_tables $*" >>calls.log ;;
  *) echo "python $*" >>calls.log ;;
esac
"""


def window_archive(folder: Path, stamp: str, files: dict[str, str]) -> None:
    """A call's runs archive as gpu_session.sh leaves it: runs-STAMP.tar.gz split in parts."""
    import io

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    half = len(data.getvalue()) // 2
    for part, chunk in (("aa", data.getvalue()[:half]), ("ab", data.getvalue()[half:])):
        (folder / f"runs-{stamp}.tar.gz.part-{part}").write_bytes(chunk)


def test_the_import_brings_each_folders_newest_archive_home_and_rewrites_the_report_from_it(tmp_path):
    """scripts/gpu_import.sh end to end, its tools stubbed: each folder's newest archive (a warm machine's
    are cumulative) joined from its parts; models and results where the stages write them; the journal
    replayed and kept; the runs published; the profile's params written (CAPSNET_GPU_PROFILE's for a
    rehearsal); bench rows and measured jobs under the GPU model; fingerprint tables kept; the report
    written fresh over reports/, its stale metrics gone; each call's account, CUDA tests' log and pins."""
    work = tmp_path / "work"
    (work / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "gpu_import.sh", work / "scripts")
    (work / "scripts" / "gpu_travel.py").write_text('print("the next window sends 3 MiB")\n')
    (work / ".venv" / "bin").mkdir(parents=True)
    for name, stub in (("capsnet", IMPORT_CAPSNET), ("python", IMPORT_PYTHON)):
        (work / ".venv" / "bin" / name).write_text(stub)
        (work / ".venv" / "bin" / name).chmod(0o755)
    (work / "reports" / "metrics").mkdir(parents=True)
    (work / "reports" / "metrics" / "renamed_row.json").write_text("{}")
    first, second = tmp_path / "device" / "1", tmp_path / "device" / "2"
    first.mkdir(parents=True), second.mkdir()
    window_archive(first, "20261201T090000", {"models/capsnet_r1/seed0/config.json": "older",
                                               "models/capsnet_r1/seed9/config.json": "older"})
    window_archive(first, "20261201T093000", {
        "models/capsnet_r1/seed0/config.json": "newest", "results/capsnet_r1/seed0/metrics.json": "{}",
        "journal/a.jsonl": "{}\n", "logs/bench/.device": "nvidia-h200\n", "logs/bench/capsnet_r1@bf16#1.jsonl": "{}\n",
        "logs/jobs/seconds.jsonl": '{"job": 1}\n', "fingerprints/abc1234-env.json": "{}"})
    window_archive(second, "20261201T110000", {
        "models/baseline_cnn/seed0/config.json": "cnn", "results/baseline_cnn/seed0/metrics.json": "{}",
        "journal/b.jsonl": "{}\n"})
    (first / "session.log").write_text("12:20:01 call starts\n[plan] window 420 s, plan 380 s\n...\n"
                                       "12:31:05 session done\n")
    checks = {"gpu_tests.key": "key\n", "gpu_tests.txt": "9 passed\n", "fingerprint_pins.txt": "5 passed\n"}
    with tarfile.open(first / "checks.tar.gz", "w:gz") as tar:
        for name, text in checks.items():
            (tmp_path / name).write_text(text)
            tar.add(tmp_path / name, arcname=name)
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    done = subprocess.run(["bash", "scripts/gpu_import.sh", str(first), str(second)], cwd=work, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (work / "calls.log").read_text().splitlines()
    assert calls[:4] == ["capsnet track sync .gpu-import/journal",
                         "capsnet publish .gpu-import/models .gpu-import/results reports/runs",
                         "python -m pipeline.profiles gpu --write reports/runs/params.yaml",
                         "keep_tables .gpu-import/fingerprints/abc1234-env.json"]
    fresh = calls[4].split()[4]
    assert calls[4] == (f"capsnet report reports/runs/models reports/runs/results {fresh} "
                        "--params reports/runs/params.yaml --missing list --readme README.md "
                        "--fingerprints reports/runs/fingerprints --benchmarks reports/benchmarks.md")
    assert Path(fresh).parent.parent == tmp_path / "tmp" and not Path(fresh).parent.exists()  # removed once copied
    assert calls[5:] == ["python scripts/gpu_proof.py keep .gpu-import/checks-1/gpu_tests.key "
                         ".gpu-import/checks-1/gpu_tests.txt reports/bench"]
    assert (work / "models" / "capsnet_r1" / "seed0" / "config.json").read_text() == "newest"
    assert not (work / "models" / "capsnet_r1" / "seed9").exists()  # only in the older archive of that call
    assert (work / "models" / "baseline_cnn" / "seed0" / "config.json").read_text() == "cnn"
    assert (work / "results" / "capsnet_r1" / "seed0" / "metrics.json").exists()
    assert sorted(p.name for p in (work / "reports" / "runs" / "journal").iterdir()) == ["a.jsonl", "b.jsonl"]
    assert (work / "reports" / "runs" / "params.yaml").read_text() == "profile gpu\n"
    bench = work / "reports" / "bench" / "nvidia-h200"
    assert (bench / "capsnet_r1@bf16#1.jsonl").exists()
    assert (bench / "jobs" / "seconds.jsonl").read_text() == '{"job": 1}\n'
    assert sorted(p.name for p in (work / "reports" / "metrics").iterdir()) == ["capsnet_r1.json"]
    assert (work / "reports" / "ablation.md").read_text() == "# written\n"
    assert done.stdout.splitlines() == [
        "bench rows kept in reports/bench/nvidia-h200",
        "1 measured job(s) kept in reports/bench/nvidia-h200/jobs/seconds.jsonl",
        f"call 1 ({first}): [plan] window 420 s, plan 380 s; the session ended at 12:31:05",
        f"fingerprint pins on the GPU host's CPU ({first}): 5 passed",
        "the next window sends 3 MiB"]
    (work / "calls.log").unlink()
    rehearsal = subprocess.run(["bash", "scripts/gpu_import.sh", str(second)], cwd=work,
                               env=env | {"CAPSNET_GPU_PROFILE": "smoke"}, capture_output=True, text=True)
    assert rehearsal.returncode == 0, rehearsal.stderr
    assert "python -m pipeline.profiles smoke --write reports/runs/params.yaml" in (work / "calls.log").read_text()
    assert sorted(p.name for p in (work / ".gpu-import" / "models").iterdir()) == ["baseline_cnn"]  # staged afresh
    usage = subprocess.run(["bash", "scripts/gpu_import.sh"], cwd=work, capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ")


def test_the_import_keeps_each_measured_job_once_per_gpu_model(tmp_path):
    """gpu_import.sh adds a window's measured jobs (logs/jobs/seconds.jsonl) to reports/bench/<model>/jobs/:
    the window began from a copy of those kept, which are not added again, nor on a second import."""
    script = (REPO / "scripts" / "gpu_import.sh").read_text()
    fragment = script[script.index("if [ -s .gpu-import/logs/bench/.device ] && [ -s .gpu-import/logs/jobs"):]
    fragment = fragment[:fragment.index("\nfi\n") + 4]
    logs = tmp_path / ".gpu-import" / "logs"
    (logs / "bench").mkdir(parents=True)
    (logs / "bench" / ".device").write_text("nvidia-h200\n")
    kept = tmp_path / "reports" / "bench" / "nvidia-h200" / "jobs" / "seconds.jsonl"
    kept.parent.mkdir(parents=True)
    kept.write_text('{"a": 1}\n')
    (logs / "jobs").mkdir()
    (logs / "jobs" / "seconds.jsonl").write_text('{"a": 1}\n{"b": 2}\n{"c": 3}\n')
    for added in ("2", "0"):
        done = subprocess.run(["bash", "-c", fragment], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert done.stdout.startswith(f"{added} measured job(s) kept in reports/bench/nvidia-h200/jobs/seconds.jsonl")
    assert kept.read_text() == '{"a": 1}\n{"b": 2}\n{"c": 3}\n'


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


def test_the_bench_table_is_what_the_report_prices_seeds_with(tmp_path):
    """scripts/bench_table.py: one-seed rows in the form pipeline/report/costs.py reads (the variant's
    own row of the configuration a run trained with), stacked rows where the costs do not read them,
    and issue #36's targets marked from the best row of capsnet_r3_recon."""
    from pipeline.report import costs

    common = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-01", "commit": "abc1234", "torch": "2.11.0+cu130",
              "batch": 128, "flop_per_image_train": 1.2e9}
    kept = [{**common, "variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 1, "train_images_per_s": 80_000},
            {**common, "variant": "capsnet_r3_recon", "mode": "bf16-compile-capture", "seeds": 1,
             "train_images_per_s": 70_000, "captured": False},
            {**common, "variant": "capsnet_r3_recon", "mode": "bf16-compile", "seeds": 3, "stack": "bmm",
             "train_images_per_s": 140_000, "speedup_vs_separate": 1.75},
            {**common, "variant": "baseline_cnn", "mode": "bf16", "seeds": 1, "train_images_per_s": 30_000},
            {**common, "variant": "baseline_cnn", "mode": "bf16-capture", "seeds": 1, "train_images_per_s": 33_000,
             "captured": True}]
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(json.dumps(r) for r in kept[:2]) + "\n")
    (folder / "b.jsonl").write_text("\n".join(json.dumps(r) for r in kept[2:]) + "\ntorn")
    out = bench_table(folder)
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n" + out)
    rows = costs.bench_rows(tmp_path / "benchmarks.md")
    assert {(r.variant, r.images_per_s) for r in rows} == {("capsnet_r3_recon", 80_000), ("capsnet_r3_recon", 70_000),
                                                          ("baseline_cnn", 30_000), ("baseline_cnn", 33_000)}  # never the stacked aggregate
    device = "NVIDIA H100 80GB HBM3"
    assert costs.speed(rows, "capsnet_r3_recon", device, {"amp": True, "compile": True}).images_per_s == 80_000
    assert costs.speed(rows, "baseline_cnn", device, {"amp": True, "compile": False}).images_per_s == 30_000
    captured = {"amp": True, "compile": False, "cuda_graph": True, "compile_mode": "default"}  # as a run records it
    assert costs.speed(rows, "baseline_cnn", device, captured).images_per_s == 33_000  # its own mode's row
    assert costs.speed(rows, "capsnet_r3_recon", device, {**captured, "compile": True}) is None  # that row ran uncaptured
    assert "(ran uncaptured)" in out and "commit abc1234, torch 2.11.0+cu130" in out
    assert "| stacked bf16 + compile (model+loss) | 3 | bmm | 140,000 | – | 1.75 |" in out
    assert "- 1 seed ≥ 75,000 images/s: **reached**, 80,000 (bf16 + compile (model+loss))" in out
    assert "- 3 seeds stacked ≥ 150,000 images/s: **missed**, 140,000 (bf16 + compile (model+loss), bmm)" in out
    empty = subprocess.run([sys.executable, "scripts/bench_table.py", str(tmp_path / "none")], cwd=REPO,
                           capture_output=True, text=True)
    assert empty.returncode != 0 and "holds no bench rows" in empty.stderr and "gpu_import.sh" in empty.stderr


def test_the_bench_table_names_each_rows_levers_keeps_its_last_bench_and_marks_targets_from_its_own_rows(tmp_path):
    """scripts/bench_table.py: a heading with every device, date and batch the rows name; each mode by its
    levers (fp32 or bf16, NHWC, capture), "ran uncaptured" only for a captured mode that did not capture;
    an entry benched twice shows its last row, two stacked seed counts of one layout each theirs; the
    reference row by its name; a target only from capsnet_r3_recon's own modes, reached at equality."""
    common = {"device": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "torch": "2.11.0", "batch": 128,
              "flop_per_image_train": 1.2e9, "variant": "capsnet_r3_recon", "seeds": 1}
    rows = [{**common, "date": "2026-12-02", "mode": "reference", "train_images_per_s": 90_000,
             "speedup_vs_reference": 1.0},
            {**common, "date": "2026-12-01", "mode": "bf16-cl", "train_images_per_s": 50_000, "ms_per_step": 1.234,
             "speedup_vs_reference": 2.5},
            {**common, "date": "2026-12-01", "mode": "bf16-cl", "train_images_per_s": 75_000},  # benched again
            {**common, "date": "2026-12-01", "mode": "capture", "train_images_per_s": 40_000, "captured": True},
            {**common, "date": "2026-12-01", "mode": "bf16", "train_images_per_s": 20_000},
            {**common, "date": "2026-12-01", "mode": "bf16", "seeds": 2, "stack": "bmm", "train_images_per_s": 60_000},
            {**common, "date": "2026-12-01", "mode": "bf16", "seeds": 3, "stack": "bmm", "train_images_per_s": 61_000},
            {**common, "date": "2026-12-01", "mode": "bf16", "seeds": 2, "train_images_per_s": 62_000},  # no layout
            {**common, "date": "2026-12-01", "variant": "baseline_cnn", "mode": "bf16", "train_images_per_s": 99_000,
             "batch": 100}]
    folder = tmp_path / "nvidia-h100-80gb-hbm3"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = bench_table(folder)
    lines = out.splitlines()
    assert lines[0] == "## GPU: one NVIDIA H100 80GB HBM3 (device tool, 2026-12-01, 2026-12-02)"
    assert "(gpu profile, batch 100, 128)" in out and "### capsnet_r3_recon (1.20 GFLOP per training image)" in lines
    assert "| reference (eager fp32, DataLoader) | 90,000 | – | – | – | – | – | 1.00 |" in lines
    assert "| capsnet-repro bf16-cl: bf16, NHWC convolutions | 75,000 | – | – | – | – | – | – |" in lines
    assert "| 50,000 |" not in out and "(ran uncaptured)" not in out
    captured = "capsnet-repro capture: fp32, the whole step as one CUDA graph"
    assert f"| {captured} | 40,000 | – | – | – | – | – | – |" in lines
    assert [line.split(" | ")[1:4] for line in lines if line.startswith("| stacked bf16")] == [
        ["2", "bmm", "60,000"], ["3", "bmm", "61,000"], ["2", "fused", "62,000"]]
    assert "- 1 seed ≥ 75,000 images/s: **reached**, 75,000 (bf16-cl: bf16, NHWC convolutions)" in lines
    assert "- 3 seeds stacked ≥ 150,000 images/s: **missed**, 61,000 (bf16 autocast, bmm)" in lines
    one = [{**common, "date": "2026-12-01", "mode": "bf16-cl", "train_images_per_s": 70_000, "ms_per_step": 1.234,
            "speedup_vs_reference": 2.5}]
    (folder / "a.jsonl").write_text(json.dumps(one[0]) + "\n")
    out = bench_table(folder).splitlines()
    assert "| capsnet-repro bf16-cl: bf16, NHWC convolutions | 70,000 | 1.23 | – | – | – | – | 2.50 |" in out
    assert "- 3 seeds stacked ≥ 150,000 images/s: not measured" in out


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


STUB_FINGERPRINT = """#!%s
# python3 on a GPU window with `capsnet fingerprint` faked: its table gives capsnet_r3_recon STUB_FP; and
# scripts/fingerprint_at.py COMMIT OUT --variants V...: a table of COMMIT here giving each V STUB_AT
# (none: it fails), each call in at.log
import json, os, sys
args = sys.argv[1:]
here = os.environ.get("STUB_ENV", "torch 2.11.0+cu130, CPU AVX2 capped")
if args[:3] == ["-m", "pipeline.cli", "fingerprint"]:
    json.dump({"commit": os.environ["CAPSNET_GIT_COMMIT"], "environment": here,
               "fingerprints": {"capsnet_r3_recon": os.environ["STUB_FP"]}}, open(args[3], "w"))
    sys.exit(0)
if args[:1] == ["scripts/fingerprint_at.py"]:
    print(" ".join(args[1:]), file=open("at.log", "a"))
    if not os.environ.get("STUB_AT"):
        sys.exit("fingerprint_at: no worktree")
    variants = args[args.index("--variants") + 1:]
    json.dump({"commit": args[1], "environment": here, "fingerprints": {v: os.environ["STUB_AT"] for v in variants}},
              open(args[2], "w"))
    sys.exit(0)
os.execv(sys.executable, [sys.executable, *args])
"""


def plan_until_the_queue(tmp_path: Path) -> str:
    """scripts/gpu_plan.sh from its fingerprint table to the queue's answer, run in ``tmp_path`` (the
    package and scripts linked there, the gpu profile's params written), with STUB_FINGERPRINT as python3."""
    plan = (REPO / "scripts" / "gpu_plan.sh").read_text()
    fragment = plan[plan.index("mkdir -p logs fingerprints"):]
    fragment = fragment[:fragment.index("\n", fragment.index("ALONGSIDE=(--params")) + 1]
    for name in ("scripts", "pipeline", "params.yaml"):
        (tmp_path / name).symlink_to(REPO / name)
    write_profile(tmp_path / "params.gpu.yaml")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python3").write_text(STUB_FINGERPRINT % sys.executable)
    (tmp_path / "bin" / "python3").chmod(0o755)
    return "set -euo pipefail\nPLAN_START=$(date +%s)\n" + fragment + 'echo "$TRAIN"; echo "window: $KIND ${ALONGSIDE[*]}"'


def publish_seed0(tmp_path: Path, fingerprint: str, environment: str, commit: str | None = None,
                  variant: str = "capsnet_r3_recon", seed: int = 0, params: str = "params.gpu.yaml") -> None:
    """A published ``variant`` seed (0) under the protocol of ``params`` (the gpu profile's), as its config.json records it."""
    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    cfg = dataclasses.asdict(run_config(load_params(tmp_path / params), variant, seed))
    folder = tmp_path / "reports" / "runs" / "models" / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "config": {k: v for k, v in cfg.items() if v is not None}, "params": {"device": "cuda"},
        "training_fingerprint": fingerprint,
        "environment": {"fingerprint_environment": environment} | ({"git_commit": commit} if commit else {})}))


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


STUB_GPU = """#!%s
# python3 on a GPU window with its CUDA tests and training faked: `-m pytest` prints STUB_TESTS (after a
# moment: the first job trains meanwhile); `-m pipeline.cli train` records the speed settings of the
# --params it was given in each seed's config.json, as a run does; evaluate writes metrics; the fingerprint's
# probe and trace beside the tests do nothing (about 45 s of capped processes on 2 cores; their own tests:
# tests/test_fingerprint.py, tests/test_fingerprint_trace.py)
import json, os, sys, time
import yaml
args = sys.argv[1:]
if args[:2] == ["-m", "pytest"]:
    time.sleep(3)
    print(os.environ["STUB_TESTS"])
    sys.exit(0)
if args[:1] in (["scripts/fingerprint_probe.py"], ["scripts/fingerprint_trace.py"]):
    sys.exit(0)
if args[:2] == ["-m", "pipeline.cli"] and args[2] in ("train", "evaluate"):
    params = args[args.index("--params") + 1] if "--params" in args else ""
    with open("calls.log", "a") as log:
        print(" ".join([*args[2:5], os.path.basename(params)]).strip(), file=log)
    if args[2] == "evaluate":
        os.makedirs(args[5], exist_ok=True)
        open(os.path.join(args[5], "metrics.json"), "w").write("{}")
        sys.exit(0)
    raw = yaml.safe_load(open(params))
    train, model = raw["train"], raw["variants"][args[3]]["model"]
    cfg = {"model": model, "amp": train["amp"], "compile": train["compile"] and (model == "capsnet" or train["compile_cnns"]),
           "compile_mode": train["compile_mode"], "channels_last": train["channels_last"], "cuda_graph": train["cuda_graph"]}
    for s in args[4].split(","):
        os.makedirs(f"models/{args[3]}/seed{s}", exist_ok=True)
        json.dump({"config": cfg}, open(f"models/{args[3]}/seed{s}/config.json", "w"))
    sys.exit(0)
if args[:2] == ["-m", "pipeline.cli"]:
    sys.exit(0)  # fingerprint
os.execv(sys.executable, [sys.executable, *args])
"""


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


def test_seeds_side_by_side_on_streams_need_their_own_cuda_test(gpu_params):
    """The streams layout (stacked seeds each on a CUDA stream of its own) is picked only where its own
    capture test passed beside its mode's (gpu_levers.LAYOUT_PROOFS: the captured step in streams against
    the eager loop, at the mode's precision, compiled or eager); a run trained in it, seeds stacked, is
    checked against that test; one seed alone in it, or the other layouts, need no more than the mode's."""
    capture = "test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
    mode_proofs = {f"{capture}[capsnet_r3_recon-bf16-compiled-fused-1seed]": "PASSED",
                   "test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[capsnet_r3_recon]": "PASSED"}
    streams_proof = {f"{capture}[capsnet_r3_recon-bf16-compiled-streams-3seed]": "PASSED"}
    eager_streams = {f"{capture}[capsnet_r3_recon-bf16-eager-streams-3seed]": "PASSED"}  # another mode's
    stacked = [{"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 3, "stack": stack, "captured": True,
                "train_images_per_s": rate} for stack, rate in (("streams", 140_000.0), ("fused", 31_000.0))]
    one = {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "captured": True, "train_images_per_s": 66_000.0}
    train = gpu_levers.variant_train(gpu_params, "capsnet_r3_recon")
    picked, line = gpu_levers.choose([*stacked, one], {**mode_proofs, **streams_proof}, train, "capsnet")
    assert picked["stack_layout"] == "streams" and "140,000 images/s" in line, line
    picked, line = gpu_levers.choose([*stacked, one], {**mode_proofs, **eager_streams}, train, "capsnet")
    assert picked["stack_layout"] == "fused" and "1 seed" in line, line  # streams unproven: one seed at 66k beats 31k
    assert gpu_levers.proven(CAPS, "capsnet_r3_recon", mode_proofs, "loop") == (True, "")
    assert gpu_levers.proven(CAPS, "capsnet_r3_recon", mode_proofs, "streams")[1] == \
        f"{capture}[capsnet_r3_recon-bf16-compiled-streams… did not run"

    def run(stack_layout, seeds):
        return {"config": {"model": "capsnet", "amp": True, "compile": True, "compile_mode": "default",
                           "channels_last": False, "cuda_graph": True, "stack_layout": stack_layout},
                "stacked_seeds": list(range(seeds))}

    assert "streams" in gpu_levers.run_unproven(run("streams", 3), mode_proofs)
    assert gpu_levers.run_unproven(run("streams", 3), {**mode_proofs, **streams_proof}) == ""
    assert gpu_levers.run_unproven(run("streams", 1), mode_proofs) == ""  # one seed: the loop of one
    assert gpu_levers.run_unproven(run("fused", 3), mode_proofs) == ""


def test_the_mnist_a_window_carries_is_copied_whole_or_not_at_all_saying_why(tmp_path):
    """scripts/gpu_fetch_mnist.sh: the mirror's four .gz files into .gpu/mnist (the carried folder), then
    what a call would send; a mirror missing any of them is one line naming it and the variable to set,
    and nothing copied."""
    (tmp_path / "scripts").mkdir()
    for name in ("gpu_fetch_mnist.sh", "gpu_travel.py"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("/.gpu/\n")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    names = [f"{s}-{k}-idx{d}-ubyte.gz" for s in ("train", "t10k") for k, d in (("images", 3), ("labels", 1))]
    for name in names[:3]:
        (mirror / name).write_bytes(b"gz")

    def fetch():
        return subprocess.run(["bash", "scripts/gpu_fetch_mnist.sh"], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "CAPSNET_MNIST_MIRROR": str(mirror)})

    short = fetch()
    assert short.returncode == 1 and not (tmp_path / ".gpu").exists(), short.stdout + short.stderr
    assert short.stderr == f"{mirror} holds 3 of MNIST's four *-ubyte.gz files: set CAPSNET_MNIST_MIRROR to a folder that holds them all\n"
    (mirror / names[3]).write_bytes(b"gz")
    done = fetch()
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / ".gpu" / "mnist").iterdir()) == sorted(names)
    assert "MiB" in done.stdout  # gpu_travel.py's account of what a call sends


def test_what_a_gpu_call_sends_is_measured_against_the_device_tools_limit(tmp_path):
    """scripts/gpu_travel.py (gpu_fetch_mnist.sh before a window, gpu_import.sh after one) sums what
    the device tool sends: tracked and untracked-not-ignored files and the carried .gpu, not what git
    ignores otherwise; near the limit it warns, over it it fails naming the largest folders."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    def write(path, mib):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x" * int(mib * (1 << 20)))

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/.gpu/\n/models/\n")
    write("reports/runs/results/a/seed0/predictions.safetensors", 2)  # tracked
    write("reports/runs/earlier/r/results/a/seed0/predictions.safetensors", 1.5)
    git("add", ".")
    write("notes.txt", 0.5)  # untracked, not ignored: it travels
    write(".gpu/mnist/train-images-idx3-ubyte.gz", 1)  # ignored, carried
    write("models/a/seed0/checkpoint.pt", 50)  # ignored, not carried: stays here

    def travel(*args):
        return subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_travel.py"), *args], cwd=tmp_path,
                              capture_output=True, text=True)

    listed = travel("--list").stdout.split("\0")
    assert sorted(filter(None, listed)) == [".gitignore", ".gpu/mnist/train-images-idx3-ubyte.gz", "notes.txt",
                                            "reports/runs/earlier/r/results/a/seed0/predictions.safetensors",
                                            "reports/runs/results/a/seed0/predictions.safetensors"]  # what the rehearsal sends
    fits = travel("--limit-mib", "10", "--margin-mib", "1")
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines() == ["travels: 5.0 MiB of 10 MiB (tracked 3.5, untracked 0.5, carried .gpu 1.0)"]
    near = travel("--limit-mib", "5.5", "--margin-mib", "1")
    assert near.returncode == 0 and "within 1 MiB of the limit" in near.stdout
    over = travel("--limit-mib", "4")
    assert over.returncode == 1 and len(over.stderr.splitlines()) == 1
    assert "5.0 MiB, over the device tool's 4 MiB" in over.stderr
    assert "largest, MiB: reports/runs/results 2.0, reports/runs/earlier 1.5, .gpu/mnist 1.0, . 0.5)" in over.stderr
    bare = tmp_path / "bare"
    bare.mkdir()
    elsewhere = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_travel.py")], cwd=bare, capture_output=True,
                               text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert elsewhere.returncode == 2 and len(elsewhere.stderr.splitlines()) == 1 and "not a git checkout" in elsewhere.stderr


def test_the_import_unpacks_a_window_where_no_gpu_call_carries_it():
    """gpu_import.sh unpacks a window's archives outside the carried .gpu, in a folder git ignores: a
    staging copy inside .gpu (the 2026-11-27 import left 6 MB there) would travel with every later call."""
    import re

    staged = re.search(r"rm -rf (\S+) && mkdir -p \1\n", (REPO / "scripts" / "gpu_import.sh").read_text()).group(1)
    assert not Path(staged).is_relative_to(".gpu")
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{staged}/results/x"], cwd=REPO)
    assert ignored.returncode == 0, f"{staged} is not ignored by git: its files would travel untracked"


@pytest.mark.parametrize("warm", [False, True])
def test_the_window_is_what_left_loses_to_the_start_as_measured_and_allowed_after(tmp_path, warm):
    """scripts/gpu_plan.sh's window: LEFT (the device time read before the call) less the seconds since
    it was read (CAPSNET_GPU_LEFT_AT: the machine's start and the transfer in, measured) and an allowance
    for what follows the call; without a believable reading, the whole allowance (165 s cold, 75 s warm);
    under 60 s, give the machine back."""
    plan = (REPO / "scripts" / "gpu_plan.sh").read_text()
    fragment = plan[plan.index("TESTS=() WINDOW=()"):]
    fragment = fragment[:fragment.index("\nfi\n") + 4]
    if warm:
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "gpu_tests.done").touch()
    start = 1_795_764_155

    def window(**env):
        script = f"set -euo pipefail\nPLAN_START={start}\n" + fragment.replace(
            "SPENT=$(( $(date +%s) - PLAN_START ))", "SPENT=7") + 'echo "${WINDOW[@]}"'
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True,
                              env={k: v for k, v in os.environ.items() if not k.startswith("CAPSNET_GPU_")} | env)
        return done.stdout.strip()

    after, allowance = (30, 75) if warm else (60, 165)
    assert window() == ""  # no LEFT: the call knows its own deadline only
    assert window(CAPSNET_GPU_LEFT="900") == f"--window {900 - allowance - 7}"
    assert window(CAPSNET_GPU_LEFT="900", CAPSNET_GPU_LEFT_AT=str(start - 40)) == f"--window {900 - 40 - after - 7}"
    for unbelievable in (str(start + 5), str(start - 601), "07:22", ""):  # a clock ahead, a reading too old, not seconds
        assert window(CAPSNET_GPU_LEFT="900", CAPSNET_GPU_LEFT_AT=unbelievable) == f"--window {900 - allowance - 7}"
    assert "give the machine back" in window(CAPSNET_GPU_LEFT=str(allowance + 7 + 59))


def test_the_next_calls_command_has_its_numbers_and_a_tree_that_is_head(tmp_path):
    """scripts/gpu_command.sh LEFT prints the call's command with LEFT, now and HEAD typed in, and
    refuses in one line a tree that differs from HEAD (the runs record HEAD) or has no MNIST in .gpu."""
    import time

    tree = {"cwd": tmp_path, "capture_output": True, "text": True}
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "gpu_command.sh", tmp_path / "scripts")
    (tmp_path / ".gitignore").write_text("/.gpu/\n")
    subprocess.run(["git", "init", "-q"], check=True, **tree)
    subprocess.run(["git", "add", "."], check=True, **tree)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"], check=True, **tree)
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=True, **tree).stdout.strip()

    def command(*args):
        return subprocess.run(["bash", "scripts/gpu_command.sh", *args], **tree)

    assert command().returncode == 2 and command("15 min").returncode == 2
    missing = command("900")
    assert missing.returncode == 1 and "bash scripts/gpu_fetch_mnist.sh" in missing.stderr and not missing.stdout
    (tmp_path / ".gpu" / "mnist").mkdir(parents=True)
    (tmp_path / ".gpu" / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"")
    done = command("900")
    assert done.returncode == 0, done.stderr
    left, at, commit, *rest = done.stdout.split()
    assert (left, commit, rest) == ("CAPSNET_GPU_LEFT=900", f"CAPSNET_GIT_COMMIT={head}", ["bash", "scripts/gpu_plan.sh"])
    assert abs(int(at.removeprefix("CAPSNET_GPU_LEFT_AT=")) - time.time()) < 5
    for change in ("scripts/gpu_command.sh", "new.py"):  # a tracked file edited; an untracked one that would travel
        with open(tmp_path / change, "a") as f:
            f.write("\n")
        dirty = command("900")
        assert dirty.returncode == 1 and len(dirty.stderr.splitlines()) == 1 and "commit it first" in dirty.stderr
        assert change in dirty.stderr and not dirty.stdout
        subprocess.run(["git", "checkout", "-q", "--", "."], **tree)
        (tmp_path / "new.py").unlink(missing_ok=True)


def test_what_travels_leaves_out_deleted_files_and_links_and_counts_a_carried_file(tmp_path):
    """scripts/gpu_travel.py: a tracked file deleted from the working tree does not travel (the device tool
    sends the tree), nor does a link (it leaves links out); a carried path may be a single file."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / ".gitignore").write_text("/weights.pt\n")
    (tmp_path / "gone.txt").write_text("x")
    (tmp_path / "kept.txt").write_text("y" * 10)
    (tmp_path / "link.txt").symlink_to(tmp_path / "kept.txt")
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "weights.pt").write_bytes(b"w" * 5)
    listed = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_travel.py"), "--list", "--carry",
                             "weights.pt"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert sorted(filter(None, listed.split("\0"))) == [".gitignore", "kept.txt", "weights.pt"]


def test_a_job_is_priced_by_rows_of_its_own_stack_layout_that_measured_a_rate(gpu_params):
    """trained_rows: a stacked row of another layout than the params stack in, or one without images/s (a
    bench that measured nothing), prices nothing; a one-seed row prices whatever its layout. job_seconds:
    with no row of that many seeds, the nearest stacked count's."""
    three = {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 3, "stack": "fused", "train_images_per_s": 60_000}
    candidates = [three,
                  {**three, "stack": "bmm", "train_images_per_s": 90_000},  # another layout
                  {**three, "seeds": 6, "train_images_per_s": 120_000},
                  {**three, "seeds": 1, "train_images_per_s": 0},  # measured nothing
                  {**three, "seeds": 1, "stack": "bmm", "train_images_per_s": 24_000}]  # one seed: any layout
    benched, priced = gpu_queue.trained_rows(gpu_params, "capsnet_r1", candidates)
    assert gpu_params["train"]["stack_layout"] == "fused" and benched == "capsnet_r3_recon"
    assert priced == [candidates[0], candidates[2], candidates[4]]
    _, source = gpu_queue.job_seconds(gpu_params, "capsnet_r1", 2, candidates, parallel=1)
    assert f"capsnet_r3_recon {CAPS} ×3: 60,000 images/s" in source  # 3 stacked is nearer 2 than 6


def test_the_queue_skips_variants_its_params_lack_and_a_table_lacking_one_vouches_for_none(gpu_params, tmp_path):
    """A params file without one of GROUPS' variants queues the others (none of its seeds, no crash); a
    fingerprint table that has no entry for a variant says a record of it with a fingerprint was not trained
    by that code, whatever that fingerprint is known as."""
    lacking = {**gpu_params, "variants": {v: s for v, s in gpu_params["variants"].items() if v != "capsnet_r1"}}
    items = gpu_queue.queue(tmp_path / "runs", lacking)
    assert items and not any(i.startswith("capsnet_r1:") for i in items)
    table = {"commit": "c" * 40, "environment": "env", "fingerprints": {"capsnet_r3": "a" * 16}}
    here, elsewhere = ({"training_fingerprint": "a" * 16, "environment": {"fingerprint_environment": env}}
                       for env in ("env", "another env"))
    assert gpu_queue.same_training(here, "capsnet_r3", table)
    assert not gpu_queue.same_training(here, "capsnet_r1", table)
    # a fingerprint this environment does not know, of a variant the table lacks
    assert not gpu_queue.same_training(elsewhere, "capsnet_r1", table)


def test_the_queues_command_line_records_jobs_one_a_line_and_says_what_each_option_needs(gpu_params, tmp_path):
    """--record appends a measured job (each of a window's jobs kept), at one process at least, to its one
    --jobs file; --stack lists a variant's seeds as one item (gpu_plan.sh's queue where gpu_window.py fails);
    --bridges needs --fingerprints and a missing params file names the command that writes it, each in one
    line."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(gpu_params))

    def queue(*args):
        return subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(tmp_path / "params.yaml"),
                               *args], cwd=REPO, capture_output=True, text=True)

    jobs = tmp_path / "jobs" / "measured.jsonl"
    for item, seconds in (("capsnet_r1:0", "60"), ("capsnet_r3:0,1", "90")):
        assert queue("--record", item, "--seconds", seconds, "--parallel", "0", "--jobs", str(jobs)).returncode == 0
    recorded = [json.loads(line) for line in jobs.read_text().splitlines()]
    assert [(r["variant"], r["seeds"], r["seconds"], r["parallel"]) for r in recorded] == [("capsnet_r1", 1, 60.0, 1),
                                                                                          ("capsnet_r3", 2, 90.0, 1)]
    two = queue("--record", "capsnet_r1:1", "--seconds", "60", "--jobs", str(jobs), "--jobs", str(tmp_path / "b"))
    assert two.returncode == 1 and two.stderr == "--record needs one --jobs FILE to append to\n"
    assert queue("--runs", str(tmp_path / "none"), "--stack").stdout.split()[0] == "capsnet_r3_recon:0,1,2"
    bridges = queue("--bridges")
    assert bridges.returncode == 1 and bridges.stderr.startswith("--bridges needs --fingerprints")
    absent = tmp_path / "absent.yaml"
    missing = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(absent)], cwd=REPO,
                             capture_output=True, text=True)
    writes = f"python -m pipeline.profiles gpu --write {absent}"
    assert missing.returncode == 1 and missing.stderr == f"{absent} does not exist: write it with `{writes}`\n"


def test_without_the_flop_table_an_image_costs_its_area(monkeypatch, tmp_path):
    """reports/bench/flop_per_image.json absent (a bare copy without it): the FLOP table is empty, not an error."""
    monkeypatch.setattr(gpu_queue, "FLOPS", tmp_path / "absent.json")
    gpu_queue.flop_table.cache_clear()
    try:
        assert gpu_queue.flop_table() == {}
        cost, _ = gpu_queue.image_cost("capsnet_affnist", "capsnet_r3_recon", "affnist")
        assert cost == pytest.approx((40 / 28) ** 2)
    finally:
        gpu_queue.flop_table.cache_clear()
