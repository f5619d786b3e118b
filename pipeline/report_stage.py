"""Stage `report`: every evaluation to reports/ (ablation.md, CSVs, metrics/, figures).

Table 1 against the paper with verdicts, ablation effects with paired bootstrap CIs, the
affine-shifted column, §5.2, deviations and provenance; logged to MLflow as a `report` run with
the headline numbers as metrics. The stage writes the same set of files whatever variants
params.yaml lists (a figure with nothing to show says so), so DVC's outputs never depend on it.
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from safetensors.torch import load_file

from pipeline import figures, report as rp, report_affnist as ra, report_multimnist as rm, tracking
from pipeline.data import MNIST_SIZE, MULTIMNIST_SIZE
from pipeline.errors import UserError
from pipeline.evaluate_stage import METRIC_KEYS
from pipeline.files import writable_dir, write_json, write_text
from pipeline.params import Params


def run(p: Params, models_dir: Path, results_dir: Path, out: Path, missing: str = "error") -> Path:
    """Write the report into ``out``; ``missing``: "error" stops on a run without an evaluation,
    "list" reports it as not run. Returns the path of ablation.md."""
    fig_dir = writable_dir(out / "figures", "report")
    reference = rp.paper_reference()
    variants, seeds = list(p.ablation.variants), list(p.ablation.seeds)
    skip = rp.missing_runs(models_dir, results_dir, variants, seeds) if missing == "list" else []
    not_run = {v: [s for w, s in skip if w == v] for v in dict.fromkeys(w for w, _ in skip)}
    runs = rp.load_runs(models_dir, results_dir, variants, seeds, skip=skip)
    table1 = [r for r in runs if r.image_size == MNIST_SIZE]
    multi = [r for r in runs if r.image_size == MULTIMNIST_SIZE]
    s52 = [r for r in runs if r.image_size not in (MNIST_SIZE, MULTIMNIST_SIZE)]
    if not table1:
        raise UserError("ablation.variants lists no Table 1 (28×28) variant; the report needs at least one")
    summary, effect_table = rp.summarize(table1, reference), rp.effects(table1, reference)
    shown = table1_figures(table1 + s52, summary, results_dir, fig_dir)
    multi_table, multi_lines = None, None
    if multi:
        multi_table = rm.multimnist_summary(multi, reference)
        multi_lines = rm.render_both_columns(summary, multi_table, reference)
    shown.update(multimnist_figure(multi, multi_table, results_dir, fig_dir))
    dvc_plot_data(table1, summary, results_dir, writable_dir(out / "plots", "report"))
    for name, title in (("affine_montage", "Affine-shifted test set"), ("affnist_montage", "§5.2 test sets")):
        if (fig_dir / f"{name}.png").is_file():
            shown[title] = f"figures/{name}.png"
    s52_table, gap, s52_lines = None, None, None
    if s52:
        s52_table, gap = ra.affnist_summary(s52, reference), ra.affnist_gap(s52, reference)
        s52_lines = ra.render_affnist(s52_table, gap, reference)
        figures.accuracy_by_transform(ra.transform_bins(s52, "affnist_test"),
                                      "§5.2: affNIST(-style) accuracy by transform parameter", fig_dir / "affnist_bins.png")
        shown["§5.2: accuracy by transform parameter"] = "figures/affnist_bins.png"
    else:
        figures.placeholder("No §5.2 (40×40) variant in this report", fig_dir / "affnist_bins.png")

    text = rp.render_markdown(summary, effect_table, profile=p.base.profile, not_run=not_run,
                              deviations=rp.deviations(p, reference) + rp.run_deviations(runs),
                              provenance=provenance(p, runs, not_run, models_dir), figures=shown,
                              reference=reference, affnist=s52_lines, multimnist=multi_lines)
    tables = {"ablation.md": text, "results.csv": summary.to_csv(index=False, float_format="%.4f"),
              "effects.csv": effect_table.to_csv(index=False, float_format="%.4f"),
              "affnist.csv": s52_table.to_csv(index=False, float_format="%.4f") if s52 else "",
              "multimnist.csv": multi_table.to_csv(index=False, float_format="%.4f") if multi else ""}
    for name, content in tables.items():
        write_text(out / name, content)
    headline = write_variant_metrics(runs, writable_dir(out / "metrics", "report"))
    if gap is not None:
        headline["affnist_gap_pp"] = {k: round(gap[k], 4) for k in ("gap", "ci_low", "ci_high")}
    files = [out / name for name in tables] + [*(out / v for v in shown.values())]
    tracking.open_tracker().log_report(files, p.base.profile, metrics=flatten(headline))
    return out / "ablation.md"


def table1_figures(runs: list[rp.Run], summary, results_dir: Path, fig_dir: Path) -> dict[str, str]:
    """Error bars, overlaid learning curves, and the best reconstruction variant's figures."""
    figures.error_bars(list(summary.variant), list(summary.test_error_mean), list(summary.test_error_std),
                       list(summary.paper_test_error), fig_dir / "table1_errors.png")
    curves = {}
    for r in runs:
        curves.setdefault(r.variant, []).append((list(r.history.epoch), list(r.history.test_error_pct)))
    figures.overlaid_learning_curves(curves, fig_dir / "learning_curves.png")
    shown = {"Test error per variant": "figures/table1_errors.png", "Learning curves": "figures/learning_curves.png"}
    recon = summary[summary.reconstruction]
    if not len(recon):
        for name in ("reconstructions", "fig4"):
            figures.placeholder("No reconstruction variant in this report", fig_dir / f"{name}.png")
        return shown
    best = recon.sort_values("test_error_mean").iloc[0].variant
    best_run = min((r for r in runs if r.variant == best), key=lambda r: r.metrics["error_pct"])
    for name in ("reconstructions", "fig4"):
        shutil.copyfile(results_dir / best / f"seed{best_run.seed}" / f"{name}.png", fig_dir / f"{name}.png")
    shown[f"Reconstructions ({best}, seed {best_run.seed})"] = "figures/reconstructions.png"
    shown[f"Fig. 4 perturbations ({best}, seed {best_run.seed})"] = "figures/fig4.png"
    return shown


