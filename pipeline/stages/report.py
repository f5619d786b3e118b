"""Stage `report`: every evaluation to reports/ (ablation.md, CSVs, metrics/, figures).

Table 1 per protocol against the paper with seed-aware verdicts and ablation effects, the
affine-shifted column, §5.2, MultiMNIST, deviations and each run's recorded provenance; logged
to MLflow as a `report` run with the headline numbers as metrics. The stage writes the same set of files whatever variants
params.yaml lists (a figure with nothing to show says so), so DVC's outputs never depend on it.
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from safetensors.torch import load_file

from pipeline.models import baseline

from pipeline.report import costs

from pipeline.report import figures

from pipeline.report import document as rp

from pipeline.experiments import affnist_report as ra

from pipeline.report import claims as rc
from pipeline.experiments import multimnist_report as rm
from pipeline.report import runs as rr
from pipeline.report import stats
from pipeline.core import tracking
from pipeline.data.mnist import MNIST_SIZE, MULTIMNIST_SIZE
from pipeline.core.errors import UserError
from pipeline.stages.evaluate import METRIC_KEYS
from pipeline.core.files import writable_dir, write_json, write_text
from pipeline.core.params import Params


def run(p: Params, models_dir: Path, results_dir: Path, out: Path, missing: str = "error",
        readme: Path | None = None, benchmarks: Path | None = None) -> Path:
    """Write the report into ``out``; ``missing``: "error" stops on a run without an evaluation,
    "list" reports it as not run; ``readme``: rewrite that file's generated results block from the
    same tables; ``benchmarks``: the measured speeds (reports/benchmarks.md) that cost what would
    settle each claim. Returns the path of ablation.md."""
    fig_dir = writable_dir(out / "figures", "report")
    reference = rr.paper_reference()
    variants, seeds = list(p.ablation.variants), list(p.ablation.seeds)
    skip = rr.missing_runs(models_dir, results_dir, variants, seeds) if missing == "list" else []
    not_run = {v: [s for w, s in skip if w == v] for v in dict.fromkeys(w for w, _ in skip)}
    runs = rr.load_runs(models_dir, results_dir, variants, seeds, skip=skip, params=p)
    table1 = [r for r in runs if r.image_size == MNIST_SIZE]
    multi = [r for r in runs if r.image_size == MULTIMNIST_SIZE]
    s52 = [r for r in runs if r.image_size not in (MNIST_SIZE, MULTIMNIST_SIZE)]
    if not table1:
        raise UserError("ablation.stacked and ablation.separate list no Table 1 (28×28) variant; "
                        "the report needs at least one")
    bench = costs.bench_rows(benchmarks) if benchmarks is not None else []
    summary, effect_table = rp.summarize(table1, reference, bench), rp.effects(table1, reference, bench)
    shown = table1_figures(table1, s52, multi, summary, results_dir, fig_dir)
    multi_table, multi_lines = None, None
    if multi:
        multi_table = rm.multimnist_summary(multi, reference)
        multi_lines = rm.render_both_columns(summary, multi_table, reference)
    dvc_plot_data(table1, summary, results_dir, writable_dir(out / "plots", "report"))
    if (fig_dir / "affine_montage.png").is_file():
        shown["Affine-shifted test set"] = "figures/affine_montage.png"
    s52_table, gap, s52_lines = None, None, None
    if s52:
        gap = ra.affnist_gap(s52, reference, bench)
        s52_table = ra.with_gap(ra.affnist_summary(s52, reference), gap)
        s52_lines = ra.render_affnist(s52_table, gap, reference)
        if (fig_dir / "affnist_montage.png").is_file():
            shown["§5.2 test sets"] = "figures/affnist_montage.png"
        figures.accuracy_by_transform(ra.transform_bins(s52, "affnist_test"),
                                      "§5.2: affNIST(-style) accuracy by transform parameter", fig_dir / "affnist_bins.png")
        shown["§5.2: accuracy by transform parameter"] = "figures/affnist_bins.png"
    else:
        figures.placeholder("No §5.2 (40×40) variant in this report", fig_dir / "affnist_bins.png")
    shown.update(multimnist_figure(multi, multi_table, results_dir, fig_dir))

    claims = rc.claims(effect_table, gap, summary.protocol.iloc[0])
    text = rp.render_markdown(summary, effect_table, profile=p.base.profile, not_run=not_run, claims=claims,
                              deviations=deviations(p, reference) + rp.run_deviations(runs),
                              provenance=provenance(p, runs, not_run), figures=shown,
                              reference=reference, affnist=s52_lines, multimnist=multi_lines,
                              run_table=rr.run_provenance(runs))
    tables = {"ablation.md": text, "results.csv": summary.to_csv(index=False, float_format="%.4f"),
              "effects.csv": effect_table.to_csv(index=False, float_format="%.4f"),
              "affnist.csv": s52_table.to_csv(index=False, float_format="%.4f") if s52 else "",
              "multimnist.csv": multi_table.to_csv(index=False, float_format="%.4f") if multi else "",
              "claims.csv": claims.to_csv(index=False)}
    for name, content in tables.items():
        write_text(out / name, content)
    if readme is not None:  # from the CSVs as written, as tests/test_readme.py reads them
        rp.rewrite_readme(readme, rp.readme_block(pd.read_csv(out / "results.csv"), pd.read_csv(out / "effects.csv"),
                                                  pd.read_csv(out / "affnist.csv") if s52 else None,
                                                  pd.read_csv(out / "claims.csv")))
    headline = write_variant_metrics(runs, writable_dir(out / "metrics", "report"))
    if gap is not None:
        headline["affnist_gap_pp"] = {k: round(gap[k], 4) for k in ("gap", "ci_low", "ci_high")}
    files = [out / name for name in tables] + [*(out / v for v in shown.values())]
    tracking.open_tracker(p.base.profile).log_report(files, p.base.profile, metrics=flatten(headline))
    return out / "ablation.md"


def deviations(p: Params, reference: dict) -> list[str]:
    """Every deliberate deviation: Table 1's (pipeline.report.document), then each experiment's present."""
    out = rp.deviations(p, reference)
    if any(p.variant(v).image_size == MULTIMNIST_SIZE for v in p.ablation.variants):
        out += baseline.MULTIMNIST_DEVIATIONS + rm.DEVIATIONS
        out += rm.test_size_deviation(p.prepare.multimnist_pairs_per_digit, p.prepare.test_subset)
    return out


def _label(r: rr.Run, ambiguous: set[str]) -> str:
    """A run's variant, with protocol and commit where the report holds several of them for it."""
    return f"{r.variant} ({r.cfg['epochs']} ep, {r.commit_key})" if r.variant in ambiguous else r.variant


