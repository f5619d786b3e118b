"""reports/benchmarks.md's section for one GPU model, written from the bench rows its windows kept
(reports/bench/<model>/*.jsonl, scripts/gpu_import.sh), with issue #36's speed targets marked.

    python3 scripts/bench_table.py reports/bench/nvidia-h100-80gb-hbm3 >> reports/benchmarks.md

One table per benched variant for its one-seed rows, in the form pipeline/report/costs.py reads
(`| capsnet-repro <configuration> | images/s | …`: the report prices seeds with them), and one for
its stacked rows (`| stacked …`, which the costs leave alone: they are aggregates of several seeds), and
where a step's time goes for the rows a `+profile` entry profiled (`capsnet bench --profile-steps`).
A captured mode that ran uncaptured (`captured: false`: the capture failed, or no CUDA) says so. Needs only this
repository (no torch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpu_levers import bench_rows  # noqa: E402  (beside this script)
from pipeline.core.params import BENCH_MODES  # noqa: E402
from pipeline.report.costs import CONFIGURATIONS  # noqa: E402  (how the report looks a row up)

TARGETS = {1: 75_000, 3: 150_000}  # issue #36: capsnet_r3_recon's images/s, one seed and three stacked
TARGET_VARIANT = "capsnet_r3_recon"


def label(row: dict) -> str:
    """How a row's mode reads in the table: a mode of bf16 and compile alone by the configuration name the
    report looks its speed up by (pipeline/report/costs.py), any other by its name and levers."""
    m = BENCH_MODES[row["mode"]]
    if m.compile_mode in (None, "default") and not m.channels_last and not m.cuda_graph:
        return CONFIGURATIONS[m.amp, m.compile_mode is not None] + (" (model+loss)" if m.compile_mode else "")
    levers = ["bf16" if m.amp else "fp32"] + ([f"compile {m.compile_mode}"] if m.compile_mode else []) \
        + (["NHWC convolutions"] if m.channels_last else []) + (["the whole step as one CUDA graph"] if m.cuda_graph else [])
    return f"{row['mode']}: {', '.join(levers)}" + (" (ran uncaptured)" if m.cuda_graph and not row.get("captured") else "")


def rows_of(folder: Path) -> list[dict]:
    """The folder's rows, the last of each (variant, mode, seeds, layout) kept (an entry benched again)."""
    kept = {(r["variant"], r["mode"], r.get("seeds", 1), r.get("stack", "")): r for r in bench_rows(folder)}
    return list(kept.values())


def number(x, digits: int = 0) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def profile_table(rows: list[dict]) -> list[str]:
    """Where a step's time went in the rows benched with --profile-steps (`+profile` entries): per
    configuration the wall and the device's busy milliseconds per step, the busy time by category,
    then each configuration's longest kernels; nothing when no row was profiled."""
    profiled = [r for r in rows if r.get("profile")]
    if not profiled:
        return []
    cats = list(next((r["profile"]["categories_ms_per_step"] for r in profiled if r["profile"].get("busy_ms_per_step") is not None),
                     None) or ())
    out = ["", f"Where a step's time goes (`capsnet bench --profile-steps`: torch.profiler over "
               f"{profiled[0]['profile']['steps']} steps after the timed ones; ms per step; busy: the kernels' summed time):",
           "", "| configuration | seeds | layout | wall | busy (of wall) | kernels | " + " | ".join(cats) + " |",
           "|---|---|---|---|---|---|" + "---|" * len(cats)]
    for r in profiled:
        p = r["profile"]
        if "error" in p:
            out.append(f"| {label(r)} | {r.get('seeds', 1)} | {r.get('stack', '–')} | – | failed: {p['error']} | – | "
                       + " | ".join("–" for _ in cats) + " |")
            continue
        busy = "none recorded" if p["busy_ms_per_step"] is None else \
            f"{p['busy_ms_per_step']:.2f} ({p['busy_ms_per_step'] / p['wall_ms_per_step']:.0%})"
        spread = [number((p["categories_ms_per_step"] or {}).get(c), 2) for c in cats]
        out.append(f"| {label(r)} | {r.get('seeds', 1)} | {r.get('stack', '–')} | {p['wall_ms_per_step']:.2f} | {busy} | "
                   f"{number(p['calls_per_step'])} | " + " | ".join(spread) + " |")
    out += ["", "Longest kernels (ms per step, calls per step):"]
    for r in (r for r in profiled if "error" not in r["profile"]):
        top = "; ".join(f"`{k['name'][:60]}` {k['ms_per_step']:.3f} ×{k['calls_per_step']:g}" for k in r["profile"]["top"][:5]) \
            or f"none ({r['profile']['activity']})"
        out.append(f"- {label(r)}, {r.get('seeds', 1)} seed{'s' if r.get('seeds', 1) > 1 else ''}: {top}")
    return out


