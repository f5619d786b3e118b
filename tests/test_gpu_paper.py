"""The paper protocol in a 15-minute GPU window (issue #36 item 5): a seed of 640 epochs is about a whole
window's training, so it trains alone, in a window whose CUDA tests an earlier window already ran at the
same code and GPU (their log kept under its key, scripts/gpu_proof.py), once the gpu profile's queue and
the precision check are done (scripts/gpu_window.py), priced with all it costs (scripts/gpu_queue.py --fit). The
CUDA tests' proof itself: tests/test_gpu_proof.py."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, script, write_profile
from gpu_device import (CAPS, FINISHED_LOG, STUB_GPU, device_tree, plan_until_the_queue, publish_seed0, python3_on_path,
                        session_log)

epoch_overhead, gpu_levers, gpu_proof, gpu_queue, gpu_window = (
    script(name) for name in ("epoch_overhead", "gpu_levers", "gpu_proof", "gpu_queue", "gpu_window"))


def precision_effects(path: Path, ci: tuple[float, float] | None, seeds: int = 3) -> Path:
    """reports/effects.csv with the precision check's row (capsnet_r3_recon against its fp32 twin) and another effect."""
    rows = [{"a": "capsnet_r3_recon", "b": "capsnet_r1_recon", "our_delta": 0.1, "ci_low": 0.05, "ci_high": 0.2, "n_seeds": 3}]
    if ci is not None:
        rows.append({"a": "capsnet_r3_recon", "b": "capsnet_r3_recon_fp32", "our_delta": sum(ci) / 2, "ci_low": ci[0],
                     "ci_high": ci[1], "n_seeds": seeds})
    import pandas as pd

    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def publish_before_paper(tmp_path: Path, but: tuple[str, int] | None = None) -> None:
    """Every seed the gpu profile's queue lists before the paper protocol, published (``but`` one)."""
    for group in gpu_queue.GROUPS[:gpu_window.BEFORE_PAPER]:
        for v in group:
            for seed in gpu_queue.SEEDS:
                if (v, seed) != but:
                    publish_seed0(tmp_path, "a" * 16, "env", variant=v, seed=seed)


