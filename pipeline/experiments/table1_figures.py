"""Table 1's figures and the data of dvc.yaml's plots: every seed's error beside the paper's
(table1_errors.png), the effects with what would settle each (table1_effects.png), the best
reconstruction variant's reconstructions and Fig. 4, and the curves and confusion DVC plots.
Pure functions over loaded runs and table1_report's tables; pipeline.experiments.table1.report
calls them."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from safetensors.torch import load_file

from pipeline.core.files import write_text
from pipeline.report import claims as rc
from pipeline.report import figures, stats
from pipeline.report import runs as rr
from pipeline.report.rows import row_key, run_label, with_several_rows
from pipeline.report.runs import Run


def figures_of(runs: list[Run], summary: pd.DataFrame, results_dir: Path, fig_dir: Path) -> dict[str, str]:
    """Error bars of the first protocol (each seed, our mean's interval, the paper's mean ± σ) and
    the best reconstruction variant's reconstructions and Fig. 4."""
    headline = summary[summary.protocol == summary.protocol.iloc[0]]
    repeated = set(headline.variant[headline.variant.duplicated()])
    labels = [f"{r.variant} ({rr.short(r.commit)})" if r.variant in repeated else r.variant for r in headline.itertuples()]
    per_seed = [[r.metrics["error_pct"] for r in runs
                 if (r.variant, r.protocol, r.commit_key) == (h.variant, h.protocol, row_key(h.commit))]
                for h in headline.itertuples()]
    intervals = []  # our mean's 95 % t-interval over seeds (NaN with one seed)
    for errors in per_seed:
        n = len(errors)
        i = stats.t_interval(float(np.mean(errors)), [(float(np.var(errors, ddof=1)) / n, n - 1)]) if n > 1 else None
        intervals.append((i.lo, i.hi) if i else (math.nan, math.nan))
    figures.seed_errors(labels, per_seed, intervals, list(headline.paper_test_error),
                        list(headline.paper_test_error_std), fig_dir / "table1_errors.png")
    shown = {f"Test error per variant ({headline.protocol.iloc[0]})": "figures/table1_errors.png"}
    recon = headline[headline.reconstruction]
    if not len(recon):
        for name in ("reconstructions", "fig4"):
            figures.placeholder("No reconstruction variant in this report", fig_dir / f"{name}.png")
        return shown
    row = recon.sort_values("test_error_mean").iloc[0]
    best = row.variant
    best_run = min((r for r in runs if (r.variant, r.protocol, r.commit_key) == (best, row.protocol, row_key(row.commit))),
                   key=lambda r: r.metrics["error_pct"])  # the row's own runs, not another protocol's
    for name in ("reconstructions", "fig4"):
        shutil.copyfile(rr.run_figure(results_dir / best / f"seed{best_run.seed}", f"{name}.png"), fig_dir / f"{name}.png")
    shown[f"Reconstructions ({best}, seed {best_run.seed})"] = "figures/reconstructions.png"
    shown[f"Fig. 4 perturbations ({best}, seed {best_run.seed})"] = "figures/fig4.png"
    return shown


def effects_figure(effect_table: pd.DataFrame, protocol: str, fig_dir: Path) -> dict[str, str]:
    """The headline protocol's effects as a forest plot (table1_effects.png), each with what would
    settle it; a placeholder where that protocol has no pair of variants to compare."""
    here = effect_table[effect_table.protocol == protocol]
    path = fig_dir / "table1_effects.png"
    if not len(here):
        figures.placeholder("No pair of Table 1 variants to compare in this report", path)
        return {}
    notes = []
    for e in here.itertuples():
        if math.isnan(e.ci_low):
            notes.append("confounded: no interval")
        elif math.isnan(e.paper_delta):
            notes.append(f"±{rc.EQUIVALENCE_PP:.2f} pp: {e.equivalence_seeds} seeds/arm")
        else:
            notes.append("no seed count detects the paper's" if e.seeds_needed == rc.NONE_SUFFICES else
                         f"{e.seeds_needed} seeds/arm to detect the paper's")
    figures.effect_intervals(list(here.effect), list(here.our_delta), list(zip(here.ci_low, here.ci_high)),
                             list(here.paper_delta), notes, path)
    return {f"Ablation effects ({protocol})": "figures/table1_effects.png"}


def no_runs(fig_dir: Path, plot_dir: Path) -> None:
    """What a report without a Table 1 run writes in place of its figures and plot data (they are
    DVC outputs, there whatever the variants)."""
    for name in ("table1_errors", "table1_effects", "reconstructions", "fig4"):
        figures.placeholder("No Table 1 variant in this report", fig_dir / f"{name}.png")
    write_text(plot_dir / "learning_curves.csv", "variant,epoch,test_error_pct\n")
    write_text(plot_dir / "confusion.csv", "actual,predicted\n")


def dvc_plot_data(runs: list[rr.Run], summary, results_dir: Path, plot_dir: Path) -> None:
    """Data for dvc.yaml's top-level plots, from the first Table 1 protocol: per-epoch test error of
    every variant (mean over seeds; a variant trained at several commits is one line per commit)
    and the lowest-error variant's confusion on the MNIST test set (its best seed)."""
    summary = summary[summary.protocol == summary.protocol.iloc[0]]
    runs = [r for r in runs if r.protocol == summary.protocol.iloc[0]]
    ambiguous = with_several_rows(runs)  # within this protocol: rows of several commits
    curves = pd.concat([r.history.assign(variant=run_label(r, ambiguous))[["variant", "epoch", "test_error_pct"]]
                        for r in runs])
    curves = curves.groupby(["variant", "epoch"], sort=False, as_index=False).test_error_pct.mean()
    write_text(plot_dir / "learning_curves.csv", curves.to_csv(index=False, float_format="%.4f"))
    best = summary.sort_values("test_error_mean").iloc[0]
    run = min((r for r in runs if r.variant == best.variant and r.commit_key == row_key(best.commit)),
              key=lambda r: r.metrics["error_pct"])
    best = best.variant
    predictions = load_file(str(results_dir / best / f"seed{run.seed}" / "predictions.safetensors"))
    confusion = pd.DataFrame({"actual": predictions["test_labels"].numpy(), "predicted": predictions["test_preds"].numpy()})
    write_text(plot_dir / "confusion.csv", confusion.to_csv(index=False))
