"""Published run records: the compact copies in git (reports/runs) the report is rewritten from.

`publish_runs` copies a run's records (no weights, no scores) to DEST/models and DEST/results at
its (variant, seed). A record already there of *another* run (a seed trained again under a later
protocol or commit) is never overwritten: it moves whole to DEST/earlier/<its run id>/, and
`earlier_runs` reads those back, so the report keeps every protocol's seeds as separate rows.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from pipeline.core.params import Params
from pipeline.report.runs import RUN_FIGURES, Run, load_runs, missing_runs

PUBLISHED = {"models": ("config.json", "history.csv"),
             "results": ("metrics.json", "breakdown.json", f"{RUN_FIGURES}/reconstructions.png", f"{RUN_FIGURES}/fig4.png")}
EARLIER = "earlier"  # DEST/earlier/<run id>/{models,results}/<variant>/seed<s>: records a later run displaced


def publish_runs(models_dir: Path, results_dir: Path, dest: Path) -> list[tuple[str, int]]:
    """Copy every complete run's records into dest/models and dest/results, small enough for git.

    Predictions keep only what the report reads (labels, predicted classes, source digits): no
    scores, no weights. `capsnet report DEST/models DEST/results ...` then rewrites the report
    from the copies alone. A published record of another run at the same (variant, seed) is set
    aside first (`set_aside`). Returns the (variant, seed) pairs copied.
    """
    copied = []
    for metrics in sorted(results_dir.glob("*/seed*/metrics.json")):
        variant, seed_dir = metrics.parent.parent.name, metrics.parent.name
        seed = int(seed_dir.removeprefix("seed"))
        if missing_runs(models_dir, results_dir, [variant], [seed]):
            continue
        set_aside(dest, variant, seed_dir, run_id(models_dir / variant / seed_dir))
        for kind, names in PUBLISHED.items():
            src = (models_dir if kind == "models" else results_dir) / variant / seed_dir
            out = dest / kind / variant / seed_dir
            out.mkdir(parents=True, exist_ok=True)
            for name in names:
                if (src / name).is_file():
                    (out / name).parent.mkdir(exist_ok=True)
                    shutil.copyfile(src / name, out / name)
        pred = load_file(str(metrics.parent / "predictions.safetensors"))
        # MultiMNIST's (P, 2) pairs are left out (10M rows at paper size): the report reads only their metrics
        keep = {k: narrowest(t) if k.endswith("_digit_index") else t.contiguous() for k, t in pred.items()
                if k.endswith(("_labels", "_preds", "_digit_index")) and t.dim() == 1}
        save_file(keep, str(dest / "results" / variant / seed_dir / "predictions.safetensors"))
        copied.append((variant, seed))
    return copied


def narrowest(index: torch.Tensor) -> torch.Tensor:
    """Integer indices in the narrowest signed type that holds them: the affNIST-style set's 320,000
    source-digit indices (MNIST's 10,000 test digits) as int16, 0.64 MB in git instead of 1.28, since
    every call of a GPU window carries the published records (the device tool's 64 MiB)."""
    for dtype in (torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if index.numel() == 0 or (info.min <= int(index.min()) and int(index.max()) <= info.max):
            return index.to(dtype).contiguous()
    return index.to(torch.int64).contiguous()


def run_id(model_dir: Path) -> str:
    """The tracking run id a run's config.json records ("unrecorded" for records older than it)."""
    return json.loads((model_dir / "config.json").read_text()).get("run_id") or "unrecorded"


def set_aside(dest: Path, variant: str, seed_dir: str, incoming: str) -> None:
    """Move the published record at (variant, seed) to dest/earlier/<its run id>/ when it is not the
    ``incoming`` run's own (republishing a run replaces its record in place)."""
    here = dest / "models" / variant / seed_dir
    if not (here / "config.json").is_file() or run_id(here) == incoming:
        return
    earlier = dest / EARLIER / run_id(here)
    for kind in PUBLISHED:
        src, target = dest / kind / variant / seed_dir, earlier / kind / variant / seed_dir
        if src.is_dir():
            shutil.rmtree(target, ignore_errors=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(src, target)


def with_earlier(runs: list[Run], models_dir: Path, variants: list[str], seeds: list[int],
                 params: Params | None = None) -> list[Run]:
    """``runs`` (read from models_dir) and the records set aside beside it (models_dir's parent's
    earlier/), in variant then seed order, a set-aside record before the run that displaced it;
    the tracking journals are the published ones beside models_dir."""
    found = []
    for folder in sorted((models_dir.parent / EARLIER).glob("*/models")):
        results = folder.parent / "results"
        found += load_runs(folder, results, variants, seeds, skip=missing_runs(folder, results, variants, seeds),
                           journal_dir=models_dir.parent / "journal", params=params)
    order = {v: i for i, v in enumerate(variants)}
    return sorted(found + runs, key=lambda r: (order[r.variant], r.seed))  # stable: set-aside ones first


def one_per_seed(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(runs, superseded): of several records of one seed in one report row (variant, protocol,
    training code: `rows.group`), the last (`with_earlier`'s order: the current record after those it
    displaced) counts and the earlier ones are superseded. A seed trained again under the same
    protocol and code is the same draw of the seed noise, not another: pooling both would count it
    twice and narrow every interval it enters. Superseded records stay where they are (earlier/).
    Records set aside hold no training date: of two of them in one row and seed (neither current), the
    later in their run ids' order counts."""
    last = {(r.variant, r.protocol_key, r.commit_key, r.seed): k for k, r in enumerate(runs)}
    counts = set(last.values())
    return [r for k, r in enumerate(runs) if k in counts], [r for k, r in enumerate(runs) if k not in counts]