def test_a_window_trains_the_paper_protocols_next_seed_alone_once_the_short_queue_and_the_precision_check_allow(tmp_path):
    """scripts/gpu_queue.py window (#36 item 5): the gpu profile's Table 1, MultiMNIST and precision check come
    first; then, where the published precision check allows bf16 (3 seeds a side, its interval holding 0),
    the paper protocol's capsnet_r3_recon_official and capsnet_r3_recon, one seed a window, each variant's
    seeds in turn; then §5.2; then the paper protocol's other variants. In fp32 a paper seed never trains."""
    write_profile(tmp_path / "params.gpu.yaml")
    write_profile(tmp_path / "params.paper-gpu.yaml", "paper-gpu", "--set", "train.amp=true")
    gpu, paper = (yaml.safe_load((tmp_path / n).read_text()) for n in ("params.gpu.yaml", "params.paper-gpu.yaml"))
    runs, effects = tmp_path / "reports" / "runs", tmp_path / "effects.csv"
    publish_before_paper(tmp_path, but=("multimnist_baseline", 2))
    within = gpu_window.paper_precision(precision_effects(effects, (-0.1, 0.2)), gpu)
    assert within[0] and "within the seed noise" in within[1]
    assert gpu_window.window(runs, gpu, paper, within) == ("gpu", ["multimnist_baseline:2", "capsnet_affnist:0,1,2",
                                                                 "cnn_affnist:0,1,2"], [])
    publish_seed0(tmp_path, "a" * 16, "env", variant="multimnist_baseline", seed=2)
    for ci, seeds, said in ((None, 3, "has not decided"), ((0.05, 0.3), 3, "beyond the seed noise"),
                            ((-0.1, 0.2), 2, "has not decided")):
        decision = gpu_window.paper_precision(precision_effects(effects, ci, seeds), gpu)
        assert not decision[0] and said in decision[1]
        assert gpu_window.window(runs, gpu, paper, decision) == ("gpu", ["capsnet_affnist:0,1,2", "cnn_affnist:0,1,2"],
                                                               [decision[1]])
    kind, items, why = gpu_window.window(runs, gpu, paper, within)
    assert (kind, items) == ("paper", ["capsnet_r3_recon_official:0"]) and "5 more after it" in why[1]
    kind, items, why = gpu_window.window(runs, gpu, paper, within, tests_run=True)  # the tests would share the GPU
    assert (kind, items) == ("gpu", ["capsnet_affnist:0,1,2", "cnn_affnist:0,1,2"]) and "CUDA tests run" in why[0]
    # priced (the window's seconds known): a seed that does not fit leaves the window to what comes after it
    kind, items, why = gpu_window.window(runs, gpu, paper, within, price=lambda item: (False, f"{item}: not started"))
    assert (kind, items) == ("gpu", ["capsnet_affnist:0,1,2", "cnn_affnist:0,1,2"])
    assert why == ["capsnet_r3_recon_official:0: not started: this window trains what comes after the paper protocol"]
    kind, items, why = gpu_window.window(runs, gpu, paper, within, price=lambda item: (True, f"{item}: 700 s estimated"))
    assert (kind, items) == ("paper", ["capsnet_r3_recon_official:0"]) and why[2] == "capsnet_r3_recon_official:0: 700 s estimated"

    def paper_run(variant: str, seed: int) -> None:  # published as the import does: the gpu profile's record set aside
        aside = runs / "earlier" / f"{variant}-{seed}" / "models" / variant
        aside.mkdir(parents=True)
        (runs / "models" / variant / f"seed{seed}").rename(aside / f"seed{seed}")
        publish_seed0(tmp_path, "a" * 16, "env", variant=variant, seed=seed, params="params.paper-gpu.yaml")

    paper_run("capsnet_r3_recon_official", 0)  # its next seed before the next variant's first: three give a row its interval
    assert gpu_window.window(runs, gpu, paper, within)[:2] == ("paper", ["capsnet_r3_recon_official:1"])
    paper_run("capsnet_r3_recon_official", 2)
    assert gpu_window.window(runs, gpu, paper, within)[:2] == ("paper", ["capsnet_r3_recon_official:1"])  # seed 1 left
    paper_run("capsnet_r3_recon_official", 1)
    assert gpu_window.window(runs, gpu, paper, within)[:2] == ("paper", ["capsnet_r3_recon:0"])
    for seed in gpu_queue.SEEDS:
        paper_run("capsnet_r3_recon", seed)
    assert gpu_window.window(runs, gpu, paper, within) == ("gpu", ["capsnet_affnist:0,1,2", "cnn_affnist:0,1,2"], [])
    for v in gpu_queue.GROUPS[-1]:
        for seed in gpu_queue.SEEDS:
            publish_seed0(tmp_path, "a" * 16, "env", variant=v, seed=seed)
    assert gpu_window.window(runs, gpu, paper, within)[:2] == ("paper", ["capsnet_r1_recon_official:0"])
    assert gpu_window.window(runs, gpu, paper, gpu_window.paper_precision(tmp_path / "none.csv", gpu))[:2] == ("gpu", [])
    for v in gpu_window.PAPER_REST:
        for seed in gpu_queue.SEEDS:
            paper_run(v, seed)
    assert gpu_window.window(runs, gpu, paper, within) == ("gpu", [], ["nothing left to train: every queued seed is published"])