def table1_figures(table1: list[rr.Run], s52: list[rr.Run], multi: list[rr.Run], summary, results_dir: Path,
                   fig_dir: Path) -> dict[str, str]:
    """Error bars (first protocol), learning curves with one panel per test set and the learning-rate
    schedule, and the best reconstruction variant's figures."""
    headline = summary[summary.protocol == summary.protocol.iloc[0]]
    repeated = set(headline.variant[headline.variant.duplicated()])
    labels = [f"{r.variant} ({rr.short(r.commit)})" if r.variant in repeated else r.variant for r in headline.itertuples()]
    per_seed = [[r.metrics["error_pct"] for r in table1 if (r.variant, r.protocol, r.commit) == (h.variant, h.protocol, h.commit)]
                for h in headline.itertuples()]
    intervals = []  # our mean's 95 % t-interval over seeds (NaN with one seed)
    for errors in per_seed:
        n = len(errors)
        i = stats.t_interval(float(np.mean(errors)), [(float(np.var(errors, ddof=1)) / n, n - 1)]) if n > 1 else None
        intervals.append((i.lo, i.hi) if i else (math.nan, math.nan))
    figures.seed_errors(labels, per_seed, intervals, list(headline.paper_test_error),
                        list(headline.paper_test_error_std), fig_dir / "table1_errors.png")
    panels: dict[str, dict] = {}
    lr: dict[str, tuple] = {}
    for title, runs in (("MNIST test set (Table 1)", table1), ("expanded-MNIST test set (§5.2, 40×40)", s52),
                        ("MultiMNIST curve recipes (§6, pair error)", multi)):
        groups = {(r.variant, r.protocol_key, r.commit_key) for r in runs}
        ambiguous = {v for v, _, _ in groups if sum(g[0] == v for g in groups) > 1}
        for r in runs:
            curves = panels.setdefault(title, {})
            curves.setdefault(_label(r, ambiguous), []).append((list(r.history.epoch), list(r.history.test_error_pct)))
            if "lr" in r.history and (r.schedule not in lr or len(r.history) > len(lr[r.schedule][0])):
                lr[r.schedule] = (list(r.history.epoch), list(r.history.lr))  # the longest run of each schedule
    figures.learning_curve_panels(panels, lr, fig_dir / "learning_curves.png")
    shown = {"Learning curves": "figures/learning_curves.png",
             f"Test error per variant ({headline.protocol.iloc[0]})": "figures/table1_errors.png"}
    recon = headline[headline.reconstruction]
    if not len(recon):
        for name in ("reconstructions", "fig4"):
            figures.placeholder("No reconstruction variant in this report", fig_dir / f"{name}.png")
        return shown
    row = recon.sort_values("test_error_mean").iloc[0]
    best = row.variant
    best_run = min((r for r in table1 if (r.variant, r.protocol, r.commit) == (best, row.protocol, row.commit)),
                   key=lambda r: r.metrics["error_pct"])  # the row's own runs, not another protocol's
    for name in ("reconstructions", "fig4"):
        shutil.copyfile(results_dir / best / f"seed{best_run.seed}" / f"{name}.png", fig_dir / f"{name}.png")
    shown[f"Reconstructions ({best}, seed {best_run.seed})"] = "figures/reconstructions.png"
    shown[f"Fig. 4 perturbations ({best}, seed {best_run.seed})"] = "figures/fig4.png"
    return shown


