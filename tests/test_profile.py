"""`capsnet bench --profile-steps` (pipeline/training/profile.py): where a training step's time goes, as a
bench row carries it, as the GPU window asks for it (`+profile` entries) and as reports/benchmarks.md shows it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from torch.autograd import DeviceType

from conftest import bench_table
from gpu_device import device_tree, python3_on_path

from pipeline.cli import main
from pipeline.training import profile

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, expected", [
    # cuDNN's convolutions, their layout transposes and the CUTLASS kernels cuDNN runs them with
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nchw_tilesize128x128x64_kernel__5x_cudnn", "convolution"),
    ("sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64", "convolution"),
    ("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false>", "convolution"),
    ("cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x128_32x3_nhwc_align8>", "convolution"),
    ("void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, false, true>", "convolution"),
    ("aten::convolution_backward", "convolution"),
    # matrix products: cuBLAS, nvjet, CUTLASS's own, inductor's templates, the CPU's operators
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_cublas", "matmul"),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_NNT", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_64x1_tn_align8>", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("aten::bmm", "matmul"),
    # inductor's fused kernels, whatever their origins are named after (a convolution's bias, a softmax)
    ("triton_poi_fused_convolution_relu_0", "fused (triton)"),
    ("triton_per_fused__softmax_sum_3", "fused (triton)"),
    # Adam, copies and fills, ATen's own kernels
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>", "optimizer"),
    ("Optimizer.step#Adam.step", "optimizer"),
    ("Memcpy DtoD (Device -> Device)", "copy/fill"),
    ("Memset (Device)", "copy/fill"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul>>",
     "copy/fill"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float>>>",
     "elementwise/reduction"),
    ("aten::div", "elementwise/reduction"),
    ("cudaGraphLaunch", "other"),
])
def test_each_kernel_falls_in_its_category(name, expected):
    assert profile.category(name) == expected


def test_the_summary_is_per_step_every_category_listed_the_longest_first():
    durations = {"aten::mkldnn_convolution": (2, 300.0), "Memset (Device)": (4, 40.0), "triton_poi_fused_0": (2, 60.0),
                 "cudaGraphLaunch": (2, 100.0)}  # µs over 2 steps
    s = profile.summarize(durations, steps=2, wall_s=0.001, activity="cuda kernels")
    assert s["wall_ms_per_step"] == 0.5 and s["busy_ms_per_step"] == 0.25 and s["calls_per_step"] == 5
    assert s["categories_ms_per_step"] == {"copy/fill": 0.02, "optimizer": 0.0, "matmul": 0.0, "fused (triton)": 0.03,
                                           "convolution": 0.15, "elementwise/reduction": 0.0, "other": 0.05}
    assert [(k["name"], k["calls_per_step"], k["ms_per_step"]) for k in s["top"]] == [
        ("aten::mkldnn_convolution", 1, 0.15), ("cudaGraphLaunch", 1, 0.05), ("triton_poi_fused_0", 1, 0.03),
        ("Memset (Device)", 2, 0.02)]
    none = profile.summarize({}, steps=2, wall_s=0.001, activity="cuda kernels")  # CUPTI gave nothing: not an idle GPU
    assert none["busy_ms_per_step"] is None and none["activity"] == "cuda kernels: none recorded" and none["top"] == []
    many = profile.summarize({f"k{i}" + "x" * 300: (1, float(i)) for i in range(20)}, 1, 1.0, "cuda kernels")["top"]
    assert len(many) == profile.TOP and many[0]["name"].startswith("k19") and len(many[0]["name"]) == profile.NAME_CHARS


def test_each_of_the_top_kernels_names_its_category():
    """A top kernel's row says which category its time went to, as the categories' sums count it."""
    durations = {"aten::mkldnn_convolution": (2, 300.0), "Memset (Device)": (4, 40.0), "ampere_sgemm_128x64": (2, 90.0)}
    top = profile.summarize(durations, steps=2, wall_s=0.001, activity="cuda kernels")["top"]
    assert [(k["name"], k["category"]) for k in top] == [
        ("aten::mkldnn_convolution", "convolution"), ("ampere_sgemm_128x64", "matmul"), ("Memset (Device)", "copy/fill")]


def test_device_time_counts_every_kernel_once_and_nothing_the_host_ran():
    def event(name, device, us, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [event("gemm_a", DeviceType.CUDA, 10.0), event("gemm_a", DeviceType.CUDA, 30.0),
              event("Memset (Device)", DeviceType.CUDA, 2.0),
              event("aten::mm", DeviceType.CPU, 500.0), event("cudaGraphLaunch", DeviceType.CPU, 50.0),
              event("Optimizer.step#Adam.step", DeviceType.CUDA, 40.0, annotation=True)]  # spans kernels counted already
    assert profile.device_durations(events) == {"gemm_a": (2, 40.0), "Memset (Device)": (1, 2.0)}


def test_a_cpu_profile_counts_each_operators_own_time_not_the_operators_it_called():
    """On a CPU an operator's self time stands in for a kernel's: aten::linear's total holds the
    aten::addmm it called, which is counted on its own, so totals would count that time twice; an
    operator with no time of its own is left out."""
    averages = [SimpleNamespace(key="aten::linear", count=2, self_cpu_time_total=5.0, cpu_time_total=45.0),
                SimpleNamespace(key="aten::addmm", count=2, self_cpu_time_total=40.0, cpu_time_total=40.0),
                SimpleNamespace(key="aten::view", count=4, self_cpu_time_total=0.0, cpu_time_total=0.0)]
    prof = SimpleNamespace(key_averages=lambda: averages)
    assert profile.operator_durations(prof) == {"aten::linear": (2, 5.0), "aten::addmm": (2, 40.0)}


def bench_rows(*extra: str) -> list[dict]:
    result = CliRunner().invoke(main, ["bench", "--variant", "capsnet_r1", "--batch", "2", "--steps", "1", "--warmup", "0",
                                       "--device", "cpu", "--no-reference", "--params", str(REPO / "params.yaml"), *extra])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]


def test_a_profiled_bench_row_says_where_its_steps_went_and_an_unprofiled_one_says_nothing():
    (plain,) = bench_rows()
    assert "profile" not in plain
    rows = bench_rows("--profile-steps", "3", "--seeds", "1", "--seeds", "2")  # more steps than timed: data for them too
    assert [r["seeds"] for r in rows] == [1, 2]
    for row in rows:
        p = row["profile"]
        assert p["activity"] == "cpu operators (self time)" and p["steps"] == 3
        assert p["busy_ms_per_step"] > 0 and p["wall_ms_per_step"] > 0 and p["calls_per_step"] > 0
        assert sum(p["categories_ms_per_step"].values()) == pytest.approx(p["busy_ms_per_step"], abs=0.01)
        assert p["categories_ms_per_step"]["convolution"] > 0  # CapsNet's two convolutions, forward and backward
        times = [k["ms_per_step"] for k in p["top"]]
        assert times == sorted(times, reverse=True) and len(times) == profile.TOP
    # the two seeds stacked ran each convolution's kernels as one (a grouped convolution), not twice
    conv_calls = [sum(k["calls_per_step"] for k in r["profile"]["top"] if k["name"] == "aten::convolution_backward")
                  for r in rows]
    assert conv_calls[0] == conv_calls[1] > 0


def test_a_profiler_that_fails_costs_the_row_its_profile_only(monkeypatch):
    from pipeline.training import bench

    def refused(*_):
        raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\nmore lines")

    monkeypatch.setattr(bench, "profile_steps", refused)
    (row,) = bench_rows("--profile-steps", "2")
    assert row["profile"] == {"error": "RuntimeError: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", "steps": 2}
    assert row["train_images_per_s"] > 0 and row["inference_images_per_s"] > 0


def test_a_profile_entry_of_the_window_asks_the_bench_for_its_profile(tmp_path):
    """gpu_session.sh: `V@mode#1,3+profile` benches those seeds with --profile-steps and no layout called
    "profile"; `+bmm+profile` keeps its bmm layout."""
    work = device_tree(tmp_path)
    env = python3_on_path(tmp_path, f"""#!/bin/sh