def test_the_plan_gives_a_paper_window_its_own_params_and_the_gpu_to_one_job(tmp_path):
    """scripts/gpu_plan.sh: the paper protocol's params (paper-gpu, captured, in bf16 only where the published
    precision check allows) are written every call; where the queue's next item is a paper seed and an earlier
    window ran the CUDA tests at this code on this GPU (their kept log: none run beside it), the session trains
    it with them, one job at a time; every call of a warm machine plans the same window."""
    from pipeline.training.bench import device_name, device_slug, resolve_device

    script = plan_until_the_queue(tmp_path)
    (tmp_path / "tests").symlink_to(REPO / "tests")  # what the CUDA tests' key hashes
    publish_before_paper(tmp_path)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CAPSNET_GIT_COMMIT": "",
           "PYTHONPATH": str(REPO)}
    (tmp_path / "reports").mkdir(exist_ok=True)
    key = json.loads(subprocess.run([sys.executable, "scripts/gpu_proof.py", "key"], cwd=tmp_path, capture_output=True,
                                    text=True, check=True).stdout)
    kept = tmp_path / "reports" / "bench" / device_slug(device_name(resolve_device("auto"))) / "cuda-tests"
    affnist, paper = ["capsnet_affnist:0,1,2", "cnn_affnist:0,1,2"], ["capsnet_r3_recon_official:0"]
    for ci, proof, (kind, items, said) in (
            (None, True, ("gpu --parallel 2", affnist, "has not decided")),
            ((-0.1, 0.2), False, ("gpu --parallel 2", affnist, "the CUDA tests run this window")),
            ((-0.1, 0.2), True, ("paper --params params.paper-gpu.yaml --parallel 1", paper, "alone this window")),
            ("unreadable", True, ("gpu --parallel 2", affnist, "KeyError"))):  # the choice fails: the gpu queue, fp32
        shutil.rmtree(kept, ignore_errors=True)
        shutil.rmtree(tmp_path / "logs", ignore_errors=True)  # a fresh machine
        if proof:
            gpu_proof.keep(key, FINISHED_LOG, kept)
        if ci == "unreadable":
            (tmp_path / "reports" / "effects.csv").write_text("no such columns\n1\n")
        else:
            precision_effects(tmp_path / "reports" / "effects.csv", ci)
        for call in (1, 2):  # a warm machine's second call plans the same window, though the proof were gone
            done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            train, window_line = done.stdout.splitlines()[-2:]
            assert window_line == f"window: {kind}" and train.split() == items, done.stdout
            assert said in done.stderr, done.stderr
            # the kept log's folder names this GPU's model for gpu_session.sh (logs/bench/.device): no torch again
            assert (tmp_path / "logs" / "bench" / ".device").read_text().strip() == kept.parent.name if proof else \
                not (tmp_path / "logs" / "bench" / ".device").exists()
            shutil.rmtree(kept, ignore_errors=True)
        written = yaml.safe_load((tmp_path / "params.paper-gpu.yaml").read_text())
        assert (written["base"]["profile"], written["train"]["epochs"], written["train"]["cuda_graph"]) == ("paper-gpu", 640, True)
        assert written["train"]["amp"] is (ci not in (None, "unreadable"))
    # the window's seconds known (LEFT, read now): the seed is priced at this GPU's rows as its job will be, and a
    # window too short for it trains what comes after the paper protocol
    precision_effects(tmp_path / "reports" / "effects.csv", (-0.1, 0.2))
    (kept.parent / "caps.jsonl").write_text(json.dumps(next(
        r for r in gpu_levers.bench_rows(REPO / "reports" / "bench" / "nvidia-h200") if r["mode"] == CAPS and r.get("seeds", 1) == 1)))
    for left, (kind, items, said) in ((900, ("paper --params params.paper-gpu.yaml --parallel 1", paper, "s estimated of")),
                                      (700, ("gpu --parallel 2", affnist, "this window trains what comes after"))):
        shutil.rmtree(tmp_path / "logs", ignore_errors=True)
        gpu_proof.keep(key, FINISHED_LOG, kept)
        done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                              env=env | {"CAPSNET_GPU_LEFT": str(left), "CAPSNET_GPU_LEFT_AT": str(int(time.time()))})
        assert done.returncode == 0, done.stderr
        train, window_line = done.stdout.splitlines()[-2:]
        assert window_line == f"window: {kind}" and train.split() == items and said in done.stderr, done.stdout + done.stderr
        # and its account, first in the call's session.log: LEFT, when it was read, the plan's seconds, the choice
        account = (tmp_path / "gpu_out" / "session.log").read_text().splitlines()[-1]
        assert account.startswith(f"[plan] LEFT {left} s, read ") and " s before this plan; the plan took " in account
        assert account.endswith(f"{kind.split()[0]} {' '.join(items)}") and " s of window, " in account, account
    # a paper job this window measured (logs/jobs/, the machine's own) prices the seed too: at 2,000 s it does not fit
    shutil.rmtree(tmp_path / "logs")
    gpu_proof.keep(key, FINISHED_LOG, kept)
    (tmp_path / "logs" / "jobs").mkdir(parents=True)
    paper_params = yaml.safe_load((tmp_path / "params.paper-gpu.yaml").read_text())
    (tmp_path / "logs" / "jobs" / "seconds.jsonl").write_text(
        json.dumps(gpu_queue.job_row(paper_params, "capsnet_r3_recon_official", 1, 2000.0, 1)) + "\n")
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env=env | {"CAPSNET_GPU_LEFT": "900", "CAPSNET_GPU_LEFT_AT": str(int(time.time()))})
    assert done.returncode == 0 and done.stdout.splitlines()[-2].split() == affnist, done.stdout + done.stderr
    assert "measured: 2000 s" in done.stderr, done.stderr


