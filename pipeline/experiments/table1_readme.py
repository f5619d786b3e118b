"""Table 1's lines of the README's results block, from results.csv and effects.csv as the report stage
wrote them: the first protocol's Table 1 with its verdicts and effects, then every other protocol's
Table 1 apart (a line per recipe and training code, a column per Table 1 row, the paper's last).
The report's own tables: pipeline.experiments.table1_report."""

from __future__ import annotations

import math

import pandas as pd

from pipeline.experiments.table1_report import precision_lines
from pipeline.report import stats
from pipeline.report.document import fmt_ci, fmt_pct
from pipeline.report.rows import cohorts
from pipeline.report.runs import short


README_COLUMNS = [("baseline", "baseline_cnn"), ("r1", "capsnet_r1"), ("r1 + recon", "capsnet_r1_recon"),
                  ("r3", "capsnet_r3"), ("r3 + recon", "capsnet_r3_recon")]


def _cell(row, seeds: int) -> str:
    """A README cell: mean ± std, the seed count where it is short of ``seeds`` (the most any row has), the verdict."""
    short_of = f" ({row.n_seeds} seeds)" if 1 < row.n_seeds < seeds else ""
    return f"{row.test_error_mean:.2f} ± {fmt_pct(row.test_error_std)}{short_of}: {row.verdict}"


def _readme_table(rows: pd.DataFrame, seeds: int, paper: dict[str, float]) -> list[str]:
    """One protocol's Table 1 as the README shows it: a line per recipe and training code (`cohorts`: the
    rows one commit's code computes), a column per Table 1 row, the paper's values (``paper``: variant ->
    its Table 1 error, read from every protocol's rows) last."""
    lines = ["| | " + " | ".join(name for name, _ in README_COLUMNS) + " |", "|---|" + "---|" * len(README_COLUMNS)]
    for recipe in dict.fromkeys(rows.recipe):
        mine = rows[rows.recipe == recipe]
        commits = dict(zip(mine.commit, mine.commits.fillna("").str.split()))  # a CSV's empty cell reads as NaN
        for commit, labels in cohorts(commits):  # rows trained by one commit's code on a line
            by: dict[str, list] = {}
            for r in mine[mine.commit.isin(labels)].itertuples():  # two fingerprints of a variant at one commit: both
                by.setdefault(r.variant, []).append(r)
            cells = [by.get(v if recipe == "paper" or v == "baseline_cnn" else f"{v}_official", []) for _, v in README_COLUMNS]
            lines.append(f"| {recipe} recipe ({short(commit)}) | "
                         + " | ".join("; ".join(_cell(r, seeds) for r in c) or "–" for c in cells) + " |")
    lines.append("| paper (Table 1) | " + " | ".join(
        fmt_pct(paper[v]) if v in paper else "–" for _, v in README_COLUMNS) + " |")
    return lines


def readme_lines(results: pd.DataFrame, effect_table: pd.DataFrame) -> list[str]:
    """Table 1's lines of the README's results block, from results.csv and effects.csv as written:
    the first protocol's Table 1 with its verdicts and every effect, each worded by its interval; then
    every other protocol's Table 1, never pooled with it (its effects are the report's)."""
    protocol, *others = dict.fromkeys(results.protocol)
    seeds, paper = int(results.n_seeds.max()), dict(zip(results.variant, results.paper_test_error))
    lines = [f"Protocol: **{protocol}**; MNIST test error (%), final epoch, mean ± std over seeds, "
             f"with the verdict of its {stats.LEVEL:.0%} seed-aware interval against the paper:", "",
             *_readme_table(results[results.protocol == protocol], seeds, paper)]
    effects_here = effect_table[effect_table.protocol == protocol]
    if len(effects_here):
        lines += ["", f"Effects, error(A) − error(B) in pp with the {stats.LEVEL:.0%} seed-aware interval:", ""]
        for e in effects_here.itertuples():
            paper_delta = "" if math.isnan(e.paper_delta) else f"; paper {e.paper_delta:+.2f}"
            interval = "(no interval)" if math.isnan(e.ci_low) else fmt_ci(e.ci_low, e.ci_high)
            lines.append(f"- {e.effect}: {e.our_delta:+.2f} {interval}, {e.status}{paper_delta}.")
        lines += precision_lines(effects_here, "Precision check")
    for other in others:
        rows = results[results.protocol == other]
        runs = int(rows.n_seeds.sum())
        lines += ["", f"Protocol: **{other}**, {runs} run{'s' * (runs != 1)}, never pooled with the table above "
                  "(its effects, and what each verdict would take: reports/ablation.md):", "", *_readme_table(rows, seeds, paper),
                  *precision_lines(effect_table[effect_table.protocol == other], "Precision check")]
    return lines
