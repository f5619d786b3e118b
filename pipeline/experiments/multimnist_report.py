"""The report's MultiMNIST column (Table 1, paper §6): pair error per variant beside the paper's.

The paper gives single MultiMNIST numbers without a spread, so a verdict's interval is our seed
spread alone (pipeline.report.stats.against_paper without a paper σ). Table 1 is then rendered with both
columns, MNIST from the paper-recipe rows of the first protocol.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.report import figures
from pipeline.report import stats
from pipeline.report.document import fmt_ci, fmt_pct
from pipeline.report.rows import ordered_rows, row_commit
from pipeline.report.runs import Run, run_figure, short

PAPER_PAIRS_PER_DIGIT = 1_000  # §6: "1K MultiMNIST examples for each digit in the MNIST test set" (10M)


def test_size_deviation(pairs_per_digit: int, test_subset: int = 0) -> list[str]:
    """The deviation line when the MultiMNIST test set is not the paper's 1,000 partners per digit."""
    if pairs_per_digit == PAPER_PAIRS_PER_DIGIT:
        return []
    digits = test_subset or 10_000
    return [f"MultiMNIST test set: {pairs_per_digit:,} partners per test digit, {pairs_per_digit * digits:,} pairs "
            f"(the paper: {PAPER_PAIRS_PER_DIGIT:,}, 10M); every test digit is still the first digit of "
            f"{pairs_per_digit:,} pairs (and the partner in about as many), so only the pair-sampling error "
            f"grows (binomial SE ≤ "
            f"{100 * (0.25 / (pairs_per_digit * digits)) ** 0.5:.3f} pp)."]


ROWS = [  # Table 1's rows: (method, routing, reconstruction, MNIST variant)
    ("Baseline", "–", "–", "baseline_cnn"), ("CapsNet", 1, "no", "capsnet_r1"), ("CapsNet", 1, "yes", "capsnet_r1_recon"),
    ("CapsNet", 3, "no", "capsnet_r3"), ("CapsNet", 3, "yes", "capsnet_r3_recon"),
]


def multimnist_summary(runs: list[Run], reference: dict) -> pd.DataFrame:
    """One row per MultiMNIST variant, protocol and training code (the headline protocol's rows first,
    `rows.protocols`): pair error mean ± std over seeds, the paper's value, verdict."""
    rows = []
    for (variant, _, _), mine in ordered_rows(runs):
        errors = [r.metrics["error_pct"] for r in mine]
        paper = reference["multimnist"].get(variant, {})
        std = float(np.std(errors, ddof=1)) if len(errors) > 1 else math.nan
        mean = float(np.mean(errors))
        paper_error = paper.get("test_error_pct", math.nan)
        diff = stats.against_paper(errors, paper_error, None) if paper else None
        rows.append({"variant": variant, "protocol": mine[0].protocol, "commit": row_commit(mine),
                     "table1_row": paper.get("table1_row", ""), "n_seeds": len(mine),
                     "error_mean": mean, "error_std": std, "errors": " ".join(f"{e:.2f}" for e in errors),
                     "paper_error": paper_error, "delta": mean - paper_error,
                     "delta_ci_low": diff.lo if diff else math.nan, "delta_ci_high": diff.hi if diff else math.nan,
                     "verdict": stats.verdict(diff) if diff else "no paper value",
                     "n_params": mine[0].metrics["n_params"], "paper_n_params": paper.get("n_params", math.nan)})
    return pd.DataFrame(rows)


def _cell(mean: float, std: float) -> str:
    return f"{mean:.2f}" + ("" if math.isnan(std) else f" ± {std:.2f}")


