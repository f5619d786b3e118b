"""What a GPU window trains (issue #36): the gpu profile's queue (scripts/gpu_queue.py) or the paper
protocol's next seed, alone (items 5 and 6).

    python3 scripts/gpu_window.py --params params.gpu.yaml --paper-amp [--effects reports/effects.csv]
    python3 scripts/gpu_window.py --params params.gpu.yaml --paper params.paper-gpu.yaml
                                  [--effects reports/effects.csv] [--tests-run] [--fingerprints F] [--runs R]

The first prints the paper protocol's train.amp: true (bf16 autocast) where the published report's
precision check allows it (its rows in --effects under `protocol.bf16_allowed`, the report's own rule),
else false, and why on stderr. gpu_plan.sh writes the paper protocol's params with it
(`python -m pipeline.profiles paper-gpu --set train.amp=... --write params.paper-gpu.yaml`).

The second (with `--left S --bench DIR --jobs FILE`: the window's seconds, this GPU's bench
rows and measured jobs) prints `gpu ITEM...` (the gpu profile's queue, a variant's seeds stacked) or `paper V:S`
(the paper protocol's next seed, 640 epochs, trained alone with --paper's params), and why on stderr.
The paper protocol's turn comes after GROUPS' first three (Table 1, MultiMNIST, the precision check):
PAPER_FIRST (capsnet_r3_recon_official, capsnet_r3_recon) before §5.2, PAPER_REST after it, each
variant's three seeds in turn. Only where the precision check allows bf16 (one seed is about 10 min of
training at the H200's captured bf16 66k images/s, about four windows in fp32) and no CUDA tests share
the window's GPU (--tests-run: none kept at this code on this GPU, scripts/gpu_proof.py), and with --left only
where the seed fits what the window has left (gpu_queue.py's `fit`: else the window trains what comes
after the paper protocol, §5.2 while it is queued, rather than a seed it would refuse). Needs PyYAML
and this repository, not torch.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU machine runs it from a bare copy
from gpu_levers import bench_rows  # noqa: E402  (beside this script)
from gpu_queue import GROUPS, fit, job_rows, judged, queue, say_queued_again, stacked  # noqa: E402
from pipeline.core import lineage, protocol  # noqa: E402  (no torch)
from pipeline.core.params import precision_twins  # noqa: E402  (PyYAML's, no torch)

# the paper protocol (#36 item 5: 640 epochs, `make paper-gpu`), one seed a job and one job a window (a seed
# is about a whole window's training: docs/gpu-sessions.md); its first two variants after the precision
# check (which decides whether it trains in bf16, the only precision in which a seed fits a window) and
# before §5.2, the others after it; a variant's three seeds before the next variant's (three give a row its
# interval and verdict, one seed of each none)
PAPER_FIRST = ["capsnet_r3_recon_official", "capsnet_r3_recon"]
PAPER_REST = ["capsnet_r1_recon_official", "capsnet_r1_recon", "capsnet_r3_official", "capsnet_r3",
              "capsnet_r1_official", "capsnet_r1", "baseline_cnn"]
BEFORE_PAPER = 3  # GROUPS[:3] (Table 1, MultiMNIST, the precision check) come before the paper protocol, §5.2 after


def paper_precision(effects: Path, raw: dict) -> tuple[bool, str]:
    """Whether the paper protocol may train in bf16 autocast, and why: the precision check's rows of the
    published report's effects (reports/effects.csv: a variant against its precision twin, the same
    protocol in fp32) under `protocol.bf16_allowed`, the report's own rule; every row with an interval must
    allow it. No row, or none decided: fp32 (undecided)."""
    twins = precision_twins(raw)
    rows = []
    if effects.is_file():
        with effects.open() as f:
            rows = list(csv.DictReader(f))
    checks = [r for r in rows if twins.get(r["b"]) == r["a"]]

    def allowed(r: dict) -> bool | None:  # an empty cell: no interval (confounded, one seed)
        return protocol.bf16_allowed(float(r["ci_low"] or "nan"), float(r["ci_high"] or "nan"), int(float(r["n_seeds"] or 0)))

    decided = [(ok, r) for r in checks if (ok := allowed(r)) is not None]
    if not decided:
        return False, (f"the precision check has not decided ({len(checks)} row(s) in {effects}, none with an interval over "
                       f"{protocol.PRECISION_SEEDS} seeds a side): the paper protocol would train in fp32")
    ok = all(allowed for allowed, _ in decided)
    r = next((r for allowed, r in decided if not allowed), decided[0][1])
    return ok, (f"precision check, {r['a']} − {r['b']} = {float(r['our_delta']):+.2f} pp [{float(r['ci_low']):+.2f}, "
                f"{float(r['ci_high']):+.2f}] over {int(float(r['n_seeds']))} seeds a side: "
                + ("within the seed noise, the paper protocol trains in bf16 autocast" if ok else
                   "beyond the seed noise, the paper protocol would train in fp32"))


def window(runs: Path, gpu: dict, paper: dict, bf16: tuple[bool, str], table: dict | None = None,
           tables: list[dict] = (), tests_run: bool = False,
           price: Callable[[str], tuple[bool, str]] | None = None) -> tuple[str, list[str], list[str]]:
    """What a GPU window trains: ("gpu", its stacked items) or ("paper", one seed of the paper protocol), and
    why, a line each. The gpu profile's Table 1, MultiMNIST and precision check first; then the paper
    protocol's PAPER_FIRST, one seed a window, where the precision check allows bf16 (in fp32 a seed is
    about four windows' training: the H200's 14.35k images/s against 66.1k) and the GPU is the seed's alone
    (``tests_run``: the CUDA tests run beside the jobs this window, no earlier window having run them at
    this code on this GPU: scripts/gpu_proof.py) and, given ``price`` (`paper_price`), its seed fits the window
    (else the window trains what comes after it); then §5.2; then PAPER_REST. A window trains one protocol:
    a paper seed has the window to itself, and its run's folders are its variant's (models/V/seedS), which
    a gpu-profile run of the same variant would share."""
    short = queue(runs, gpu, table, judged(runs, gpu, table, tables))
    before = {v for group in GROUPS[:BEFORE_PAPER] for v in group}
    if [i for i in short if i.split(":")[0] in before]:
        return "gpu", stacked(short), []
    allowed, why = bf16
    if allowed and tests_run:
        allowed, why = False, ("the CUDA tests run this window, beside its jobs (no earlier window ran them at this code "
                               "on this GPU): the paper protocol's seed, which needs the GPU to itself, waits for a window "
                               "at code they have run")
    paper_items = queue(runs, paper, table, judged(runs, paper, table, tables, [PAPER_FIRST, PAPER_REST],
                                                   by_variant=True)) if allowed else []
    first = [i for i in paper_items if i.split(":")[0] in PAPER_FIRST]
    turn = first or ([] if short else paper_items)  # PAPER_FIRST's seeds before §5.2 (`short`), the others after it
    if turn:
        fits, priced = price(turn[0]) if price else (True, "")
        if fits:
            return "paper", turn[:1], [why, f"the paper protocol's next seed, alone this window: {turn[0]} "
                                            f"({len(turn) - 1} more after it)", *filter(None, [priced])]
        allowed, why = False, f"{priced}: this window trains what comes after the paper protocol"
    if short:
        return "gpu", stacked(short), [why] if not allowed else []
    return "gpu", [], [why] if not allowed else ["nothing left to train: every queued seed is published"]


SESSION_SECONDS = 15  # gpu_session.sh's work before its first job asks for its seconds: the data prepared on a fresh
# machine, the levers picked (estimated, not measured on a GPU)


def paper_price(paper: dict, rows: list[dict], jobs: list[dict], left: float,
                work: Path = Path(".")) -> Callable[[str], tuple[bool, str]]:
    """Whether a paper seed fits a window with ``left`` seconds at the plan (SESSION_SECONDS fewer when its
    job asks): gpu_queue.py's own `fit`, alone on the GPU, at the mode the paper params train in, and why. A
    seed an earlier call of this window started (training on: gpu_session.sh's ``work``/logs/detached/V-S.job;
    or stopped: its checkpoint in ``work``/checkpoints/V/) or trained (its config.json in ``work``/models/V/seedS/)
    goes on, as its job will: every call of a window plans the same window."""
    def price(item: str) -> tuple[bool, str]:
        variant, seed = item.split(":")
        if (work / "models" / variant / f"seed{seed}" / "config.json").is_file():
            return True, f"{item}: trained by an earlier call of this window, evaluated now"
        if (work / "logs" / "detached" / f"{variant}-{seed}.job").is_file():
            return True, f"{item}: started by an earlier call of this window, training on"
        start, why = fit(item, left - SESSION_SECONDS, paper, rows, 1, work / "checkpoints" / variant, jobs)
        return start is not None, why
    return price


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("reports/runs"))
    parser.add_argument("--params", type=Path, default=Path("params.gpu.yaml"), help="the gpu profile's params")
    parser.add_argument("--paper", type=Path, help="the paper protocol's params as the window would train it")
    parser.add_argument("--effects", type=Path, default=Path("reports/effects.csv"),
                        help="the published report's effects, whose precision check decides the paper protocol's precision")
    parser.add_argument("--paper-amp", action="store_true", help="print the paper protocol's train.amp (true: bf16 "
                        "autocast, where the precision check in --effects allows it; else false), the reason on stderr")
    parser.add_argument("--tests-run", action="store_true", help="the CUDA tests run this window beside its jobs (none "
                        "kept at this code on this GPU: scripts/gpu_proof.py), so no paper seed trains")
    parser.add_argument("--fingerprints", type=Path, help="the `capsnet fingerprint` table of the code that trains "
                        "(gpu_queue.py's --fingerprints)")
    parser.add_argument("--left", type=float, help="seconds the window has left: a paper seed is chosen only where it fits")
    parser.add_argument("--bench", type=Path, default=Path("logs/bench"), help="with --left: this GPU's bench rows")
    parser.add_argument("--jobs", type=Path, action="append", default=[], help="with --left: files of jobs measured on it")
    args = parser.parse_args()
    if not args.params.is_file():
        sys.exit(f"{args.params} does not exist: write it with `python -m pipeline.profiles gpu --write {args.params}`")
    raw = yaml.safe_load(args.params.read_text())
    if args.paper_amp:
        allowed, why = paper_precision(args.effects, raw)
        print(why, file=sys.stderr)
        print(str(allowed).lower())
        return
    if args.paper is None or not args.paper.is_file():
        sys.exit(f"--paper PARAMS is needed: write them with `python -m pipeline.profiles paper-gpu --set "
                 f"train.amp=$(python3 {sys.argv[0]} --paper-amp) --write params.paper-gpu.yaml`")
    if args.fingerprints and not args.fingerprints.is_file():
        sys.exit(f"{args.fingerprints} does not exist: write it with `capsnet fingerprint {args.fingerprints} --params {args.params}`")
    table = json.loads(args.fingerprints.read_text()) if args.fingerprints else None
    here = lineage.load_tables(args.fingerprints.parent) if args.fingerprints else []  # this host's, beside it
    paper = yaml.safe_load(args.paper.read_text())
    price = None if args.left is None else \
        paper_price(paper, bench_rows(args.bench), job_rows(args.jobs), args.left)
    kind, items, why = window(args.runs, raw, paper, paper_precision(args.effects, raw), table, here, args.tests_run, price)
    for params in (raw, paper) if kind == "paper" else (raw,):
        say_queued_again(args.runs, params, table, here)
    for line in why:
        print(line, file=sys.stderr)
    print(" ".join([kind, *items]))


if __name__ == "__main__":
    main()