def section(folder: Path) -> str:
    rows = rows_of(folder)
    if not rows:
        raise SystemExit(f"{folder} holds no bench rows (*.jsonl): run scripts/gpu_import.sh on a GPU window's folders first")

    def facts(key: str) -> str:
        return ", ".join(sorted({str(r.get(key, "unrecorded")) for r in rows}))

    lines = [f"## GPU: one {facts('device')} (device tool, {facts('date')})", "",
             f"Rows: `{folder}/*.jsonl`, from `capsnet bench … --steps 40 --warmup 5 --params params.gpu.yaml` inside "
             f"`scripts/gpu_session.sh` (gpu profile, batch {facts('batch')}); commit {facts('commit')}, torch {facts('torch')}.",
             "Written by `scripts/bench_table.py`."]
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant]
        single = [r for r in mine if r.get("seeds", 1) == 1]
        stacked = [r for r in mine if r.get("seeds", 1) > 1]
        lines += ["", f"### {variant} ({mine[0].get('flop_per_image_train', 0) / 1e9:.2f} GFLOP per training image)"]
        if single:
            lines += ["", "| configuration | train images/s | ms/step | s/epoch (60k) | TFLOP/s | peak MiB | first step (s) | vs reference |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in single:
                name = "reference (eager fp32, DataLoader)" if r["mode"] == "reference" else f"capsnet-repro {label(r)}"
                lines.append(f"| {name} | {number(r['train_images_per_s'])} | {number(r.get('ms_per_step'), 2)} | "
                             f"{number(r.get('s_per_epoch'), 2)} | {number(r.get('tflop_per_s'), 1)} | "
                             f"{number(r.get('peak_memory_mb'))} | {number(r.get('first_step_s'), 1)} | "
                             f"{number(r.get('speedup_vs_reference'), 2)} |")
        if stacked:
            lines += ["", "| stacked configuration | seeds | layout | images/s (all seeds) | per seed | vs one seed | peak MiB | first step (s) |",
                      "|---|---|---|---|---|---|---|---|"]
            for r in stacked:
                lines.append(f"| stacked {label(r)} | {r['seeds']} | {r.get('stack', 'fused')} | {number(r['train_images_per_s'])} | "
                             f"{number(r.get('per_seed_images_per_s'))} | {number(r.get('speedup_vs_separate'), 2)} | "
                             f"{number(r.get('peak_memory_mb'))} | {number(r.get('first_step_s'), 1)} |")
        lines += profile_table(mine)
    lines += ["", f"Targets (issue #36, {TARGET_VARIANT}, any measured mode):"]
    for seeds, target in TARGETS.items():
        timed = [r for r in rows if r["variant"] == TARGET_VARIANT and r.get("seeds", 1) == seeds and r["mode"] != "reference"]
        best = max(timed, key=lambda r: r["train_images_per_s"], default=None)
        what = f"{seeds} seed{'s stacked' if seeds > 1 else ''} ≥ {target:,} images/s"
        lines.append(f"- {what}: not measured" if best is None else
                     f"- {what}: **{'reached' if best['train_images_per_s'] >= target else 'missed'}**, "
                     f"{best['train_images_per_s']:,.0f} ({label(best)}{', ' + best['stack'] if seeds > 1 else ''})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="reports/bench/<GPU model>")
    print(section(parser.parse_args().folder), end="")


if __name__ == "__main__":
    main()