def render_both_columns(table1: pd.DataFrame, multi: pd.DataFrame, reference: dict) -> list[str]:
    """Table 1 with both columns: MNIST (paper-recipe variants) and MultiMNIST, ours beside the paper's."""
    headline = table1[table1.protocol == table1.protocol.iloc[0]] if len(table1) else table1
    mnist, ours_by_row = {}, {}  # each column from its first protocol's rows, a variant's first row
    for r in headline.itertuples():
        mnist.setdefault(r.variant, r)
    for r in multi[multi.protocol == multi.protocol.iloc[0]].itertuples():
        ours_by_row.setdefault(r.table1_row, r)
    paper_by_row = {v["table1_row"]: v for v in reference["multimnist"].values() if isinstance(v, dict)}
    lines = ["## Table 1, both columns", "",
             "Test error in percent, ours (mean ± std over seeds, final epoch) beside the paper's. MNIST from the "
             "paper-recipe rows of the first Table 1 above"
             + (f" ({headline.protocol.iloc[0]})" if len(headline) else "") + "; MultiMNIST is the pair error on the "
             f"fixed test recipes (correct only when both digits are; {reference['multimnist']['source']}), from the "
             f"first rows of the table below ({multi.protocol.iloc[0]}). MultiMNIST "
             "verdicts as Table 1's, the interval holding our seed spread alone since the paper gives single numbers.", "",
             "| method | routing | recon | MNIST ours | MNIST paper | MultiMNIST ours | MultiMNIST paper | MultiMNIST verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for method, routing, recon, variant in ROWS:
        m = mnist.get(variant)
        mnist_ours = _cell(m.test_error_mean, m.test_error_std) if m is not None else "not run"
        mnist_paper = reference["table1"][variant]["test_error_pct"]
        ours, paper = ours_by_row.get(variant), paper_by_row.get(variant)
        if ours is not None:
            multi_cells = f"{_cell(ours.error_mean, ours.error_std)} | {ours.paper_error:.1f} | {ours.verdict}"
        elif paper is not None:
            multi_cells = f"not run | {paper['test_error_pct']:.1f} | –"
        else:
            multi_cells = "– | – | –"  # the paper has no MultiMNIST number for this row
        lines.append(f"| {method} | {routing} | {recon} | {mnist_ours} | {mnist_paper} | {multi_cells} |")
    lines += ["", "| MultiMNIST variant | protocol | commit | n | per seed (%) | paper (%) | Δ (pp) | interval of Δ "
              "| parameters (ours / paper) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in multi.itertuples():
        # a variant the paper has no number for shows dashes, never nan
        delta = "–" if math.isnan(r.paper_error) else f"{r.delta:+.2f}"
        paper_params = "–" if math.isnan(r.paper_n_params) else f"{r.paper_n_params / 1e6:.2f}M"
        lines.append(f"| {r.variant} | {r.protocol} | {short(r.commit)} | {r.n_seeds} | {r.errors} | "
                     f"{fmt_pct(r.paper_error, 1)} | {delta} | {fmt_ci(r.delta_ci_low, r.delta_ci_high)} | "
                     f"{r.n_params:,} / {paper_params} |")
    return lines


def figure(runs: list[Run], table, results_dir: Path, fig_dir: Path) -> dict[str, str]:
    """figures/multimnist_reconstructions.png: the Fig. 5 overlay of the lowest-error MultiMNIST
    reconstruction variant's best seed, or a placeholder saying there is none."""
    path = fig_dir / "multimnist_reconstructions.png"
    recon = [r for r in runs if r.config["config"]["reconstruction"]]
    if not recon:
        figures.placeholder("No MultiMNIST reconstruction variant in this report", path)
        return {}
    means = table.set_index("variant").error_mean
    best = min(recon, key=lambda r: (means[r.variant], r.metrics["error_pct"]))
    shutil.copyfile(run_figure(results_dir / best.variant / f"seed{best.seed}", "reconstructions.png"), path)
    return {f"MultiMNIST reconstructions ({best.variant}, seed {best.seed}; red and green: the two predicted "
            "capsules)": "figures/multimnist_reconstructions.png"}
