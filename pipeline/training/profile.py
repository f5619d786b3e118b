"""`capsnet bench --profile-steps N`: where one training step's time goes, from torch.profiler over N steps
of the step the bench just timed (compiled and captured as it trained).

On CUDA every kernel the device ran is counted, those a CUDA graph replays included (CUPTI records
them; they have no CPU operator to hang from, so they are read as device events, not through the
operators' tree). The row says how long the device was busy per step against the step's wall time:
busy well under wall means the GPU waits (launches, the host, synchronisation), busy near wall that
the kernels themselves are the time, and the categories and top kernels say which. On a CPU the
operators' self time stands in for the kernels (what a test can run).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

TOP = 8  # kernels listed by name, the longest first
NAME_CHARS = 100  # a kernel's name as kept: C++ template names run to thousands of characters

# (category, substrings of a kernel's or operator's name, lower-cased), the first match wins: a
# convolution's implicit GEMM is a convolution, a fused Adam's elementwise kernel the optimiser, and an
# inductor kernel is fused whatever origin its name cites ("triton_poi_fused_convolution_0": a bias)
# but for its matrix-product templates
CATEGORIES = (
    ("copy/fill", ("memcpy", "memset", "fillfunctor", "aten::copy_", "aten::fill_", "aten::zero_")),
    ("optimizer", ("adam", "multi_tensor_apply")),
    ("matmul", ("triton_tem",)),
    ("fused (triton)", ("triton",)),
    ("convolution", ("conv", "implicit_gemm", "fprop", "dgrad", "wgrad", "nchwtonhwc", "nhwctonchw", "cudnn")),
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm")),
    ("elementwise/reduction", ("elementwise", "reduce", "softmax", "at::native", "aten::")),
)
SHOWN = ("convolution", "matmul", "fused (triton)", "elementwise/reduction", "optimizer", "copy/fill", "other")  # row order


def category(name: str) -> str:
    """The category a kernel (or, on a CPU, an operator) by this name belongs to, else "other"."""
    low = name.lower()
    return next((cat for cat, keys in CATEGORIES if any(k in low for k in keys)), "other")


def summarize(durations: dict[str, tuple[int, float]], steps: int, wall_s: float, activity: str) -> dict:
    """The profile of ``steps`` steps from each kernel's (calls, total µs) and the steps' wall seconds:
    per step, the wall and busy milliseconds, the kernels launched (on a CPU: operators called), the
    milliseconds of each category (every category, so the rows of several configurations line up) and
    the TOP longest kernels."""
    per_step = 1000 * steps  # µs in all -> ms per step
    wall_ms = round(1000 * wall_s / steps, 4)
    if not durations:  # CUPTI recorded nothing (a container without its rights, say): no zeros that read as idle
        return {"activity": f"{activity}: none recorded", "steps": steps, "wall_ms_per_step": wall_ms,
                "busy_ms_per_step": None, "calls_per_step": None, "categories_ms_per_step": None, "top": []}
    busy = sum(us for _, us in durations.values())
    by_category = dict.fromkeys(SHOWN, 0.0)
    for name, (_, us) in durations.items():
        by_category[category(name)] += us / per_step
    top = sorted(durations.items(), key=lambda kv: -kv[1][1])[:TOP]
    return {"activity": activity, "steps": steps, "wall_ms_per_step": wall_ms,
            "busy_ms_per_step": round(busy / per_step, 4),
            "calls_per_step": round(sum(calls for calls, _ in durations.values()) / steps, 1),
            "categories_ms_per_step": {cat: round(ms, 4) for cat, ms in by_category.items()},
            "top": [{"name": name[:NAME_CHARS], "category": category(name), "calls_per_step": round(calls / steps, 2),
                     "ms_per_step": round(us / per_step, 4)} for name, (calls, us) in top]}


def device_durations(events) -> dict[str, tuple[int, float]]:
    """Each CUDA kernel's (calls, total µs) among a profile's events, memory copies and fills included;
    not the ranges record_function marks on the device's timeline (they span kernels already counted)."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            out[e.name][0] += 1
            out[e.name][1] += e.time_range.elapsed_us()
    return {name: (calls, us) for name, (calls, us) in out.items()}


def operator_durations(prof) -> dict[str, tuple[int, float]]:
    """Each CPU operator's (calls, self µs): the time in it and in none of the operators it called."""
    return {e.key: (e.count, e.self_cpu_time_total) for e in prof.key_averages() if e.self_cpu_time_total > 0}


def profile_steps(step: Callable[[], None], steps: int, device: torch.device) -> dict:
    """Run ``step`` ``steps`` times under torch.profiler (the device synchronised at the edges) and
    summarise where the time went (`summarize`)."""
    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    if on_cuda:
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if on_cuda:
            torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - t0
    durations = device_durations(prof.events()) if on_cuda else operator_durations(prof)
    return summarize(durations, steps, wall_s, "cuda kernels" if on_cuda else "cpu operators (self time)")
