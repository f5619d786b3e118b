"""`capsnet bench`'s rows (pipeline/training/bench.py): each configuration timed as the row names it,
and each figure of a row derived from the timing as its name says. Speed itself is measured by the
bench, never here."""

import resource

import pytest
import torch

from conftest import REPO
from pipeline.core.params import load_params
from pipeline.core.provenance import repo_root
from pipeline.training import bench
from pipeline.training.config import run_config

PARAMS = load_params(REPO / "params.yaml")


def on_cpu(variant: str):
    """``variant``'s configuration as `capsnet bench` times it, at batch 2 on the CPU, eager fp32."""
    return run_config(PARAMS, variant, 0, profile="bench", epochs=1, batch_size=2, amp=False, compile=False,
                      device="cpu")


def test_each_row_is_its_configuration_and_its_ratios_are_over_the_rows_they_name(monkeypatch):
    """bench.run with the timing stubbed: per batch the reference loop first, then per mode one seed
    and the stacked rows (one per layout; one seed has no layout); each configuration carries its batch,
    its mode's compile, channels-last and capture settings (bf16 off the GPU), the forced determinism;
    speedups are over the reference and over the one-seed row, TFLOP/s from the counted FLOP, every
    float rounded to 3 decimals."""
    timed, referenced = [], []

    def step(cfg, steps, warmup, compile_mode, seeds, layout, profile):
        timed.append((cfg, compile_mode, seeds, layout))
        return {"seeds": seeds, "train_images_per_s": 100.0 * seeds * (2 if layout == "bmm" else 1)}

    def reference(cfg, steps, warmup):
        referenced.append(cfg.batch_size)
        return {"train_images_per_s": 30.0}

    monkeypatch.setattr(bench, "bench_step", step)
    monkeypatch.setattr(bench, "bench_reference", reference)
    monkeypatch.setattr(bench, "flop_per_image", lambda cfg, dev: 2e9)
    monkeypatch.setattr(bench, "git_commit", lambda root: "c0ffee1" if root == repo_root() else None)
    modes = ("fp32", "bf16-compile-capture", "bf16-cl")
    rows = list(bench.run(PARAMS, "capsnet_r1", (4, 8), modes, 1, 0, True, "off", "cpu", seeds=(1, 3),
                          layouts=("fused", "bmm")))

    assert [(r["batch"], r["mode"], r.get("seeds"), r.get("stack")) for r in rows] == [
        (batch, mode, seeds, stack) for batch in (4, 8) for mode, seeds, stack in
        [("reference", None, None)] + [(m, *s) for m in modes for s in ((1, None), (3, "fused"), (3, "bmm"))]]
    assert referenced == [4, 8]
    cfgs = {(c.batch_size, c.compile, c.amp, c.channels_last, c.cuda_graph, c.deterministic, mode)
            for c, mode, _, _ in timed}
    assert cfgs == {(b, compiled, False, channels_last, captured, False, "default") for b in (4, 8)
                    for compiled, channels_last, captured in ((False, False, False), (True, False, True),
                                                              (False, True, False))}
    stacked = [r for r in rows if r.get("seeds") == 3]
    assert [r["speedup_vs_separate"] for r in stacked] == [3.0, 6.0] * 6
    assert [r["speedup_vs_reference"] for r in rows if r["mode"] != "reference"][:3] == [3.333, 10.0, 20.0]
    assert rows[1]["tflop_per_s"] == 0.2 and "speedup_vs_separate" not in rows[1]
    assert {(r["device"], r["commit"], r["deterministic"], r["flop_per_image_train"]) for r in rows} == {
        (f"cpu ({torch.get_num_threads()} threads)", "c0ffee1", False, 2e9)}


def test_a_timed_step_reports_its_figures_consistently_for_the_seeds_and_layout_it_ran(monkeypatch):
    """bench_step, really run on the CPU: two stacked seeds (0 and 1, not one seed twice) in the bmm
    layout; the aggregate rate is both seeds', the per-seed rate half of it, ms per step and seconds per
    60k-image epoch follow from it, the first warm-up step is timed, peak memory is the process's in MiB."""
    built = []
    group = bench.build_group
    monkeypatch.setattr(bench, "build_group", lambda cfgs, device: built.append(cfgs) or group(cfgs, device))
    cfg = on_cpu("capsnet_r1")
    row = bench.bench_step(cfg, steps=2, warmup=1, seeds=2, layout="bmm")
    assert [(c.seed, c.stack_layout) for c in built[0]] == [(0, "bmm"), (1, "bmm")]
    ips = row["train_images_per_s"]
    assert row["seeds"] == 2 and row["per_seed_images_per_s"] == pytest.approx(ips / 2)
    assert row["ms_per_step"] == pytest.approx(1000 * 2 * 2 / ips)  # two seeds' batches of 2 per step
    assert row["s_per_epoch"] == pytest.approx(2 * 60_000 / ips)
    assert row["first_step_s"] > 0 and row["captured"] is False and row["inference_images_per_s"] > 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak / 4 < row["peak_memory_mb"] <= peak


def test_multimnist_is_benched_on_its_canvas_and_a_device_name_becomes_a_folder_name():
    """MultiMNIST's test digits are 28×28 and its models 36×36: inference pads them onto the canvas."""
    cfg = on_cpu("multimnist_r1_recon")
    assert bench.bench_step(cfg, steps=1, warmup=0)["inference_images_per_s"] > 0
    assert bench.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bench.device_slug("cpu (2 threads)") == "cpu-2-threads"


@pytest.mark.parametrize("variant", ["capsnet_r1", "capsnet_affnist"])
def test_the_reference_loop_times_its_own_steps_and_places_a_digit_on_a_larger_canvas(variant):
    """The popular implementations' loop, really run: ms per step and seconds per 60k-image epoch follow
    from its rate; on §5.2's 40×40 canvas the random crop places the 28×28 digit anywhere on it."""
    cfg = on_cpu(variant)
    row = bench.bench_reference(cfg, steps=2, warmup=1)
    ips = row["train_images_per_s"]
    assert row["ms_per_step"] == pytest.approx(1000 * 2 / ips) and row["s_per_epoch"] == pytest.approx(60_000 / ips)