if [ "$1 $2 $3" = "-m pipeline.cli bench" ]; then
  shift 3; echo "$*" >>bench-calls.log; echo '{{"variant": "capsnet_r1", "mode": "fp32", "train_images_per_s": 1.0}}'; exit 0
fi
exec "{sys.executable}" "$@"
""", CAPSNET_GPU_PROFILE="smoke")
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "--bench", "capsnet_r1@fp32#1,3+profile capsnet_r3@fp32#3+bmm+profile",
                           "--deadline", "300"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    calls = (work / "bench-calls.log").read_text().splitlines()
    assert len(calls) == 2
    assert "--seeds 1 --seeds 3 --stack fused --profile-steps 10" in calls[0]
    assert "--seeds 3 --stack fused --stack bmm --profile-steps 10" in calls[1] and "--stack profile" not in calls[1]
    assert (work / "logs" / "bench" / "capsnet_r1@fp32#1,3+profile.jsonl").exists()  # what gpu_import.sh keeps


def test_the_bench_table_shows_where_a_profiled_steps_time_goes(tmp_path):
    common = {"device": "NVIDIA H200", "date": "2026-12-01", "commit": "abc1234", "torch": "2.11.0+cu130", "batch": 128,
              "flop_per_image_train": 1.2e9, "variant": "capsnet_r3_recon", "mode": "bf16-compile-capture",
              "captured": True}
    where = profile.summarize({"sm90_xmma_fprop_implicit_gemm_x": (20, 8000.0), "triton_poi_fused_0": (40, 4000.0)},
                              steps=10, wall_s=0.02, activity="cuda kernels")
    blind = profile.summarize({}, steps=10, wall_s=0.05, activity="cuda kernels")
    rows = [{**common, "seeds": 1, "train_images_per_s": 66_000, "profile": where},
            {**common, "seeds": 3, "stack": "fused", "train_images_per_s": 31_000, "profile": blind},
            {**common, "seeds": 3, "stack": "bmm", "train_images_per_s": 30_000, "profile": {"error": "RuntimeError: no", "steps": 10}},
            {**common, "mode": "bf16-compile", "seeds": 1, "train_images_per_s": 31_000}]
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = bench_table(folder)
    assert "torch.profiler over 10 steps" in out
    assert ("| bf16-compile-capture: bf16, compile default, the whole step as one CUDA graph | 1 | – | 2.00 | 1.20 (60%) | 6 "
            "| 0.80 | 0.00 | 0.40 | 0.00 | 0.00 | 0.00 | 0.00 |") in out
    assert "`sm90_xmma_fprop_implicit_gemm_x` 0.800 ×2; `triton_poi_fused_0` 0.400 ×4" in out
    assert ("| bf16-compile-capture: bf16, compile default, the whole step as one CUDA graph | 3 | fused | 5.00 | none recorded | – "
            "| – | – | – | – | – | – | – |") in out
    assert "3 seeds: none (cuda kernels: none recorded)" in out
    assert "| 3 | bmm | – | failed: RuntimeError: no | – | – | – | – | – | – | – | – |" in out
    assert out.count("\n| bf16") == 3  # the profiled rows alone (the one-seed table's rows read "| capsnet-repro …")


def test_the_bench_tables_categories_come_from_a_row_that_recorded_them_and_five_kernels_are_named(tmp_path):
    """A first profiled row that recorded no kernel leaves the columns to one that did; each profiled row
    names its five longest kernels, its seed count in words."""
    common = {"device": "NVIDIA H200", "date": "2026-12-01", "commit": "abc1234", "torch": "2.11.0", "batch": 128,
              "flop_per_image_train": 1.2e9, "variant": "capsnet_r3_recon", "mode": "bf16-compile"}
    kernels = {f"triton_poi_fused_{k}": (10, 1000.0 * (k + 1)) for k in range(6)}
    rows = [{**common, "seeds": 1, "train_images_per_s": 31_000,
             "profile": profile.summarize({}, steps=10, wall_s=0.05, activity="cuda kernels")},
            {**common, "seeds": 3, "stack": "fused", "train_images_per_s": 66_000,
             "profile": profile.summarize(kernels, steps=10, wall_s=0.05, activity="cuda kernels")}]
    folder = tmp_path / "nvidia-h200"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = bench_table(folder).splitlines()
    header = next(line for line in out if line.startswith("| configuration | seeds | layout | wall |"))
    assert header.endswith(" | " + " | ".join(rows[1]["profile"]["categories_ms_per_step"]) + " |")
    assert "- bf16 + compile (model+loss), 1 seed: none (cuda kernels: none recorded)" in out
    (named,) = [line for line in out if line.startswith("- bf16 + compile (model+loss), 3 seeds: ")]
    assert named.count("`triton_poi_fused_") == 5 and "`triton_poi_fused_0`" not in named  # the five longest