def multimnist_figure(runs: list[rr.Run], table, results_dir: Path, fig_dir: Path) -> dict[str, str]:
    """figures/multimnist_reconstructions.png: the Fig. 5 overlay of the lowest-error MultiMNIST
    reconstruction variant's best seed, or a placeholder saying there is none."""
    path = fig_dir / "multimnist_reconstructions.png"
    recon = [r for r in runs if r.config["config"]["reconstruction"]]
    if not recon:
        figures.placeholder("No MultiMNIST reconstruction variant in this report", path)
        return {}
    means = table.set_index("variant").error_mean
    best = min(recon, key=lambda r: (means[r.variant], r.metrics["error_pct"]))
    shutil.copyfile(results_dir / best.variant / f"seed{best.seed}" / "reconstructions.png", path)
    return {f"MultiMNIST reconstructions ({best.variant}, seed {best.seed}; red and green: the two predicted "
            "capsules)": "figures/multimnist_reconstructions.png"}


def dvc_plot_data(runs: list[rr.Run], summary, results_dir: Path, plot_dir: Path) -> None:
    """Data for dvc.yaml's top-level plots, from the first Table 1 protocol: per-epoch test error of
    every variant (mean over seeds; a variant trained at several commits is one line per commit)
    and the lowest-error variant's confusion on the MNIST test set (its best seed)."""
    summary = summary[summary.protocol == summary.protocol.iloc[0]]
    runs = [r for r in runs if r.protocol == summary.protocol.iloc[0]]
    ambiguous = {v for v in summary.variant if (summary.variant == v).sum() > 1}
    curves = pd.concat([r.history.assign(variant=_label(r, ambiguous))[["variant", "epoch", "test_error_pct"]]
                        for r in runs])
    curves = curves.groupby(["variant", "epoch"], sort=False, as_index=False).test_error_pct.mean()
    write_text(plot_dir / "learning_curves.csv", curves.to_csv(index=False, float_format="%.4f"))
    best = summary.sort_values("test_error_mean").iloc[0]
    run = min((r for r in runs if r.variant == best.variant and r.commit == best.commit),
              key=lambda r: r.metrics["error_pct"])
    best = best.variant
    predictions = load_file(str(results_dir / best / f"seed{run.seed}" / "predictions.safetensors"))
    confusion = pd.DataFrame({"actual": predictions["test_labels"].numpy(), "predicted": predictions["test_preds"].numpy()})
    write_text(plot_dir / "confusion.csv", confusion.to_csv(index=False))


def write_variant_metrics(runs: list[rr.Run], metrics_dir: Path) -> dict[str, dict[str, float]]:
    """metrics/<variant>.json (DVC metrics): evaluate's metrics.json keys, each the mean over the
    variant's seeds, or the seeds' common value (reached_target: true, false, or the fraction of
    seeds that stopped at the target). With the
    per-run files this makes `dvc metrics show` one table of the same columns, a row per run and
    per variant. Files of variants no longer listed are removed. Returns what was written."""
    written = {}
    for variant in dict.fromkeys(r.variant for r in runs):
        mine = [r.metrics for r in runs if r.variant == variant]
        values = {k: [m[k] for m in mine] for k in METRIC_KEYS if all(k in m for m in mine)}
        written[variant] = {k: v[0] if len(set(v)) == 1 else round(float(np.mean(v)), 4) for k, v in values.items()}
        write_json(metrics_dir / f"{variant}.json", written[variant])
    for stale in set(metrics_dir.glob("*.json")) - {metrics_dir / f"{v}.json" for v in written}:
        stale.unlink()
    return written


def flatten(headline: dict) -> dict[str, float]:
    """{"capsnet_r1/error_pct": 0.41, …}: MLflow metric names for the report run."""
    return {f"{group}/{key}": value for group, values in headline.items() for key, value in values.items()}


def provenance(p: Params, runs: list[rr.Run], not_run: dict[str, list[int]]) -> dict[str, str]:
    """Where the numbers come from: commits, protocols, devices, software, runs, time (each run's
    own record is the table after these lines)."""
    versions = {name: md.version(name) for name in ("torch", "torchvision", "dvc", "mlflow", "pandas")}
    env = [r.config.get("environment", {}) for r in runs]
    trained = sorted({f"torch {e.get('torch_version', rr.NOT_RECORDED)}, Python {e.get('python_version', rr.NOT_RECORDED)}"
                      for e in env})
    commits = {}
    for r in runs:
        commits.setdefault(f"{r.commit} (from {r.commit_source})" if r.commit != rr.NOT_RECORDED else r.commit,
                           []).append(r)
    return {
        "report commit": tracking.git_commit(tracking.repo_root()),
        "training commits": "; ".join(f"{c}: {len(rs)} runs" for c, rs in commits.items()),
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
    }
