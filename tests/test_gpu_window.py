"""A lent GPU window is 15 device-minutes: scripts/gpu_queue.py prices each job from the bench rows of the
settings it trains with (or its measured seconds) and --fit starts only jobs whose estimate fits what is
left of it; what is published under the profile's protocol is not queued again. The levers a job trains
with: tests/test_gpu_levers.py; the session script on the device: tests/test_gpu_session.py; the import
here: tests/test_gpu_import.py; what a call carries: tests/test_gpu_travel.py."""

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, script, write_profile
from gpu_device import CAPS, CNN, rows
from pipeline.core.params import parse_params

gpu_queue = script("gpu_queue")


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


def test_gpu_queue_skips_what_is_published_under_the_profiles_protocol(tmp_path):
    """scripts/gpu_queue.py: runs of the gpu profile's protocol are done, wherever their record is
    published (models/, or set aside under earlier/ by a later run of the same seed); runs of an older
    protocol (the published ones, cut at 50 epochs of the uncompressed schedule) are queued again;
    the fp32 twin counts only its fp32 records; Table 1's rows (seed by seed) come before MultiMNIST,
    the precision check's twin and §5.2."""
    import json

    from pipeline.core import protocol
    from pipeline.report import publish
    from pipeline.training.config import run_config

    gpu_queue = script("gpu_queue")
    assert gpu_queue.EARLIER == publish.EARLIER
    params = write_profile(tmp_path / "params.gpu.yaml")
    raw = yaml.safe_load(params.read_text())
    gpu = parse_params(raw)
    runs = tmp_path / "runs"

    def record(where: str, variant: str, seed: int, **changed) -> None:  # a config.json as the train stage writes it
        cfg = {k: v for k, v in dataclasses.asdict(run_config(gpu, variant, seed)).items() if v is not None}
        config = {"config": {**cfg, **changed}, "params": {"device": "cuda"}}
        folder = runs / where / variant / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))

    record("models", "capsnet_r3_recon", 0)
    record("earlier/run1/models", "capsnet_r1", 2)  # set aside by a later run of another protocol
    record("models", "capsnet_r1", 2, epochs=640)
    record("models", "capsnet_r3_recon", 1, lr_schedule_epochs=0)  # the old, cut schedule
    record("models", "capsnet_r3_recon_fp32", 0)
    record("models", "capsnet_r3_recon_fp32", 1, amp=True)  # not the twin's precision
    assert protocol.planned(raw, "capsnet_r3_recon_fp32")[-1] == "fp32"
    assert protocol.planned(raw, "capsnet_r3_recon")[-1] == "bf16 autocast"
    items = gpu_queue.queue(runs, raw)
    assert len(items) == 15 * 3 - 3
    assert not {"capsnet_r3_recon:0", "capsnet_r1:2", "capsnet_r3_recon_fp32:0"} & set(items)
    assert items[0] == "capsnet_r3_recon_official:0" and items[8] == "capsnet_r3_recon:1"  # the old protocol: again
    assert items.index("baseline_cnn:2") < items.index("multimnist_r3_recon:0") < items.index("capsnet_r3_recon_fp32:1") \
        < items.index("capsnet_affnist:0")
    published = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--limit", "3",
                                "--runs", str(runs)], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert published == items[:3] == ["capsnet_r3_recon_official:0", "capsnet_r1_recon:0", "capsnet_r1_recon_official:0"]
    stacked = gpu_queue.stacked(items)  # one item per variant, its missing seeds in one process
    assert stacked[:2] == ["capsnet_r3_recon_official:0,1,2", "capsnet_r1_recon:0,1,2"]
    assert "capsnet_r3_recon:1,2" in stacked and "capsnet_r1:0,1" in stacked and "capsnet_r3_recon_fp32:1,2" in stacked
    assert len(stacked) == 15

    # with the fingerprint table of the code that trains (gpu_plan.sh writes it first): a record of other
    # training code, or of the same digits in another environment, is queued again; one without a
    # fingerprint (it predates them) keeps counting by its protocol
    env = "torch 2.11.0+cu130, CPU AVX2 capped"
    table = {"commit": "c0ffee" * 6 + "0123", "environment": env,
             "fingerprints": {"capsnet_r3_recon": "a" * 16, "capsnet_r1": "b" * 16, "capsnet_r1_recon": "c" * 16}}
    (tmp_path / "table.json").write_text(json.dumps(table))

    def fingerprinted(where: str, variant: str, seed: int, fingerprint: str, environment: str = env) -> None:
        path = runs / where / variant / f"seed{seed}" / "config.json"
        if not path.is_file():
            record(where, variant, seed)
        path.write_text(json.dumps(json.loads(path.read_text()) | {
            "training_fingerprint": fingerprint, "environment": {"fingerprint_environment": environment}}))

    fingerprinted("models", "capsnet_r3_recon", 0, "a" * 16)  # this code's training
    fingerprinted("earlier/run1/models", "capsnet_r1", 2, "f" * 16)  # other training code
    fingerprinted("models", "capsnet_r1_recon", 0, "c" * 16, "torch 2.11.0+cu130, CPU AVX512")  # an uncapped one
    assert gpu_queue.queue(runs, raw) == [i for i in items if i != "capsnet_r1_recon:0"]  # no table: not checked
    checked = gpu_queue.queue(runs, raw, table)
    assert set(checked) == set(items) | {"capsnet_r1:2"} and len(checked) == len(items) + 1
    assert "capsnet_r3_recon_fp32:0" not in checked  # no fingerprint recorded: its protocol decides
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1_recon:0", "capsnet_r1:2"]
    done = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--runs", str(runs),
                           "--fingerprints", str(tmp_path / "table.json")], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.split() == checked
    assert done.stderr.strip() == f"queued again, published under this protocol by other training code than c0ffeec's ({env}): " \
        "capsnet_r1_recon:0 capsnet_r1:2"
    # the uncapped record carries over where tables of its own commit say what it trained: that commit's
    # table in the record's environment holds what it recorded, its table in the window's environment what
    # the window's table holds (pipeline.core.lineage; scripts/fingerprint_at.py writes the latter)
    path = runs / "models" / "capsnet_r1_recon" / "seed0" / "config.json"
    config = json.loads(path.read_text())
    config["environment"]["git_commit"] = "d" * 40
    path.write_text(json.dumps(config))
    (runs / "fingerprints").mkdir()
    own = {"commit": "d" * 40, "environment": "torch 2.11.0+cu130, CPU AVX512", "fingerprints": {"capsnet_r1_recon": "c" * 16}}
    (runs / "fingerprints" / "there.json").write_text(json.dumps(own | {"environment": env}))
    (runs / "fingerprints" / "own.json").write_text(json.dumps(own | {"fingerprints": {"capsnet_r1_recon": "e" * 16}}))
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1_recon:0", "capsnet_r1:2"]  # its commit computed "e…" there
    (runs / "fingerprints" / "own.json").write_text(json.dumps(own))
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1:2"]
    assert "capsnet_r1_recon:0" not in gpu_queue.queue(runs, raw, table)
    assert gpu_queue.bridges(runs, raw, table) == []  # every record known in the window's environment
    (runs / "fingerprints" / "there.json").unlink()  # the commit's code not computed in the window's environment
    assert gpu_queue.other_training(runs, raw, table) == ["capsnet_r1_recon:0", "capsnet_r1:2"]
    # so the window computes that table on its own host (gpu_plan.sh): the commits whose table there would
    # carry a record, each with the variants it needs, the commit with the most records first; a record
    # its own commit's table does not vouch for, or one known there already, asks for none
    for seed in (0, 1):
        fingerprinted("models", "capsnet_r3", seed, "9" * 16, "torch 2.11.0+cu130, CPU AVX512")
        path = runs / "models" / "capsnet_r3" / f"seed{seed}" / "config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {
            "environment": {"fingerprint_environment": "torch 2.11.0+cu130, CPU AVX512", "git_commit": "e" * 40}}))
    (runs / "fingerprints" / "e.json").write_text(json.dumps(own | {"commit": "e" * 40, "fingerprints": {"capsnet_r3": "9" * 16}}))
    assert gpu_queue.bridges(runs, raw, table) == [("e" * 40, ["capsnet_r3"]), ("d" * 40, ["capsnet_r1_recon"])]
    asked = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--runs", str(runs), "--bridges",
                            "--fingerprints", str(tmp_path / "table.json")], cwd=REPO, capture_output=True, text=True, check=True)
    assert asked.stdout.splitlines() == [f"{'e' * 40} capsnet_r3", f"{'d' * 40} capsnet_r1_recon"]
    (runs / "fingerprints" / "own.json").write_text(json.dumps(own | {"fingerprints": {"capsnet_r1_recon": "e" * 16}}))
    assert gpu_queue.bridges(runs, raw, table) == [("e" * 40, ["capsnet_r3"])]  # d's table does not vouch for it
    beside = {"commit": "e" * 40, "environment": env, "fingerprints": {"capsnet_r3": "b" * 16}}
    assert gpu_queue.bridges(runs, raw, table, [beside]) == []  # the window's own table of e, beside its table
    absent = subprocess.run([sys.executable, "scripts/gpu_queue.py", "--params", str(params), "--fingerprints",
                             str(tmp_path / "none.json")], cwd=REPO, capture_output=True, text=True)
    assert absent.returncode == 1 and "capsnet fingerprint" in absent.stderr and "none.json does not exist" in absent.stderr