def test_a_paper_window_trains_its_seed_with_the_paper_protocols_params(tmp_path):
    """gpu_session.sh --params (gpu_plan.sh's paper window): every step reads those params as params.gpu.yaml, and
    the paper seed starts only where its estimate fits the window (not the call, which it outlasts: it trains on
    through the next, tests/test_gpu_calls.py)."""
    work = device_tree(tmp_path)
    subprocess.run([sys.executable, "-m", "pipeline.profiles", "paper-gpu", "--set", "train.amp=true",
                    "--write", "params.paper-gpu.yaml"], check=True, cwd=work)
    paper = yaml.safe_load((work / "params.paper-gpu.yaml").read_text())
    row = {"variant": "capsnet_r3_recon", "mode": CAPS, "seeds": 1, "captured": True, "train_images_per_s": 50_000.0}
    (work / "logs" / "bench").mkdir(parents=True)
    (work / "logs" / "bench" / "caps.jsonl").write_text(json.dumps(row) + "\n")
    alone, _ = gpu_queue.job_seconds(paper, "capsnet_r3_recon_official", 1, [row], parallel=1)
    assert alone > 120  # it outlasts the call
    env = python3_on_path(tmp_path, STUB_GPU % sys.executable, CAPSNET_GIT_COMMIT="")
    for window, trained in ((round(alone - 1), False), (round(alone + 20), True)):  # 20: the session's seconds first
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        log = session_log(work, env, "--params", "params.paper-gpu.yaml", "--train", "capsnet_r3_recon_official:0",
                          "--parallel", "1", "--deadline", "120", "--window", str(window))
        assert yaml.safe_load((work / "params.gpu.yaml").read_text()) == paper
        calls = (work / "calls.log").read_text().splitlines() if (work / "calls.log").exists() else []
        assert calls == (["train capsnet_r3_recon_official 0 params.gpu.yaml",
                          "evaluate models/capsnet_r3_recon_official/seed0 data/prepared"] if trained else []), log
        assert ("not started" in log) != trained, log


