"""Pick the speed levers a GPU window trains with (issue #36, item 2): for each model the bench timed,
the fastest bench mode whose CUDA tests passed, written as a params file of its own.

    python3 scripts/gpu_levers.py --bench logs/bench --tests logs/gpu_tests.txt --params params.gpu.yaml

Reads every `capsnet bench` row under --bench (JSON lines) and the `pytest -v` log of the CUDA
tests (--tests), and for each model whose variant was benched (capsnet_r3_recon stands for every
CapsNet, baseline_cnn for the Table 1 CNN) writes params.gpu.<model>.yaml beside --params: the
profile's params with the train.* levers of the fastest eligible row (compile, compile_mode,
channels_last, cuda_graph, stack_layout); a precision twin (a variant whose own precision is not the
profile's: capsnet_r3_recon_fp32) gets params.gpu.<model>-<precision>.yaml, chosen among rows of its
precision (`lever_key`; `--key VARIANT` prints whose file a variant reads). Eligible: the row's precision is the
variant's (bf16 autocast is protocol, never a lever), it trained the seeds the window will put in one process (3 where some
stacked row beats every one-seed row, else 1: on the H200 one seed ran 2.1x three stacked), a captured mode
really captured, and every CUDA test that proves that mode on that variant passed (PROOFS;
a mode no CUDA test proves, such as torch.compile's own CUDA graphs, is never picked). The
profile's own setting competes as the row of its mode, so nothing is picked that the bench did not
show faster. A model with no eligible row keeps the profile where the tests prove the profile's own
mode, else trains eager at the profile's precision. Prints one line per model saying what it picked,
from what, and why.

    python3 scripts/gpu_levers.py --tests logs/gpu_tests.txt --check-run models/V/seedS/config.json

exits 1, naming why, where the tests do not prove the speed settings a trained run recorded
(gpu_session.sh then trains that seed again with the levers they do prove).

Needs PyYAML and this repository on the path (gpu_session.sh sets PYTHONPATH), not torch, DVC or MLflow.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

from pipeline.core import protocol
from pipeline.core.params import BENCH_MODES, bench_mode_name

BENCHED = {"capsnet": "capsnet_r3_recon", "baseline_cnn": "baseline_cnn"}  # model: the variant timed for it
# the CUDA tests (pytest id prefixes, "{v}" the variant) that prove a bench mode computes the same step;
# the eager modes need none (no lever: what the CPU tests check, at the profile's precision); a mode
# not listed is proven by none
PROOFS = {
    "fp32": [],
    "bf16": [],
    "compile": ["test_gpu.py::test_compiled_fp32_step_matches_eager_fp32[{v}]"],  # the paper-gpu profile's CapsNets
    "bf16-compile": ["test_gpu.py::test_bf16_compiled_step_matches_eager_fp32[{v}]",
                     "test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[{v}]"],
    "bf16-cl": ["test_gpu.py::test_bf16_channels_last_step_matches_eager_fp32[{v}]"],
    "bf16-compile-cl": ["test_gpu.py::test_bf16_channels_last_step_matches_eager_fp32[{v}]",
                        "test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[{v}]"],
    "bf16-capture": ["test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes[{v}-bf16-eager"],
    "bf16-compile-capture": ["test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
                             "[{v}-bf16-compiled",
                             "test_gpu.py::test_compiled_bf16_stacked_training_steps_stay_finite[{v}]"],
    # fp32 (the precision check's twin, capsnet_r3_recon_fp32; the paper-gpu profile)
    "capture": ["test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes[{v}-fp32-eager"],
    "compile-capture": ["test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
                        "[{v}-fp32-compiled", "test_gpu.py::test_compiled_fp32_step_matches_eager_fp32[{v}]"],
}
# a stack layout whose seeds run side by side needs a proof of its own where seeds stack: the captured step
# in that layout against the eager loop layout (tests/test_capture_gpu.py), at the mode's precision, compiled
# or eager as the mode is ("{p}", "{c}"); the other layouts run one stream and their modes' proofs hold
LAYOUT_PROOFS = {"streams": "test_capture_gpu.py::test_the_captured_step_replays_what_the_eager_step_computes"
                            "[{v}-{p}-{c}-streams"}
STACKED = 3  # the seeds a window trains in one process (scripts/gpu_queue.py --stack)


def levers(mode: str) -> dict:
    """The train.* speed settings of a bench mode (pipeline.core.params.BENCH_MODES)."""
    m = BENCH_MODES[mode]
    return {"compile": m.compile_mode is not None, "compile_mode": m.compile_mode or "default",
            "channels_last": m.channels_last, "cuda_graph": m.cuda_graph}


def test_outcomes(log: str) -> dict[str, str]:
    """{test id (from its file name on): PASSED | FAILED | ERROR | SKIPPED} from a `pytest -v` log, as
    pytest writes it ("tests/t.py::id PASSED [ 5%]") or with pytest-xdist's -n ("[gw0] [ 5%] PASSED
    tests/t.py::id"); a test reported twice (a failure's summary line too) keeps its worse outcome."""
    outcomes: dict[str, str] = {}
    for test, outcome in [*re.findall(r"(test_\w+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED)\b", log),
                          *[(t, o) for o, t in re.findall(r"\b(PASSED|FAILED|ERROR|SKIPPED) \S*?(test_\w+\.py::\S+)", log)]]:
        if outcomes.get(test, "PASSED") == "PASSED":
            outcomes[test] = outcome
    return outcomes