def test_the_queue_plans_the_protocol_the_train_stage_records_from_the_same_params(tmp_path):
    """pipeline.core.protocol: a params file that leaves base.profile, train.tf32 and the device to their
    defaults is planned (gpu_queue.py, a device left to auto counting as CUDA) as the protocol its run records
    on a GPU, cuda:N included; a record's device is the resolved one it wrote (params), not the config's
    `auto`; another base rate is another protocol, and a record without a profile says so. The precision
    check's rule: no interval end, no decision."""
    import dataclasses
    import math

    from pipeline.core import protocol
    from pipeline.core.params import load_params
    from pipeline.training.config import run_config

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["base"].pop("profile", None)
    raw["train"].pop("tf32", None)
    for amp in (False, True):
        raw["train"].update(device="auto", amp=amp)
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
        recorded = dataclasses.asdict(run_config(load_params(tmp_path / "params.yaml"), "capsnet_r1", 0))
        cfg = {k: v for k, v in recorded.items() if v is not None}  # as config.json records it
        for device in ("cuda", "cuda:1"):
            assert protocol.planned(raw, "capsnet_r1") == protocol.protocol_key(cfg, device)
    assert protocol.precision(cfg, "cuda:1") == "bf16 autocast"  # the last record's: amp on
    assert protocol.device_of({"config": {**cfg, "device": "auto"}, "params": {"device": "cuda"}}) == "cuda"
    assert protocol.protocol_key({**cfg, "lr": cfg["lr"] / 2}, "cuda") != protocol.protocol_key(cfg, "cuda")
    assert protocol.protocol_key({k: v for k, v in cfg.items() if k != "profile"}, "cuda")[0] == protocol.NOT_RECORDED
    # the precision check: undecided without either end of an interval, and an interval ending at 0 holds it
    assert protocol.bf16_allowed(math.nan, 0.2, 3) is None and protocol.bf16_allowed(-0.1, math.nan, 3) is None
    assert protocol.bf16_allowed(0.0, 0.2, 3) is True and protocol.bf16_allowed(-0.2, 0.0, 3) is True
