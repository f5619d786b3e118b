"""The GPU queue (issue #36, was #24): every (variant, seed) the published report still lacks under the gpu
profile's protocol, most needed first, as `VARIANT:SEED` words for gpu_session.sh --train.

    python3 scripts/gpu_queue.py [--runs reports/runs] [--params params.gpu.yaml] [--limit N]
                                 [--fingerprints fingerprints/COMMIT.json]

A run counts as published when a record of it in reports/runs (models/VARIANT/seedS/config.json, or
one a later run set aside under earlier/) was trained under the protocol the params give for that
variant (pipeline.core.protocol, the report's own definition: profile, epochs, batch, every lr*
setting, precision) and, with --fingerprints (the `capsnet fingerprint` table of the code that will
train, which gpu_plan.sh writes first), by the same training code: the fingerprint it recorded is the
table's, in the table's environment (the report's rows are one fingerprint each; a record without one
predates them and its protocol decides). So runs of an older protocol (the 2026-11-23 runs, cut at 50
epochs of the 640-epoch schedule), or of training code a later commit changed, are queued again and
the next Table 1 comes from one protocol and one fingerprint; the precision check's fp32 twin and its
bf16 original never displace each other from the queue. Needs only PyYAML and this repository (the
GPU machine has no DVC or MLflow).
Order (GROUPS): the five Table 1 rows and their four official twins (seed 0 of each first, then 1,
then 2), then MultiMNIST's three variants, then capsnet_r3_recon_fp32 (the precision check, #36 item
6), then §5.2's two; with --stack one item per variant, its missing seeds trained stacked in one
process (`V:0,1,2`). Whether a window trains this queue or the paper protocol: scripts/gpu_window.py.

    python3 scripts/gpu_queue.py --bridges --fingerprints fingerprints/COMMIT.json [--runs R] [--params P]

prints `COMMIT VARIANT...` per commit whose fingerprint table in that table's environment would carry
published records there (`bridges`); the window computes them on its host (scripts/gpu_plan.sh), and the
queue reads every table beside --fingerprints' as well as the published ones.

    python3 scripts/gpu_queue.py --fit V:0,1,2 --left S --params P [--bench logs/bench] [--parallel N]
                                 [--checkpoints checkpoints/V]

prints what of that item to start with S seconds of the window left (gpu_session.sh asks before each
job): the item, its first seeds only, or nothing (the reason goes to stderr). A run the window's end
cuts off is lost (its checkpoint stays on the machine given back), and it slows the runs beside it
into the same end, so a job starts only when its estimate fits: epochs × images per epoch (× the
image area over MNIST's 28×28, MultiMNIST 36, §5.2 40, or × the training FLOP per image over the
benched variant's where that is more: `image_cost`) per seed over the bench row of the settings it
trains with (params P's levers; capsnet_r3_recon's rows for every CapsNet, baseline_cnn's for the
CNNs), the GPU shared by N processes, plus EVAL_SECONDS per seed and the process's STARTUP_SECONDS. No
bench row: no estimate, it starts. A variant's seeds train stacked unless that is slower than one
process per seed, one after another (`stacking_pays`).

A job this GPU model already ran is priced by its measured seconds instead (--jobs, `measured_seconds`):
the bench row of capsnet_r3_recon over-priced the H200 window of 2026-11-27's seeds (155 s estimated,
118 s trained and evaluated at routing 3, 49-87 s at routing 1) and left a routing-1 seed unstarted
with 133 s to spare.

    python3 scripts/gpu_queue.py --record V:S1[,S2] --seconds T --parallel N --params P --jobs FILE

appends that measurement (gpu_session.sh, after each job that trained and evaluated); gpu_import.sh keeps
them in reports/bench/<model>/jobs/, and the next window on that model reads them.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the GPU machine runs it from a bare copy
from gpu_levers import BENCHED, bench_rows, trained_mode, variant_train  # noqa: E402  (beside this script; PyYAML's, no torch)
from pipeline.core import lineage, protocol, registry  # noqa: E402  (names, image sizes, protocols: no torch)

# the queue's groups, most needed first: Table 1's five rows and their four official twins (#36 item 3),
# MultiMNIST (item 4), the precision check's fp32 twin of capsnet_r3_recon (item 6: the paper protocol
# trains in bf16 only once it shows bf16 within the seed noise), §5.2 (item 7)
GROUPS = [["capsnet_r3_recon", "capsnet_r3_recon_official", "capsnet_r1_recon", "capsnet_r1_recon_official",
           "capsnet_r3", "capsnet_r3_official", "capsnet_r1", "capsnet_r1_official", "baseline_cnn"],
          ["multimnist_r3_recon", "multimnist_r1_recon", "multimnist_baseline"],
          ["capsnet_r3_recon_fp32"],
          ["capsnet_affnist", "cnn_affnist"]]
SEEDS = (0, 1, 2)
EARLIER = "earlier"  # pipeline.report.publish.EARLIER (that module needs torch; tests/test_gpu_window.py checks they agree)


def published(runs: Path, variant: str, seed: int) -> list[dict]:
    """Every published record (config.json) of (variant, seed): reports/runs/models/V/seedS and the
    records later runs set aside (reports/runs/earlier/*/models/V/seedS)."""
    configs = [runs / "models" / variant / f"seed{seed}" / "config.json",
               *sorted(runs.glob(f"{EARLIER}/*/models/{variant}/seed{seed}/config.json"))]
    return [json.loads(c.read_text()) for c in configs if c.is_file()]


def same_training(config: dict, variant: str, table: dict | None, published_tables: list[dict] = ()) -> bool:
    """Whether a record was trained by the code whose fingerprint ``table`` holds (none: not checked):
    its fingerprint in the table's environment (the one it recorded, or its commit's there through
    ``published_tables``: pipeline.core.lineage) is the table's, or it recorded none (it predates them)."""
    if table is None or config.get("training_fingerprint") is None:
        return True
    theirs = table["fingerprints"].get(variant)
    return theirs is not None and lineage.fingerprint_in(config, variant, table["environment"], [*published_tables, table]) == theirs


def planned(runs: Path, raw: dict, groups: list[list[str]] | None = None,
            by_variant: bool = False) -> list[tuple[str, int, list[dict]]]:
    """Every (variant, seed) of ``groups`` (GROUPS), in their order (seed 0 of each variant of a group
    first; ``by_variant``: each variant's seeds before the next variant's), with its published records
    under the protocol the params mapping ``raw`` trains it with."""
    pairs = []
    for group in GROUPS if groups is None else groups:
        pairs += [(v, s) for v in group for s in SEEDS] if by_variant else [(v, s) for s in SEEDS for v in group]
    return [(v, s, [c for c in published(runs, v, s) if protocol.recorded(c) == protocol.planned(raw, v)])
            for v, s in pairs if v in raw["variants"]]


def judged(runs: Path, raw: dict, table: dict | None = None, tables: list[dict] = (),
           groups: list[list[str]] | None = None, by_variant: bool = False) -> list[tuple[str, bool, bool]]:
    """Every (variant, seed) of ``groups`` (GROUPS) as ("V:S", published under the params' protocol, by the
    training code ``table`` fingerprints (none: not checked)), the records and tables read once; ``tables``:
    more than the published ones (this host's, `bridges`)."""
    known = [*lineage.load_tables(runs / "fingerprints"), *tables]  # they carry records of an earlier environment over
    return [(f"{v}:{s}", bool(records), any(same_training(c, v, table, known) for c in records))
            for v, s, records in planned(runs, raw, groups, by_variant)]


def bridges(runs: Path, raw: dict, table: dict, tables: list[dict] = ()) -> list[tuple[str, list[str]]]:
    """The commits, with their variants, whose fingerprint table in ``table``'s environment would carry
    published records under the params' protocol there (pipeline.core.lineage): records whose fingerprint
    is not known in that environment, though a table of their own commit in their own environment
    vouches for it; the commit with the most such records first. The GPU window computes them on its own
    host (scripts/fingerprint_at.py, scripts/gpu_plan.sh): the host's processor and C library decide
    fingerprints, so a table computed elsewhere would not carry them."""
    known = [*lineage.load_tables(runs / "fingerprints"), *tables, table]
    needed: dict[str, list[str]] = {}  # commit: a variant per record it would carry
    for v, _, records in planned(runs, raw):
        for c in records:
            if lineage.vouched(c, v, known) and lineage.fingerprint_in(c, v, table["environment"], known) is None:
                needed.setdefault(lineage.recorded(c)[2], []).append(v)
    return [(commit, list(dict.fromkeys(vs))) for commit, vs in sorted(needed.items(), key=lambda item: -len(item[1]))]


def queue(runs: Path, raw: dict, table: dict | None = None, verdicts=None) -> list[str]:
    """Every (variant, seed) of GROUPS, in their order, with no published record under the protocol
    the params train it with and, given a fingerprint ``table``, of the training code it fingerprints."""
    return [item for item, _, same in verdicts or judged(runs, raw, table) if not same]


def other_training(runs: Path, raw: dict, table: dict, verdicts=None) -> list[str]:
    """The (variant, seed)s published under the params' protocol by training code other than ``table``'s,
    which `queue` therefore lists again."""
    return [item for item, has_record, same in verdicts or judged(runs, raw, table) if has_record and not same]


def stacked(items: list[str]) -> list[str]:
    """One word per variant, its missing seeds stacked in one process (`capsnet train V 0,1,2`, issue
    #23), in the order the variants' first items come."""
    seeds: dict[str, list[str]] = {}
    for item in items:
        variant, seed = item.split(":")
        seeds.setdefault(variant, []).append(seed)
    return [f"{v}:{','.join(sorted(s, key=int))}" for v, s in seeds.items()]


MNIST_SIDE = registry.entry("table1").image_size  # the bench rows' images (capsnet_r3_recon, baseline_cnn)
EVAL_SECONDS = 30  # a seed's evaluation, MultiMNIST's 1M test pairs the longest (about 19 s, estimated, not timed)
STARTUP_SECONDS = 25  # a process's start to its first epoch: 22-24 s on the H200 (2026-11-26, capsnet_r3_recon
# seed 0: 71 s of wall time, 46.8 s of it in 30 epochs; imports, data, the fingerprint, compile from the cache)
MARGIN = 1.1  # an estimate's head room
EPOCH_EVAL_SECONDS = 0.05  # a seed's test evaluation after every epoch (and its checkpoint every 5th): the H200's
# 2026-11-27 runs logged their epochs 0.03 s further apart than the epochs' own training time at routing 1 alone and
# 0.10 s with two processes sharing the GPU at routing 3 (`python3 scripts/epoch_overhead.py --commit fb5b23c`; 32 s
# of the paper protocol's 640 epochs)
UNPRICED_EPOCHS = 100  # a job this long with no bench row to price it never starts: the window's end would lose it whole
FLOPS = Path(__file__).resolve().parents[1] / "reports" / "bench" / "flop_per_image.json"  # scripts/flop_table.py


@functools.cache
def flop_table() -> dict[str, float]:
    """FLOPS's {variant: training FLOP per image}, read once a process ({} where the file is missing)."""
    return json.loads(FLOPS.read_text()) if FLOPS.is_file() else {}


def image_cost(variant: str, benched: str, experiment: str, flops: dict | None = None) -> tuple[float, str]:
    """How many of ``benched``'s training images one of ``variant``'s costs, and why: its image area
    over MNIST's, or its training FLOP over ``benched``'s (reports/bench/flop_per_image.json, counted)
    where that is more. A CapsNet on a larger canvas routes more primary capsules (§5.2's 40×40: 4,608
    against 1,152, 3.9× the FLOP for 2.0× the area), and an estimate short of the truth loses the job at
    the window's end; a CNN whose pooling cuts its FLOP keeps the area, which it may not beat."""
    flops = flop_table() if flops is None else flops
    area = (registry.entry(experiment).image_size / MNIST_SIDE) ** 2
    ratio = flops[variant] / flops[benched] if variant in flops and benched in flops else 0.0
    if ratio > area:
        return ratio, f"×{ratio:.2f} its FLOP per image"
    return area, "" if area == 1 else f"×{area:.2f} its image area"


def trained_rows(params: dict, variant: str, rows: list[dict]) -> tuple[str, list[dict]]:
    """The variant timed for ``variant``'s model and its bench rows in the mode and stack layout the
    params train it with, at its own precision (one-seed rows whatever their layout)."""
    spec, train = params["variants"][variant], variant_train(params, variant)
    mode, benched = trained_mode(train, spec["model"]), BENCHED.get(spec["model"], BENCHED["baseline_cnn"])
    layout = train.get("stack_layout", "fused")
    return benched, [r for r in rows if r.get("variant") == benched and r.get("mode") == mode and r.get("train_images_per_s")
                     and (r.get("seeds", 1) == 1 or r.get("stack", "fused") == layout)]


def stacking_pays(params: dict, variant: str, seeds: int, rows: list[dict], parallel: int) -> bool:
    """Whether ``seeds`` seeds of a variant finish sooner stacked in one process than one process after
    another, each paying its STARTUP_SECONDS (`job_seconds`): no stacked row prices the stack as one
    seed after another, so it pays by the startups it saves; on the H200 (2026-11-26: three
    capsnet_r3_recon seeds stacked 31.6k images/s all together, one alone 66.1k) it does not."""
    stacked, alone = job_seconds(params, variant, seeds, rows, parallel), job_seconds(params, variant, 1, rows, parallel)
    return stacked is None or alone is None or stacked[0] <= seeds * alone[0]


def job_seconds(params: dict, variant: str, seeds: int, rows: list[dict], parallel: int) -> tuple[float, str] | None:
    """The estimated seconds of ``seeds`` seeds of a variant started, trained stacked in one of ``parallel``
    processes sharing the GPU, then evaluated, and the bench row it comes from (that many seeds
    stacked, else the nearest count stacked, its images/s all seeds together, else one seed, stacking
    then counted as no faster); None without a row to estimate from."""
    spec, train = params["variants"][variant], params["train"]
    benched, mine = trained_rows(params, variant, rows)
    same = [r for r in mine if r.get("seeds", 1) == seeds]
    nearest = sorted((r for r in mine if r.get("seeds", 1) > 1), key=lambda r: abs(r["seeds"] - seeds)) if seeds > 1 else []
    row = (same or nearest[:1] or [r for r in mine if r.get("seeds", 1) == 1] or [None])[-1]
    if row is None:
        return None
    experiment = spec.get("experiment", "table1")
    epoch = train["multimnist_epoch_size"] if experiment == "multimnist" else params["prepare"]["train_subset"] or 60_000
    cost, why = image_cost(variant, benched, experiment)
    images = seeds * train["epochs"] * epoch * cost
    source = f"{benched} {row['mode']} ×{row.get('seeds', 1)}: {row['train_images_per_s']:,.0f} images/s over {parallel}" \
        + (f", {why}" if why else "")
    return (STARTUP_SECONDS + MARGIN * images / (row["train_images_per_s"] / parallel)
            + seeds * (EVAL_SECONDS + train["epochs"] * EPOCH_EVAL_SECONDS), source)


def job_row(params: dict, variant: str, seeds: int, seconds: float, parallel: int, commit: str = "") -> dict:
    """A measured job: ``seeds`` seeds of ``variant`` trained (stacked in one process) and evaluated in
    ``seconds`` of wall time while ``parallel`` processes shared the GPU (the most at its start or end),
    with the protocol and speed mode it trained under: what `measured_seconds` matches."""
    spec = params["variants"][variant]
    return {"variant": variant, "seeds": seeds, "seconds": round(seconds, 1), "parallel": parallel,
            "mode": trained_mode(variant_train(params, variant), spec["model"]),
            "protocol": json.loads(json.dumps(protocol.planned(params, variant))), "commit": commit[:7]}


def job_rows(paths: list[Path]) -> list[dict]:
    """The measured jobs in these files (`job_row`, one JSON object a line, read as bench rows are: a
    torn line skipped, a missing file none)."""
    return [row for p in paths for row in bench_rows(p)]


def measured_seconds(params: dict, variant: str, seeds: int, jobs: list[dict], parallel: int) -> tuple[float, str] | None:
    """The seconds of ``seeds`` seeds of a variant from jobs measured under the same protocol and mode:
    each one's wall time is an upper bound where as many processes or more shared the GPU, and
    times parallel over its count where fewer did (each process's share of the GPU at most divides by
    that); the least of those bounds, with MARGIN's head room. None where no such job was measured."""
    mine = job_row(params, variant, seeds, 0.0, parallel)
    bounds = [(r["seconds"] * max(1.0, parallel / max(r["parallel"], 1)), r) for r in jobs
              if all(r.get(k) == mine[k] for k in ("variant", "seeds", "mode", "protocol"))]
    if not bounds:
        return None
    seconds, row = min(bounds, key=lambda b: b[0])
    return MARGIN * seconds, f"{variant} ×{seeds} measured: {row['seconds']:.0f} s with {row['parallel']} sharing the GPU"


def fit(item: str, left: float, params: dict, rows: list[dict], parallel: int,
        checkpoints: Path | None = None, jobs: list[dict] = ()) -> tuple[str | None, str]:
    """What of ``item`` (V:S or V:S1,S2,..., the seeds without metrics yet) to start with ``left`` seconds
    of the window: a job an earlier call of this window started that stopped short (its checkpoint,
    seed<S1-S2...>.pt in ``checkpoints``, holds none but these seeds: it resumes, it was started to end
    inside the window; one still training is waited for, gpu_session.sh's run_job), else the item, its first seeds only (the others wait for the
    next window; its first seed only where stacking does not pay, `stacking_pays`: gpu_session.sh then
    asks again for the rest), or None; and a line saying why. Each job is priced by ``jobs`` measured
    before (`measured_seconds`) where there are some, else by the bench ``rows`` (`job_seconds`): a job that
    outlasts its call trains on through the next (gpu_session.sh's run_job), so no restart is priced. With
    neither, a job starts unpriced
    unless it trains over UNPRICED_EPOCHS epochs (the paper protocol's 640: about a window)."""
    variant, seeds = item.split(":")[0], item.split(":")[1].split(",")
    for path in sorted(checkpoints.glob("seed*.pt")) if checkpoints and checkpoints.is_dir() else []:
        stopped = path.stem.removeprefix("seed").split("-")
        if set(stopped) <= set(seeds):
            return f"{variant}:{','.join(stopped)}", f"{item}: seed(s) {','.join(stopped)} resume from {path}"
    alone = not stacking_pays(params, variant, len(seeds), rows, parallel)  # one seed per process, the next after it
    for n in [1] if alone else range(len(seeds), 0, -1):
        estimate = measured_seconds(params, variant, n, jobs, parallel) or job_seconds(params, variant, n, rows, parallel)
        if estimate is None and params["train"]["epochs"] > UNPRICED_EPOCHS:
            return None, (f"{item}: not started: no bench row of its mode on this GPU to price {params['train']['epochs']} "
                          "epochs, and the window's end would lose it whole")
        if estimate is None:
            return item, f"{item}: no bench row to estimate from; it starts"
        seconds, source = estimate
        if seconds <= left:
            rest = f", seed(s) {','.join(seeds[n:])} {'after it, one by one: stacked seeds train slower here' if alone else 'next window'}" \
                if n < len(seeds) else ""
            return f"{variant}:{','.join(seeds[:n])}", f"{item}: {seconds:.0f} s estimated of {left:.0f} s left ({source}){rest}"
    return None, f"{item}: not started: {seconds:.0f} s estimated for one seed, {left:.0f} s left in the window ({source})"


def say_queued_again(runs: Path, raw: dict, table: dict | None, tables: list[dict], verdicts=None) -> None:
    """On stderr, the seeds `queue` lists again because other training code than ``table``'s published them."""
    if table is not None and (again := other_training(runs, raw, table, verdicts or judged(runs, raw, table, tables))):
        print(f"queued again, published under this protocol by other training code than {table['commit'][:7]}'s "
              f"({table['environment']}): {' '.join(again)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("reports/runs"))
    parser.add_argument("--params", type=Path, default=Path("params.gpu.yaml"))
    parser.add_argument("--limit", type=int, default=0, help="at most this many items (0: all)")
    parser.add_argument("--stack", action="store_true", help="a variant's missing seeds as one stacked item (V:0,1,2)")
    parser.add_argument("--fingerprints", type=Path, help="the `capsnet fingerprint` table of the code that trains: "
                        "records of other training code are queued again (default: not checked)")
    parser.add_argument("--bridges", action="store_true", help="with --fingerprints: print `COMMIT VARIANT...` for each "
                        "commit whose table in its environment would carry published records there (`bridges`)")
    parser.add_argument("--fit", metavar="ITEM", help="print what of this item fits the window's --left seconds")
    parser.add_argument("--left", type=float, default=0.0, help="with --fit: seconds left in the window")
    parser.add_argument("--bench", type=Path, default=Path("logs/bench"), help="with --fit: a folder of bench rows")
    parser.add_argument("--parallel", type=int, default=1, help="with --fit: processes sharing the GPU")
    parser.add_argument("--checkpoints", type=Path, help="with --fit: the variant's checkpoint folder on this machine")
    parser.add_argument("--jobs", type=Path, action="append", default=[],
                        help="with --fit: a file of measured jobs (repeatable); with --record: the file appended to")
    parser.add_argument("--record", metavar="ITEM", help="append ITEM's measured job (--seconds, --parallel) to --jobs")
    parser.add_argument("--seconds", type=float, default=0.0, help="with --record: the job's wall time")
    parser.add_argument("--commit", default="", help="with --record: the commit that trained it")
    args = parser.parse_args()
    if not args.params.is_file():
        sys.exit(f"{args.params} does not exist: write it with `python -m pipeline.profiles gpu --write {args.params}`")
    if args.fingerprints and not args.fingerprints.is_file():
        sys.exit(f"{args.fingerprints} does not exist: write it with `capsnet fingerprint {args.fingerprints} --params {args.params}`")
    if args.record:
        if len(args.jobs) != 1:
            sys.exit("--record needs one --jobs FILE to append to")
        variant, seeds = args.record.split(":")
        row = job_row(yaml.safe_load(args.params.read_text()), variant, len(seeds.split(",")), args.seconds,
                      max(args.parallel, 1), args.commit)
        args.jobs[0].parent.mkdir(parents=True, exist_ok=True)
        with args.jobs[0].open("a") as f:
            f.write(json.dumps(row) + "\n")
        return
    if args.fit:
        params = yaml.safe_load(args.params.read_text())
        start, why = fit(args.fit, args.left, params, bench_rows(args.bench), max(args.parallel, 1), args.checkpoints,
                         job_rows(args.jobs))
        print(why, file=sys.stderr)
        print(start or "")
        return
    raw = yaml.safe_load(args.params.read_text())
    table = json.loads(args.fingerprints.read_text()) if args.fingerprints else None
    here = lineage.load_tables(args.fingerprints.parent) if args.fingerprints else []  # this host's, beside it
    if args.bridges:
        if table is None:
            sys.exit("--bridges needs --fingerprints: the table of the code that trains names the environment")
        for commit, variants in bridges(args.runs, raw, table, here):
            print(commit, *variants)
        return
    verdicts = judged(args.runs, raw, table, here)
    items = queue(args.runs, raw, table, verdicts)
    say_queued_again(args.runs, raw, table, here, verdicts)
    if args.stack:
        items = stacked(items)
    print(" ".join(items[:args.limit] if args.limit else items))


if __name__ == "__main__":
    main()
