"""Stage `report`: every evaluation to reports/ (ablation.md, CSVs, metrics/, figures).

Each experiment (pipeline.core.registry, in its order) reports its own runs as a Section
(pipeline.report.document): its tables against the paper with seed-aware verdicts, its claims,
figures and CSVs. This stage loads the runs, hands each experiment its own, draws the
learning curves every experiment shares a figure of, writes what the sections give, the
deviations and each run's recorded provenance, and logs the report to MLflow as a `report` run
with the headline numbers as metrics. Every experiment writes its files whether it has runs or
not (a figure with nothing to show says so), so DVC's outputs never depend on the variants.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata as md
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.core import lineage, registry, tracking
from pipeline.core.provenance import git_commit, repo_root
from pipeline.core.errors import UserError
from pipeline.core.files import writable_dir, write_json, write_text
from pipeline.core.params import Params
from pipeline.report import costs, figures
from pipeline.report import document as doc
from pipeline.report import publish
from pipeline.report import runs as rr
from pipeline.report.rows import bridge, group, protocols, run_label, same_code, with_several_rows
from pipeline.report.runs import METRIC_KEYS, read_table
from pipeline.training.config import ADAM_EPS


def run(p: Params, models_dir: Path, results_dir: Path, out: Path, missing: str = "error",
        readme: Path | None = None, benchmarks: Path | None = None, fingerprints: Path | None = None) -> Path:
    """Write the report into ``out``; ``missing``: "error" stops on a run without an evaluation,
    "list" reports it as not run; ``readme``: rewrite that file's generated results block from the
    same tables; ``benchmarks``: the measured speeds (reports/benchmarks.md) that cost what would
    settle each claim; ``fingerprints``: a folder of fingerprint tables (`capsnet fingerprint`) through
    which rows trained at different commits compare (pipeline.report.rows.bridge). Returns the path
    of ablation.md."""
    fig_dir = writable_dir(out / "figures", "report")
    variants, seeds = list(p.ablation.variants), list(p.ablation.seeds)
    skip = rr.missing_runs(models_dir, results_dir, variants, seeds) if missing == "list" else []
    not_run = {v: [s for w, s in skip if w == v] for v in dict.fromkeys(w for w, _ in skip)}
    runs, superseded = publish.one_per_seed(same_code(bridge(
        publish.with_earlier(rr.load_runs(models_dir, results_dir, variants, seeds, skip=skip, params=p),
                             models_dir, variants, seeds, p),
        lineage.load_tables(fingerprints))))
    for r in superseded:
        print(f"{r.variant} seed {r.seed}: run {r.config.get('run_id', rr.NOT_RECORDED)} was trained again "
              f"under the same protocol and training code; the later run counts (the earlier record stays)")
    if not runs:
        raise UserError("no variant of params.yaml's ablation has an evaluation to report; run the pipeline "
                        "first (`dvc repro`), or pass --missing list to report what exists")
    networks = {name: costs.Network(v.model, v.experiment, v.routing_iterations, v.reconstruction)  # experiment: settled by params
                for name, v in p.variants.items()}
    bench = costs.with_stand_ins(costs.bench_rows(benchmarks), networks) if benchmarks is not None else []
    ctx = doc.Context(p, rr.paper_reference(), bench, results_dir, out)
    experiments = [registry.load(name) for name in registry.names()]
    mine = {e.NAME: [r for r in runs if r.experiment == e.NAME] for e in experiments}
    sections = [e.report(mine[e.NAME], ctx) for e in experiments]
    learning_curves([(e.CURVES, mine[e.NAME]) for e in experiments], fig_dir / "learning_curves.png")
    shared = {"Learning curves": "figures/learning_curves.png"}
    claims = doc.all_claims(sections)
    deviations = [d for s in sections for d in s.deviations] + doc.run_deviations(runs, ADAM_EPS)
    text = doc.render(sections, profile=p.base.profile, figures=shared, deviations=deviations,
                      provenance=provenance(p, runs, not_run, superseded), not_run=not_run, run_table=rr.run_provenance(runs))
    tables = {"ablation.md": text, **{name: t for s in sections for name, t in s.tables.items()},
              "claims.csv": claims.to_csv(index=False)}
    for name, content in tables.items():
        write_text(out / name, content)
    if readme is not None:  # from the CSVs as written, as tests/test_readme.py reads them
        doc.rewrite_readme(readme, readme_block(out, experiments))
    headline = write_variant_metrics(runs, writable_dir(out / "metrics", "report"))
    for s in sections:
        headline.update(s.headline)
    shown = {**shared, **{t: path for s in sections for t, path in s.figures.items()}}
    files = [out / name for name in tables] + [*(out / v for v in shown.values())]
    tracking.open_tracker(p.base.profile).log_report(files, p.base.profile, metrics=flatten(headline))
    return out / "ablation.md"


def claims_summary(out: Path, profile: str) -> list[str]:
    """The claims' verdicts for the terminal, from claims.csv in ``out`` as written (none: no line)."""
    claims = claims_table(out)
    if claims is None or not len(claims):
        return []
    smoke = " (SMOKE RUN: tiny data, 1 epoch; they say nothing about the paper)" if profile == "smoke" else ""
    return [f"the paper's claims as these runs read them{smoke} ({out / 'ablation.md'} says what each would take):",
            *(f"  {claim}: {status}" for claim, status in zip(claims.claim, claims.status))]