def test_the_plan_prices_a_paper_seed_as_its_job_will_and_goes_on_with_one_an_earlier_call_began(tmp_path):
    """gpu_window.paper_price: gpu_queue.py's fit, alone on the GPU, with the session's seconds before the job
    taken off the window; a seed an earlier call of the window started (training on, or its checkpoint) or
    trained (its config.json) goes on whatever is left, so that every call plans the same window."""
    path = write_profile(tmp_path / "params.paper-gpu.yaml", "paper-gpu", "--set", "train.amp=true")
    paper = yaml.safe_load(path.read_text())
    h200 = gpu_levers.bench_rows(REPO / "reports" / "bench" / "nvidia-h200")
    item = "capsnet_r3_recon_official:0"
    alone, _ = gpu_queue.job_seconds(paper, "capsnet_r3_recon_official", 1, h200, parallel=1)
    needed = alone + gpu_window.SESSION_SECONDS
    for left, fits in ((needed + 1, True), (needed - 1, False)):
        ok, why = gpu_window.paper_price(paper, h200, [], left, tmp_path)(item)
        assert ok is fits and ("estimated" in why) and (("not started" in why) != fits), why
    (tmp_path / "logs" / "detached").mkdir(parents=True)
    (tmp_path / "logs" / "detached" / "capsnet_r3_recon_official-0.job").write_text("call 1 started it\n")
    assert gpu_window.paper_price(paper, h200, [], 200, tmp_path)(item) == (True, f"{item}: started by an earlier call "
                                                                             "of this window, training on")
    (tmp_path / "logs" / "detached" / "capsnet_r3_recon_official-0.job").unlink()
    (tmp_path / "checkpoints" / "capsnet_r3_recon_official").mkdir(parents=True)
    (tmp_path / "checkpoints" / "capsnet_r3_recon_official" / "seed0.pt").write_bytes(b"call 1 stopped it")
    ok, why = gpu_window.paper_price(paper, h200, [], 200, tmp_path)(item)
    assert ok and "resume from" in why
    (tmp_path / "checkpoints" / "capsnet_r3_recon_official" / "seed0.pt").unlink()
    (tmp_path / "models" / "capsnet_r3_recon_official" / "seed0").mkdir(parents=True)
    (tmp_path / "models" / "capsnet_r3_recon_official" / "seed0" / "config.json").write_text("{}")
    assert gpu_window.paper_price(paper, h200, [], 60, tmp_path)(item) == (True, f"{item}: trained by an earlier call "
                                                                            "of this window, evaluated now")


def test_a_paper_seed_is_priced_with_its_evaluations_and_never_starts_unpriced(tmp_path):
    """The paper protocol's seed (640 epochs) on the H200's bench rows: its start, its training at the captured
    bf16 row, a test evaluation every epoch and the evaluation at its end (no restart: outlasting the call it
    trains on through the next); it fits the first call of a fresh window (900 s less about 30 s of start and
    transfer, 60 s allowed after, about 15 s of fingerprint table); with no bench row it never starts (the
    window's end would lose it whole), where a short job would."""
    path = write_profile(tmp_path / "params.paper-gpu.yaml", "paper-gpu", "--set", "train.amp=true")
    paper = yaml.safe_load(path.read_text())
    h200 = [r for f in sorted((REPO / "reports" / "bench" / "nvidia-h200").glob("*.jsonl")) for r in gpu_levers.bench_rows(f)]
    seconds, source = gpu_queue.job_seconds(paper, "capsnet_r3_recon_official", 1, h200, parallel=1)
    rate = next(r["train_images_per_s"] for r in h200 if r["mode"] == CAPS and r.get("seeds", 1) == 1)
    assert f"{CAPS} ×1: {rate:,.0f} images/s" in source
    assert seconds == pytest.approx(gpu_queue.STARTUP_SECONDS + gpu_queue.MARGIN * 640 * 60_000 / rate
                                    + gpu_queue.EVAL_SECONDS + 640 * gpu_queue.EPOCH_EVAL_SECONDS)
    start, why = gpu_queue.fit("capsnet_r3_recon_official:0", 900 - 30 - 60 - 15, paper, h200, 1)
    assert start == "capsnet_r3_recon_official:0" and f"{seconds:.0f} s estimated" in why
    start, why = gpu_queue.fit("capsnet_r3_recon_official:0", seconds - 1, paper, h200, 1)
    assert start is None and "not started" in why
    start, why = gpu_queue.fit("capsnet_r3_recon_official:0", 10_000, paper, [], 1)
    assert start is None and "no bench row of its mode on this GPU to price 640 epochs" in why