def proven(mode: str | None, variant: str, outcomes: dict[str, str], layout: str = "fused") -> tuple[bool, str]:
    """Whether every CUDA test proving ``mode`` on ``variant``, with seeds stacked in ``layout`` (give
    "fused" for one seed: a stack of one runs no layout), ran and passed; why not, if not."""
    if mode not in PROOFS:
        return False, f"no CUDA test proves {mode or 'these settings'}"
    speed = BENCH_MODES[mode]
    names = {"v": variant, "p": "bf16" if speed.amp else "fp32",
             "c": "eager" if speed.compile_mode is None else "compiled"}
    proofs = [*PROOFS[mode], *([LAYOUT_PROOFS[layout]] if layout in LAYOUT_PROOFS else [])]
    for prefix in proofs:
        prefix = prefix.format(**names)
        ran = {t: o for t, o in outcomes.items() if t.startswith(prefix)}
        if not ran:
            return False, f"{prefix}… did not run"
        bad = [t for t, o in ran.items() if o != "PASSED"]
        if bad:
            return False, f"{bad[0]} {ran[bad[0]]}"
    return True, ""


def trained_mode(train: dict, model: str) -> str | None:
    """The bench mode of the speed settings a params file's train section trains ``model`` with (the
    inverse of `levers`; CNNs compile only with compile_cnns), None if no bench mode is those settings."""
    compiled = train["compile"] and (model == "capsnet" or train.get("compile_cnns", True))
    return bench_mode_name(train["amp"], train.get("compile_mode", "default") if compiled else None,
                           train.get("channels_last", False), train.get("cuda_graph", False))


def variant_train(raw: dict, variant: str) -> dict:
    """The train section a params mapping trains ``variant`` with: its own precision where it names one
    (a precision twin such as capsnet_r3_recon_fp32 trains fp32 under the bf16 gpu profile)."""
    return {**raw["train"], "amp": protocol.variant_amp(raw, variant)}


def lever_key(raw: dict, variant: str) -> str:
    """Whose levers a variant trains with (params.gpu.<key>.yaml): its model's, or, where its own
    precision is not the profile's, its model's at that precision (`capsnet-fp32`): bf16 autocast is
    protocol, never a lever, so each precision has its own fastest mode."""
    model, amp = raw["variants"][variant]["model"], protocol.variant_amp(raw, variant)
    return model if amp == bool(raw["train"].get("amp", False)) else f"{model}-{'bf16' if amp else 'fp32'}"


def lever_keys(raw: dict) -> dict[str, tuple[str, dict]]:
    """{lever key: (model, its train section)} for every benched model at the profile's precision and
    every precision twin of one (`lever_key`)."""
    keys = {model: (model, raw["train"]) for model in BENCHED}
    for variant, spec in raw["variants"].items():
        if spec["model"] in BENCHED:
            keys.setdefault(lever_key(raw, variant), (spec["model"], variant_train(raw, variant)))
    return keys


def run_unproven(config: dict, outcomes: dict[str, str]) -> str:
    """Why the speed settings a trained run recorded (its config.json's "config") are not proven by the
    CUDA tests' ``outcomes``, or "" where they are: its bench mode's proofs on the variant timed for its
    model. A model no variant is timed for (BENCHED) keeps the profile, as the levers do: "" too."""
    cfg = config["config"]  # its "compile" is what the run did (compile_cnns resolved)
    if cfg["model"] not in BENCHED:
        return ""
    layout = cfg.get("stack_layout", "fused") if len(config.get("stacked_seeds", [0])) > 1 else "fused"
    return proven(trained_mode(cfg, cfg["model"]), BENCHED[cfg["model"]], outcomes, layout)[1]


def bench_rows(path: Path) -> list[dict]:
    """Every `capsnet bench` row in a file, or in a folder's *.jsonl files and the *.jsonl.tmp of a bench
    the deadline cut short (its rows are whole measurements); a line that is not a JSON row (a torn
    last line) is skipped. [] when the path does not exist."""
    files = sorted([*path.glob("*.jsonl"), *path.glob("*.jsonl.tmp")]) if path.is_dir() else [path] if path.is_file() else []
    rows = []
    for line in (line for f in files for line in f.read_text().splitlines()):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def fallback(outcomes: dict[str, str], train: dict, model: str, why: str) -> tuple[dict | None, str]:
    """No bench row to choose from: the profile's settings where its mode is proven, else eager at its
    precision (issue #36: a variant whose compiled or captured path fails trains uncompiled at once)."""
    mode = trained_mode(train, model)
    ok, not_proven = proven(mode, BENCHED[model], outcomes, train.get("stack_layout", "fused"))
    if ok:
        return None, f"{model}: {why}; the profile's {mode} stays"
    eager = "bf16" if train["amp"] else "fp32"
    return ({**levers(eager), "stack_layout": "fused"},
            f"{model}: {why}; the profile's {mode} is not proven either ({not_proven}): {eager}, eager")