def readme_block(out: Path, experiments: list) -> str:
    """The README's results block from the report's CSVs in ``out`` as written: the claims, then
    each experiment's lines."""
    return doc.readme_block(claims_table(out), [e.readme(out) for e in experiments])


def claims_table(out: Path) -> pd.DataFrame | None:
    """claims.csv in ``out`` as the report stage wrote it; None where it is empty (no claim to read)."""
    return read_table(out / "claims.csv") if (out / "claims.csv").stat().st_size else None


def learning_curves(panels_of: list[tuple[str, list[rr.Run]]], path: Path) -> None:
    """One panel per experiment with runs and per protocol they trained under (the headline protocol's
    first, `protocols`; the protocol under the experiment's title where it has several: a cut and a
    compressed schedule never share a panel, as they never share a table), each variant's seeds a line (a
    variant trained by several training codes under one protocol, a line each), and the learning-rate
    schedule of the longest run of each schedule."""
    panels: dict[str, dict] = {}
    lr: dict[str, tuple] = {}
    for title, runs in panels_of:
        keys = protocols(runs)
        for key in keys:
            mine = [r for r in runs if r.protocol_key == key]
            ambiguous = with_several_rows(mine)
            curves = panels.setdefault(title if len(keys) == 1 else f"{title}\n{mine[0].protocol}", {})
            for r in mine:
                curves.setdefault(run_label(r, ambiguous), []).append((list(r.history.epoch),
                                                                          list(r.history.test_error_pct)))
                if "lr" in r.history and (r.schedule not in lr or len(r.history) > len(lr[r.schedule][0])):
                    lr[r.schedule] = (list(r.history.epoch), list(r.history.lr))  # the longest run of each schedule
    figures.learning_curve_panels(panels, lr, path)


def write_variant_metrics(runs: list[rr.Run], metrics_dir: Path) -> dict[str, dict[str, float]]:
    """metrics/<row>.json (DVC metrics), one per report row (a variant under one protocol and one
    training code, `group`: runs of different ones are never pooled), named by `row_names`:
    evaluate's metrics.json keys, each the mean over the row's seeds, or the seeds' common value
    (reached_target: true, false, or the fraction of seeds that stopped at the target). With the
    per-run files this makes `dvc metrics show` one table of the same columns, a row per run and
    per report row. Files of rows no longer reported are removed. Returns what was written."""
    written = {}
    for name, rows in row_names(runs).items():
        mine = [r.metrics for r in rows]
        values = {k: [m[k] for m in mine] for k in METRIC_KEYS if all(k in m for m in mine)}
        written[name] = {k: v[0] if len(set(v)) == 1 else round(float(np.mean(v)), 4) for k, v in values.items()}
        write_json(metrics_dir / f"{name}.json", written[name])
    for stale in set(metrics_dir.glob("*.json")) - {metrics_dir / f"{v}.json" for v in written}:
        stale.unlink()
    return written