def test_the_time_between_epochs_is_read_from_a_runs_journal(tmp_path):
    """scripts/epoch_overhead.py (EPOCH_EVAL_SECONDS' source): the seconds between two epochs' logged metrics
    less the later epoch's own training; the published runs' journal gives what gpu_queue.py prices with."""
    journal = tmp_path / "run.jsonl"
    events = [{"event": "params", "time_ms": 0}] + [
        {"event": "metrics", "time_ms": t, "metrics": {"epoch_seconds": e, "test_error_pct": 1.0}, "step": k}
        for k, (t, e) in enumerate([(900, 0.9), (1_950, 1.0), (3_210, 1.2)], start=1)]
    journal.write_text("\n".join(map(json.dumps, events)) + "\n" + '{"event": "metr')  # a process killed mid-write
    with pytest.warns(UserWarning, match="torn"):  # read as every journal is (pipeline.core.journal)
        assert epoch_overhead.epoch_overheads(epoch_overhead.epoch_events(journal)) == pytest.approx([0.05, 0.06])
    done = subprocess.run([sys.executable, "scripts/epoch_overhead.py", "--commit", "fb5b23c"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    alone = {tuple(line.split()[:2]): float(line.split()[3]) for line in done.stdout.splitlines()[1:]}
    assert alone[("capsnet_r1_official", "2")] == pytest.approx(0.03, abs=0.005)  # the one run alone on the GPU
    assert alone[("capsnet_r1_official", "2")] < gpu_queue.EPOCH_EVAL_SECONDS < alone[("capsnet_r3", "1")]


def test_the_time_between_epochs_is_listed_for_runs_of_the_commit_asked_for_with_three_epochs_or_more(tmp_path):
    """epoch_overhead.py --runs --commit: one line per run of that commit whose journal holds 3 epochs or
    more, with the medians of its overheads and of its epochs' own seconds; a run of another commit, one
    of 2 epochs and one without a journal are left out."""
    def record(variant, seed, commit, epochs):
        folder = tmp_path / "models" / variant / f"seed{seed}"
        folder.mkdir(parents=True)
        run_id = f"{variant}-{seed}"
        (folder / "config.json").write_text(json.dumps({"run_id": run_id, "environment": {"git_commit": commit}}))
        if epochs:
            (tmp_path / "journal").mkdir(exist_ok=True)
            events = [{"event": "metrics", "time_ms": t, "metrics": {"epoch_seconds": e}, "step": k}
                      for k, (t, e) in enumerate(epochs, start=1)]
            (tmp_path / "journal" / f"{run_id}.jsonl").write_text("\n".join(map(json.dumps, events)) + "\n")

    record("capsnet_r1", 0, "abc1234def", [(1_000, 1.0), (2_100, 1.0), (3_500, 1.2), (4_800, 1.25)])
    record("capsnet_r1", 1, "abc1234def", [(1_000, 1.0), (2_100, 1.0)])
    record("capsnet_r3", 0, "fff0000aaa", [(1_000, 1.0), (2_100, 1.0), (3_200, 1.0)])
    record("capsnet_r3", 1, "abc1234def", [])
    done = subprocess.run([sys.executable, "scripts/epoch_overhead.py", "--runs", str(tmp_path), "--commit", "abc1234"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    # overheads 0.1, 0.2, 0.05 s (median 0.1); epochs 1.0, 1.0, 1.2, 1.25 s (median 1.1)
    assert done.stdout.splitlines()[1:] == ["capsnet_r1 0 abc1234 0.100 1.10"]


def test_the_paper_protocol_trains_in_bf16_only_where_every_decided_precision_row_allows_it(tmp_path):
    """scripts/gpu_window.py --paper-amp: each precision-check row with an interval over 3 seeds a side must
    allow bf16; one beyond the seed noise keeps fp32 and is the row the reason names, wherever it stands;
    a row without an interval (too few seeds, empty cells) decides nothing, nor does another variant's
    effect against the twin."""
    import pandas as pd

    gpu = yaml.safe_load(write_profile(tmp_path / "params.gpu.yaml").read_text())

    def check(*cis):
        rows = [{"a": "capsnet_r3_recon", "b": "capsnet_r3_recon_fp32", "our_delta": (lo + hi) / 2, "ci_low": lo,
                 "ci_high": hi, "n_seeds": seeds} for lo, hi, seeds in cis]
        pd.DataFrame(rows).to_csv(tmp_path / "effects.csv", index=False)
        return gpu_window.paper_precision(tmp_path / "effects.csv", gpu)

    allowed, why = check((-0.1, 0.2, 3), (0.05, 0.3, 3))
    assert not allowed and "[+0.05, +0.30]" in why and "beyond the seed noise" in why
    allowed, why = check((-0.1, 0.2, 3), (0.05, 0.3, 2))  # the second row has no interval over 3 seeds
    assert allowed and "[-0.10, +0.20]" in why
    # another variant against the twin is an effect of the report, not the precision check: it decides nothing
    pd.DataFrame([{"a": "capsnet_r3", "b": "capsnet_r3_recon_fp32", "our_delta": 0.2, "ci_low": 0.05, "ci_high": 0.3,
                   "n_seeds": 3}, {"a": "capsnet_r3_recon", "b": "capsnet_r3_recon_fp32", "our_delta": 0.05,
                                   "ci_low": -0.1, "ci_high": 0.2, "n_seeds": 3}]).to_csv(tmp_path / "effects.csv", index=False)
    allowed, why = gpu_window.paper_precision(tmp_path / "effects.csv", gpu)
    assert allowed and why.startswith("precision check, capsnet_r3_recon − capsnet_r3_recon_fp32")
    # empty interval cells (the report's confounded or one-seed rows): no interval, no decision
    pd.DataFrame([{"a": "capsnet_r3_recon", "b": "capsnet_r3_recon_fp32", "our_delta": 0.05, "ci_low": "", "ci_high": "",
                   "n_seeds": 3}]).to_csv(tmp_path / "effects.csv", index=False)
    allowed, why = gpu_window.paper_precision(tmp_path / "effects.csv", gpu)
    assert not allowed and "has not decided" in why


def test_the_window_script_says_in_one_line_which_file_it_needs_and_how_to_write_it(tmp_path):
    """scripts/gpu_window.py: a missing params file, paper params or fingerprint table is one line naming
    the command that writes it; --paper-amp says why on stderr and prints the decision alone."""
    params = write_profile(tmp_path / "params.gpu.yaml")

    def window(*args):
        done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_window.py"), *args], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        return done.returncode, done.stdout, done.stderr.splitlines()

    code, _, err = window("--params", "absent.yaml")
    assert code == 1 and err == ["absent.yaml does not exist: write it with "
                                 "`python -m pipeline.profiles gpu --write absent.yaml`"]
    for paper in ([], ["--paper", "absent-paper.yaml"]):
        code, _, err = window("--params", str(params), *paper)
        assert code == 1 and len(err) == 1 and err[0].startswith("--paper PARAMS is needed: write them with `python "
                                                                 "-m pipeline.profiles paper-gpu --set train.amp=")
    code, _, err = window("--params", str(params), "--paper", str(params), "--fingerprints", "absent.json")
    assert code == 1 and err == [f"absent.json does not exist: write it with `capsnet fingerprint absent.json "
                                 f"--params {params}`"]
    code, out, err = window("--params", str(params), "--paper-amp", "--effects", "absent.csv")
    assert (code, out) == (0, "false\n") and len(err) == 1 and "the precision check has not decided" in err[0]


def test_a_paper_window_says_which_paper_seeds_it_queues_again_for_other_training_code(tmp_path):
    """scripts/gpu_window.py: where the window trains the paper protocol, a paper seed published by other
    training code than --fingerprints' is queued again, and stderr says so, as for the gpu profile's seeds."""
    write_profile(tmp_path / "params.gpu.yaml")
    write_profile(tmp_path / "params.paper-gpu.yaml", "paper-gpu", "--set", "train.amp=true")
    env = "torch 2.11.0+cu130, CPU AVX2 capped"
    variants = yaml.safe_load((tmp_path / "params.gpu.yaml").read_text())["variants"]
    for group in gpu_queue.GROUPS[:gpu_window.BEFORE_PAPER]:
        for v in group:
            for seed in gpu_queue.SEEDS:
                publish_seed0(tmp_path, "a" * 16, env, variant=v, seed=seed)
    runs = tmp_path / "reports" / "runs"
    aside = runs / "earlier" / "capsnet_r3_recon_official-0" / "models" / "capsnet_r3_recon_official"
    aside.mkdir(parents=True)
    (runs / "models" / "capsnet_r3_recon_official" / "seed0").rename(aside / "seed0")
    publish_seed0(tmp_path, "b" * 16, env, variant="capsnet_r3_recon_official", params="params.paper-gpu.yaml")
    precision_effects(tmp_path / "effects.csv", (-0.1, 0.2))
    (tmp_path / "table.json").write_text(json.dumps(
        {"commit": "c0ffee1", "environment": env, "fingerprints": {v: "a" * 16 for v in variants}}))
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_window.py"), "--params", "params.gpu.yaml",
                           "--paper", "params.paper-gpu.yaml", "--effects", "effects.csv", "--fingerprints", "table.json"],
                          cwd=tmp_path, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["paper", "capsnet_r3_recon_official:0"]
    assert (f"queued again, published under this protocol by other training code than c0ffee1's ({env}): "
            "capsnet_r3_recon_official:0") in done.stderr.splitlines()


def test_the_window_script_carries_a_run_of_another_environment_through_this_hosts_table_beside_its_own(tmp_path):
    """scripts/gpu_window.py --fingerprints F: the tables beside F (gpu_plan.sh's, computed on this host) carry a
    seed published in another fingerprint environment whose commit's table there vouches for it, where this
    host's table of that commit gives F's fingerprint; without one, that seed is queued again."""
    write_profile(tmp_path / "params.gpu.yaml")
    write_profile(tmp_path / "params.paper-gpu.yaml", "paper-gpu", "--set", "train.amp=true")
    old, commit = "torch 2.11.0+cu130, CPU AVX2 capped, MKL COMPATIBLE", "d0" * 20
    publish_seed0(tmp_path, "a" * 16, old, commit)
    (tmp_path / "reports" / "runs" / "fingerprints").mkdir()
    (tmp_path / "reports" / "runs" / "fingerprints" / f"{commit}.json").write_text(json.dumps(
        {"commit": commit, "environment": old, "fingerprints": {"capsnet_r3_recon": "a" * 16}}))
    here, tables = f"{old}, GenuineIntel, glibc 2.39", tmp_path / "fingerprints"
    tables.mkdir()
    (tables / "c0ffee1.json").write_text(json.dumps(
        {"commit": "c0ffee1", "environment": here, "fingerprints": {"capsnet_r3_recon": "b" * 16}}))

    def queued() -> list[str]:
        return subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_window.py"), "--params", "params.gpu.yaml",
                               "--paper", "params.paper-gpu.yaml", "--effects", "absent.csv", "--fingerprints",
                               str(tables / "c0ffee1.json")], cwd=tmp_path, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}).stdout.split()

    assert "capsnet_r3_recon:0,1,2" in queued()
    (tables / f"{commit}-here.json").write_text(json.dumps(
        {"commit": commit, "environment": here, "fingerprints": {"capsnet_r3_recon": "b" * 16}}))
    assert "capsnet_r3_recon:1,2" in queued()