def multimnist_figure(runs: list[rp.Run], table, results_dir: Path, fig_dir: Path) -> dict[str, str]:
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


def dvc_plot_data(runs: list[rp.Run], summary, results_dir: Path, plot_dir: Path) -> None:
    """Data for dvc.yaml's top-level plots: per-epoch test error of every Table 1 variant (mean
    over seeds) and the lowest-error variant's confusion on the MNIST test set (its best seed)."""
    curves = pd.concat([r.history.assign(variant=r.variant)[["variant", "epoch", "test_error_pct"]] for r in runs])
    curves = curves.groupby(["variant", "epoch"], sort=False, as_index=False).test_error_pct.mean()
    write_text(plot_dir / "learning_curves.csv", curves.to_csv(index=False, float_format="%.4f"))
    best = summary.sort_values("test_error_mean").iloc[0].variant
    run = min((r for r in runs if r.variant == best), key=lambda r: r.metrics["error_pct"])
    predictions = load_file(str(results_dir / best / f"seed{run.seed}" / "predictions.safetensors"))
    confusion = pd.DataFrame({"actual": predictions["test_labels"].numpy(), "predicted": predictions["test_preds"].numpy()})
    write_text(plot_dir / "confusion.csv", confusion.to_csv(index=False))


def write_variant_metrics(runs: list[rp.Run], metrics_dir: Path) -> dict[str, dict[str, float]]:
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


def provenance(p: Params, runs: list[rp.Run], not_run: dict[str, list[int]], models_dir: Path) -> dict[str, str]:
    """Where the numbers come from: commits, profile, device, software, runs, time."""
    env = runs[0].config["environment"]
    versions = {name: md.version(name) for name in ("torch", "torchvision", "dvc", "mlflow", "pandas")}
    trained = sorted({f"torch {r.config['environment']['torch_version']}, Python {r.config['environment']['python_version']}"
                      for r in runs})
    commits = sorted({rp.training_commit(r, models_dir.parent / "journal") for r in runs})
    return {
        "report commit": tracking.git_commit(tracking.repo_root()), "training commit": "; ".join(commits),
        "profile": p.base.profile,
        "device": f"{runs[0].config['params']['device']} ({env['device_name']}); torch CUDA build {env['cuda_version']}",
        "training software": "; ".join(trained),
        "report software": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "runs": "; ".join(f"{v}: seeds {', '.join(str(r.seed) for r in runs if r.variant == v)}"
                          for v in dict.fromkeys(r.variant for r in runs)),
        "not run": "; ".join(f"{v}: seeds {', '.join(map(str, s))}" for v, s in not_run.items()) or "none",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "total training time": f"{sum(r.history.epoch_seconds.sum() for r in runs) / 60:.1f} min over {len(runs)} runs "
                               "(sum of each run's epoch times; runs trained side by side on one device overlap)",
        "seeds": ", ".join(map(str, p.ablation.seeds)),
    }