def row_names(runs: list[rr.Run]) -> dict[str, list[rr.Run]]:
    """Each report row's runs (`group`) under a file and MLflow name: the variant where it has one
    row; where it has several, the variant with the epochs and training code that tell them apart
    (`capsnet_r3_recon-50ep-17bb48c`, `capsnet_r3_recon-50ep-fp87ed42bb`), and a digest of the
    protocol where even those agree (two schedules at one commit, say)."""
    groups, several = group(runs), with_several_rows(runs)
    named = {key: key[0] if key[0] not in several else f"{key[0]}-{key[1][1]}ep-{key[2].replace(' ', '')}"
             for key in groups}
    uses = Counter(named.values())
    return {(f"{name}-{hashlib.sha256(repr(key[1]).encode()).hexdigest()[:6]}" if uses[name] > 1 else name): groups[key]
            for key, name in named.items()}


def flatten(headline: dict) -> dict[str, float]:
    """{"capsnet_r1/error_pct": 0.41, …}: MLflow metric names for the report run."""
    return {f"{section}/{key}": value for section, values in headline.items() for key, value in values.items()}


def provenance(p: Params, runs: list[rr.Run], not_run: dict[str, list[int]],
               superseded: list[rr.Run] = ()) -> dict[str, str]:
    """Where the numbers come from: commits, protocols, devices, software, runs, time (each run's
    own record is the table after these lines); ``superseded``: records of a seed trained again in
    its row (`publish.one_per_seed`), named only where there are some."""
    versions = {name: md.version(name) for name in ("torch", "torchvision", "dvc", "mlflow", "pandas")}
    env = [r.config.get("environment", {}) for r in runs]
    trained = sorted({f"torch {e.get('torch_version', rr.NOT_RECORDED)}, Python {e.get('python_version', rr.NOT_RECORDED)}"
                      for e in env})
    commits = {}
    for r in runs:
        commits.setdefault(f"{r.commit} (from {r.commit_source})" if r.commit != rr.NOT_RECORDED else r.commit,
                           []).append(r)
    return {
        "report commit": git_commit(repo_root()),
        "training commits": "; ".join(f"{c}: {len(rs)} runs" for c, rs in commits.items()),
        "training fingerprints": "; ".join(f"{fp}: {sum(r.fingerprint == fp for r in runs)} runs"
                                           for fp in dict.fromkeys(r.fingerprint for r in runs))
                                 + " (runs with one fingerprint and protocol pool across commits; others compare by "
                                   "commit)",
        "protocols": "; ".join(dict.fromkeys(r.protocol for r in runs)),
        "profile of this report's params": p.base.profile,
        "devices": "; ".join(sorted({f"{r.device}, torch CUDA build {e.get('cuda_version', rr.NOT_RECORDED)}"
                                     for r, e in zip(runs, env)})),
        "training software": "; ".join(trained),
        "report software": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "runs": "; ".join(f"{v}: seeds {', '.join(str(r.seed) for r in runs if r.variant == v)}"
                          for v in dict.fromkeys(r.variant for r in runs)),
        "not run": "; ".join(f"{v}: seeds {', '.join(map(str, s))}" for v, s in not_run.items()) or "none",
        "resumed from a checkpoint": f"{sum(bool(r.resume_epochs) for r in runs)} of {len(runs)} runs"
                                     " (which, and where: the table below)",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "total training time": f"{sum(r.history.epoch_seconds.sum() for r in runs) / 60:.1f} min over {len(runs)} runs "
                               "(sum of each run's epoch times; runs trained side by side on one device overlap)",
        "seeds": ", ".join(map(str, p.ablation.seeds)),
    } | ({"trained again, the earlier record not counted": "; ".join(
        f"{r.variant} seed {r.seed} (run {r.config.get('run_id', rr.NOT_RECORDED)}, in reports/runs/earlier)"
        for r in superseded)} if superseded else {})