def choose(rows: list[dict], outcomes: dict[str, str], train: dict, model: str) -> tuple[dict | None, str]:
    """The fastest eligible row for ``model`` (see the module) and a line saying why; None: keep the profile."""
    variant = BENCHED[model]
    mine = [r for r in rows if r.get("variant") == variant and r.get("mode") in PROOFS
            and BENCH_MODES[r["mode"]].amp == train["amp"]  # bf16 autocast is protocol, never a lever
            and r.get("seeds", 1) in (1, STACKED)]
    if not mine:
        return fallback(outcomes, train, model, f"no bench row of {variant} in a proven mode at the profile's precision")

    def why_not(row: dict) -> str:  # "" where the row's mode passed its CUDA tests and ran as it says
        if row["mode"].endswith("-capture") and not row.get("captured"):
            return "the bench ran it uncaptured"
        return proven(row["mode"], variant, outcomes, row.get("stack", "fused") if row.get("seeds", 1) > 1 else "fused")[1]
    eligible = [r for r in mine if not why_not(r)]
    if not eligible:
        return fallback(outcomes, train, model, f"no bench mode of {variant} passed its CUDA tests "
                                                f"({mine[0]['mode']}: {why_not(mine[0])})")
    # the seeds the window will put in one process (gpu_queue.stacking_pays): three where a stacked row
    # beats every one-seed row, else one; then only rows of that many seeds compete
    fastest = {n: max((r["train_images_per_s"] for r in eligible if r.get("seeds", 1) == n), default=0.0)
               for n in (1, STACKED)}
    seeds = STACKED if fastest[STACKED] > fastest[1] else 1
    eligible = [r for r in eligible if r.get("seeds", 1) == seeds]
    refused = [r for r in mine if r.get("seeds", 1) == seeds and why_not(r)]
    best = max(eligible, key=lambda r: r["train_images_per_s"])
    default = [r for r in eligible if r["mode"] == trained_mode(train, model) and r.get("stack", "fused") == "fused"]
    than = f"; the profile's {default[0]['mode']}: {default[0]['train_images_per_s']:,.0f}" if default else ""
    line = (f"{model}: {best['mode']}, stack {best.get('stack', 'fused')}: {best['train_images_per_s']:,.0f} "
            f"images/s ({variant}, {seeds} seed{'s' if seeds > 1 else ''}{than}; "
            f"{len(refused)} mode(s) not proven on CUDA)")
    return {**levers(best["mode"]), "stack_layout": best.get("stack", "fused")}, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", type=Path, default=Path("logs/bench"), help="a folder of bench JSON lines, or one file")
    parser.add_argument("--tests", type=Path, default=Path("logs/gpu_tests.txt"), help="the CUDA tests' pytest -v log")
    parser.add_argument("--params", type=Path, default=Path("params.gpu.yaml"), help="the profile's params")
    parser.add_argument("--key", metavar="VARIANT", help="only print whose levers VARIANT trains with (`lever_key`)")
    parser.add_argument("--check-run", type=Path, metavar="CONFIG_JSON",
                        help="only check a trained run's speed settings against the CUDA tests: exit 1 naming why not")
    args = parser.parse_args()
    outcomes = test_outcomes(args.tests.read_text()) if args.tests.is_file() else {}
    if args.check_run:
        why = run_unproven(json.loads(args.check_run.read_text()), outcomes)
        sys.exit(f"{args.check_run}: {why}" if why else 0)
    if not args.params.is_file():
        sys.exit(f"{args.params} does not exist: write it with `python -m pipeline.profiles gpu --write {args.params}`")
    raw = yaml.safe_load(args.params.read_text())
    if args.key:
        print(lever_key(raw, args.key))
        return
    rows = bench_rows(args.bench)
    for key, (model, train) in lever_keys(raw).items():
        out = args.params.with_name(f"{args.params.stem}.{key}.yaml")
        picked, line = choose(rows, outcomes, train, model)
        print(line if key == model else f"{key} ({'bf16' if train['amp'] else 'fp32'} twin) — {line}")
        if picked is None:
            out.unlink(missing_ok=True)
            continue
        chosen = {**raw, "train": {**raw["train"], **picked}}
        if model != "capsnet":
            chosen["train"]["compile_cnns"] = picked["compile"]
        out.with_suffix(".tmp").write_text(yaml.safe_dump(chosen, sort_keys=False))
        out.with_suffix(".tmp").replace(out)  # whole: jobs already training read it as they start


if __name__ == "__main__":
    main()
