"""Table 1's part of the report: our error per (variant, protocol, commit) against the paper's,
seed-aware verdicts and ablation effects, what would settle each, end-of-training diagnostics,
the affine-shifted column and parameters (its figures: pipeline.experiments.table1_figures; its lines
of the README: pipeline.experiments.table1_readme).

Pure functions over loaded runs (pipeline.report.runs); pipeline.experiments.table1.report makes
them its Section. Runs of different protocols or commits are never pooled: each protocol gets its
own Table 1, and an effect between rows trained at different commits is marked confounded, with
no interval. The paper's numbers come from paper_reference.yaml (cited), never from code or
templates.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from pipeline.core.params import Params
from pipeline.core.protocol import PRECISION_SEEDS, bf16_allowed
from pipeline.models import baseline, capsnet
from pipeline.report import claims as rc
from pipeline.report import costs, stats
from pipeline.report.costs import BenchRow
from pipeline.report.document import _recorded, fmt_ci, fmt_pct
from pipeline.report.rows import commits_of, ordered_rows, protocols, row_commit, shared_commit
from pipeline.report.runs import LAST_EPOCHS, Run, best_epoch, short
from pipeline.training import train

EFFECTS = [  # (what changes, variant A, variant B): effect = error(A) − error(B)
    ("routing 3 vs 1, with reconstruction", "capsnet_r3_recon", "capsnet_r1_recon"),
    ("routing 3 vs 1, no reconstruction", "capsnet_r3", "capsnet_r1"),
    ("reconstruction on vs off, routing 1", "capsnet_r1_recon", "capsnet_r1"),
    ("reconstruction on vs off, routing 3", "capsnet_r3_recon", "capsnet_r3"),
    ("CapsNet r3 + recon vs baseline", "capsnet_r3_recon", "baseline_cnn"),
    # the paper has no number for these: its text and its code are one method to it
    ("official vs paper recipe, routing 1, no reconstruction", "capsnet_r1_official", "capsnet_r1"),
    ("official vs paper recipe, routing 1, with reconstruction", "capsnet_r1_recon_official", "capsnet_r1_recon"),
    ("official vs paper recipe, routing 3, no reconstruction", "capsnet_r3_official", "capsnet_r3"),
    ("official vs paper recipe, routing 3, with reconstruction", "capsnet_r3_recon_official", "capsnet_r3_recon"),
]

# the precision check (#36 item 6), (what changes, A, B): A trained under bf16 autocast, B its precision twin
# (params.yaml: variants.B.precision fp32) under the same protocol but in fp32, TF32 off; the paper has no
# number (its code trains fp32): the paper protocol trains in bf16 only if this is within the seed noise
PRECISION_EFFECTS = [("bf16 autocast vs fp32, routing 3, with reconstruction", "capsnet_r3_recon", "capsnet_r3_recon_fp32")]
TWIN_ORIGINALS = {b: a for _, a, b in PRECISION_EFFECTS}  # twin: its original
BF16, FP32 = "bf16 autocast", "fp32"  # pipeline.core.protocol.precision's words for the two arms


def table1_row(variant: str, recipe: str) -> str:
    """The paper's Table 1 row a variant replicates: an official-recipe twin shares its paper twin's row,
    a precision twin its original's."""
    variant = TWIN_ORIGINALS.get(variant, variant)
    return variant.removesuffix("_official") if recipe == "official" else variant


def _std(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def summarize(runs: list[Run], reference: dict, bench: list[BenchRow] = ()) -> pd.DataFrame:
    """One row per (variant, protocol, commit): our final-epoch error (mean ± std over seeds)
    beside the paper's, the seed-aware interval of the difference and its verdict, what would
    settle it (report_claims.verdict_settling, GPU time from ``bench``), end-of-training
    diagnostics and what the runs recorded of how they trained."""
    rows = []
    for (variant, _, _), mine in ordered_rows(runs):
        errors = [r.metrics["error_pct"] for r in mine]
        affine = [r.metrics["transformed_error_pct"] for r in mine]
        paper = reference["table1"].get(table1_row(variant, mine[0].recipe), {})
        best = [best_epoch(r.history) for r in mine]
        row = {
            "variant": variant, "protocol": mine[0].protocol, "commit": row_commit(mine),
            "commits": " ".join(commits_of(mine)),  # the codes that compute the row (README lines group by them)
            "model": mine[0].cfg["model"], "recipe": mine[0].recipe,
            "routing_iterations": mine[0].cfg["routing_iterations"], "reconstruction": mine[0].cfg["reconstruction"],
            "n_seeds": len(mine), "seeds": " ".join(str(r.seed) for r in mine),
            "test_error_mean": float(np.mean(errors)), "test_error_std": _std(errors),
            "test_errors": " ".join(f"{e:.2f}" for e in errors),
            "last5_error_mean": float(np.mean([r.last_epochs_error() for r in mine])),
            "last5_errors": " ".join(f"{r.last_epochs_error():.2f}" for r in mine),
            "final_lr": float(np.mean([r.final_lr for r in mine])),
            "final_epochs": " ".join(str(len(r.history)) for r in mine),
            "best_error_mean": float(np.mean([b[0] for b in best])),
            "best_errors": " ".join(f"{e:.2f}@{k}" for e, k in best),
            "paper_test_error": paper.get("test_error_pct", math.nan),
            "paper_test_error_std": paper.get("test_error_std") if paper.get("test_error_std") is not None else math.nan,
            "affine_test_error_mean": float(np.mean(affine)), "affine_test_error_std": _std(affine),
            "n_params": mine[0].metrics["n_params"], "paper_n_params": paper.get("n_params", math.nan),
            "adam_eps": _recorded([r.adam_eps for r in mine]),
            "resumed_runs": sum(bool(r.resume_epochs) for r in mine),
            "reruns": reference.get("reruns", {}).get(variant, "") if mine[0].recipe == "paper" else "",
        }
        diff = stats.against_paper(errors, row["paper_test_error"], paper.get("test_error_std")) if paper else None
        row["delta"] = row["test_error_mean"] - row["paper_test_error"]
        row["delta_ci_low"], row["delta_ci_high"] = (diff.lo, diff.hi) if diff else (math.nan, math.nan)
        row["verdict"] = stats.verdict(diff) if diff else "no paper value"
        row |= rc.verdict_settling(mine, errors, row["paper_test_error"], paper.get("test_error_std"), list(bench))
        rows.append(row)
    return pd.DataFrame(rows)


def effects(runs: list[Run], reference: dict, bench: list[BenchRow] = ()) -> pd.DataFrame:
    """The paper's ablation effects per protocol, with seed-aware intervals (pipeline.report.stats.effect)
    and what would settle them (report_claims.effect_settling, GPU time from ``bench``).

    Only runs of one protocol are compared, and only rows of A and B trained by one commit's code
    (`rows.shared_commit`: the same commit, or, for rows grouped by training fingerprint, a commit
    both rows' runs came from or whose fingerprint table computes both); where none is shared the row says `confounded` and carries no
    interval (its seed variances still plan the re-run)."""
    rows = []
    table1 = reference["table1"]
    for key in protocols(runs):
        by_variant = _by_variant(runs, key)
        label = next(r.protocol for r in runs if r.protocol_key == key)
        for what, a, b in EFFECTS:
            if a in by_variant and b in by_variant:
                paper = table1[a]["test_error_pct"] - table1[b]["test_error_pct"] if a in table1 and b in table1 else math.nan
                rows.append(_effect_row(label, what, a, b, by_variant[a], by_variant[b], paper, bench))
        twins = _by_variant(runs, (*key[:-1], FP32)) if key[-1] == BF16 else {}  # the same protocol in fp32
        for what, a, b in PRECISION_EFFECTS:
            if a in by_variant and b in twins:
                rows.append(_effect_row(label, what, a, b, by_variant[a], twins[b], math.nan, bench))
    return pd.DataFrame(rows, columns=["protocol", "effect", "a", "b", "paper_delta", "commit", "our_delta",
                                       "ci_low", "ci_high", "per_seed", "status", "n_seeds", "mde", "seeds_needed",
                                       "gpu_hours", "cost_source", "paper_protocol_hours", "equivalence_margin",
                                       "equivalence_seeds", "equivalence_hours", "equivalence_paper_protocol_hours"])


def _by_variant(runs: list[Run], key: tuple) -> dict[str, dict[str, list[Run]]]:
    """The runs of protocol ``key``: {variant: {commit_key: runs}}."""
    out: dict[str, dict[str, list[Run]]] = {}
    for r in runs:
        if r.protocol_key == key:
            out.setdefault(r.variant, {}).setdefault(r.commit_key, []).append(r)
    return out


def _effect_row(label: str, what: str, a: str, b: str, rows_a: dict[str, list[Run]], rows_b: dict[str, list[Run]],
                paper: float, bench: list[BenchRow]) -> dict:
    """One effect's row: error(A) − error(B) between rows of A and B one commit's code trains (else
    `confounded`, no interval), with what would settle it."""
    row = {"protocol": label, "effect": what, "a": a, "b": b, "paper_delta": paper}
    pairs = [(ka, kb, c) for ka in rows_a for kb in rows_b if (c := shared_commit(rows_a[ka], rows_b[kb]))]
    # of the pairs one commit's code trains, the one with the most seeds a side (the first on a tie): an
    # earlier window's single seeds never stand for a later window's three
    pair = max(pairs, key=lambda p: min(len(rows_a[p[0]]), len(rows_b[p[1]])), default=None)
    ra, rb = (rows_a[pair[0]], rows_b[pair[1]]) if pair else (next(iter(rows_a.values())), next(iter(rows_b.values())))
    err_a = np.stack([~r.correct["test"] for r in ra])  # (m, N)
    err_b = np.stack([~r.correct["test"] for r in rb])  # (n, N)
    parts = stats.effect_parts(err_a, err_b)
    row |= {"n_seeds": min(len(ra), len(rb))} | rc.effect_settling(parts, paper, ra, rb, list(bench))
    row |= rc.equivalence_settling(parts, ra, rb, list(bench)) if math.isnan(paper) else {}
    if not pair:
        return row | {
            "commit": "", "our_delta": _mean_error(ra) - _mean_error(rb), "ci_low": math.nan, "ci_high": math.nan,
            "per_seed": "", "mde": math.nan, "equivalence_margin": math.nan,
            "status": (f"confounded: {a} trained at {_origins(rows_a)} (Adam ε {_recorded([r.adam_eps for r in ra])}), "
                       f"{b} at {_origins(rows_b)} (Adam ε {_recorded([r.adam_eps for r in rb])}), no commit in common")}
    interval = stats.interval_of(parts)  # the parts above: per-image arrays read once
    seeds_b = {r.seed: r.metrics["error_pct"] for r in rb}
    per_seed = " ".join(f"{r.metrics['error_pct'] - seeds_b[r.seed]:+.2f}" for r in ra if r.seed in seeds_b)
    return row | {"commit": pair[2], "our_delta": interval.estimate, "ci_low": interval.lo, "ci_high": interval.hi,
                  "per_seed": per_seed, "status": stats.effect_words(interval)}


def precision_decision(effect) -> str:
    """What the precision check's effect row (bf16 − fp32) decides for the paper protocol (#36 item 6):
    bf16 autocast where its interval holds 0 (the difference within the seed noise), else fp32."""
    within = bf16_allowed(effect.ci_low, effect.ci_high, int(effect.n_seeds))
    if within is None:
        why = effect.status if math.isnan(effect.ci_low) else \
            f"{int(effect.n_seeds)} seed(s) a side of the {PRECISION_SEEDS} it needs"
        return f"undecided ({why}): the paper protocol trains in fp32"
    bound = "" if math.isnan(effect.equivalence_margin) else \
        f" (two one-sided tests at 5 % bound it within ±{effect.equivalence_margin:.2f} pp)"
    return (f"bf16 − fp32 = {effect.our_delta:+.2f} pp {fmt_ci(effect.ci_low, effect.ci_high)} over {int(effect.n_seeds)} "
            f"seeds a side{bound}: " + ("within the seed noise, so the paper protocol may train in bf16 autocast"
                                        if within else "beyond the seed noise, so the paper protocol trains in fp32"))


def precision_lines(effect_table: pd.DataFrame, label: str) -> list[str]:
    """A paragraph per precision-check row of ``effect_table``: ``label``, then what it decides."""
    return [line for e in effect_table.itertuples() if e.b in TWIN_ORIGINALS
            for line in ("", f"{label}: {precision_decision(e)}.")]


def _origins(rows: dict[str, list[Run]]) -> str:
    """A variant's rows' origins (`row_commit`, commits shortened), for a confounded effect's status."""
    return "; ".join(short(row_commit(runs)) for runs in rows.values())


def _mean_error(runs: list[Run]) -> float:
    return float(np.mean([r.metrics["error_pct"] for r in runs]))


EFFECT_RULE = ("Effect = error(A) − error(B) in percentage points; negative means A errs less. Interval: "
               f"{stats.LEVEL:.0%}, **seed-aware**: SE² = s_A²/n_A + s_B²/n_B (seed-to-seed variance of each variant) "
               "+ the test-set sampling variance of the seed-averaged paired per-image difference; Student's t with "
               "Welch–Satterthwaite degrees of freedom (≈ 4 for 3 seeds a side, so t ≈ 2.8). This is the closed form "
               "of a two-level bootstrap (seeds, then test images) without its small-sample narrowing; the seed terms "
               "already hold each model's own image noise, so it errs on the wide side. Only runs of one protocol and "
               "one commit are compared: otherwise the row says `confounded` and gives no interval. Per seed: "
               "error(A) − error(B) for each seed both have, context for the spread.")


def _table1_lines(rows: pd.DataFrame, reference: dict) -> list[str]:
    lines = ["| variant | recipe | routing | recon | commit | n | ours (%) | per seed | paper (%) | Δ (pp) | "
             f"{stats.LEVEL:.0%} interval of Δ | verdict | re-runs (context) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, r in rows.iterrows():
        capsnet_row = r.model == "capsnet"
        routing = r.routing_iterations if capsnet_row else "–"
        recon = ("yes" if r.reconstruction else "no") if capsnet_row else "–"
        paper = fmt_pct(r.paper_test_error) + ("" if math.isnan(r.paper_test_error_std) else f" ± {r.paper_test_error_std:.3f}")
        lines.append(f"| {r.variant} | {r.recipe if capsnet_row else '–'} | {routing} | {recon} | {short(r.commit)} | "
                     f"{r.n_seeds} | {fmt_pct(r.test_error_mean)} ± {fmt_pct(r.test_error_std)} | {r.test_errors} | "
                     f"{paper} | {r.delta:+.2f} | {fmt_ci(r.delta_ci_low, r.delta_ci_high)} | {r.verdict} | {r.reruns} |")
    return lines


def render_table1(summary: pd.DataFrame, effect_table: pd.DataFrame, reference: dict) -> list[str]:
    """Per protocol present: Table 1, end of training and checkpoint selection, ablation effects."""
    lines = [f"MNIST test error in percent, the **final epoch's**: ours as mean ± sample std over n seeds (per-seed "
             f"values beside), the paper's from {reference['source']} (Table 1). {stats.VERDICT_RULE}", "",
             "Recipe `paper` trains what the paper's text says; `official` what the authors' code computes "
             "(loss scale, PrimaryCaps scaling, DigitCaps bias, initialisation: see Deviations); both are "
             "compared with the same Table 1 value. A row is one variant under one protocol at one training commit: "
             "runs that differ in either are never pooled."]
    for protocol in dict.fromkeys(summary.protocol):
        rows = summary[summary.protocol == protocol]
        lines += ["", f"## Table 1 — {protocol}", "", *_table1_lines(rows, reference)]
        lines += ["", "### End of training and checkpoint selection", "",
                  f"A **stability diagnostic**, not a headline: the learning rate at the last epoch, and the mean "
                  f"test error of the last {LAST_EPOCHS} epochs beside the final epoch's (a final epoch is one noisy "
                  "point while the learning rate is still high). The best epoch is **selected on the test set, so it "
                  "is optimistic**: shown because several public re-runs report it and the paper does not say which "
                  "checkpoint it used.", "",
                  f"| variant | commit | final epoch (%) | mean of last {LAST_EPOCHS} (%) | per seed | lr at last epoch | "
                  "epochs | best epoch (%, selected on test) | per seed (error@epoch) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for _, r in rows.iterrows():
            lines.append(f"| {r.variant} | {short(r.commit)} | {fmt_pct(r.test_error_mean)} | {fmt_pct(r.last5_error_mean)} | "
                         f"{r.last5_errors} | {r.final_lr:.2g} | {r.final_epochs} | {fmt_pct(r.best_error_mean)} | "
                         f"{r.best_errors} |")
        mine = effect_table[effect_table.protocol == protocol]
        if len(mine):
            lines += ["", "### Ablation effects", "", EFFECT_RULE, "",
                      f"| effect | paper | ours | {stats.LEVEL:.0%} interval | per seed | what the interval supports |",
                      "|---|---|---|---|---|---|"]
            for _, e in mine.iterrows():
                paper = "– (no number)" if math.isnan(e.paper_delta) else f"{e.paper_delta:+.2f}"
                lines.append(f"| {e.effect} | {paper} | {e.our_delta:+.2f} | {fmt_ci(e.ci_low, e.ci_high)} | "
                             f"{e.per_seed or '–'} | {e.status} |")
            lines += ["", *_effect_power_lines(mine)]
            lines += precision_lines(mine, "**Precision check** (bf16 autocast against the same protocol in fp32, "
                                           "TF32 off; issue #36 item 6)")
        lines += ["", *_verdict_power_lines(rows)]
    return lines


def render_section(summary: pd.DataFrame, effect_table: pd.DataFrame, reference: dict) -> list[str]:
    """Table 1's section of ablation.md: Table 1 per protocol (end of training, effects, what would
    settle them), the affine-shifted column, the parameter counts."""
    lines = render_table1(summary, effect_table, reference)
    lines += ["", "## Affine-shifted test set", "",
              "Every variant evaluated, without retraining, on the MNIST test digits, each under one random affine "
              "transform from affNIST's ranges (see README). **The paper reports no number on this set**; its §5.2 "
              "affNIST experiment trains differently (40×40 canvas): see the §5.2 section below.", "",
              "| variant | protocol | commit | MNIST test error (%) | affine-shifted error (%) |", "|---|---|---|---|---|"]
    for _, r in summary.iterrows():
        lines.append(f"| {r.variant} | {r.protocol.split(':')[0]} | {short(r.commit)} | {fmt_pct(r.test_error_mean)} ± "
                     f"{fmt_pct(r.test_error_std)} | {fmt_pct(r.affine_test_error_mean)} ± {fmt_pct(r.affine_test_error_std)} |")
    lines += ["", "## Parameters", "", "| variant | ours | paper |", "|---|---|---|"]
    for _, r in summary.drop_duplicates("variant").iterrows():
        lines.append(f"| {r.variant} | {int(r.n_params):,} | {r.paper_n_params / 1e6:.1f}M |")
    return lines


POWER_RULE = ("80 % power for the same two-sided 95 % seed-aware t-interval (pipeline/report/power.py): the noncentral t "
              "with Welch–Satterthwaite degrees of freedom recomputed at each seed count, each arm's measured seed "
              "variance; of the test-set term, the per-image seed noise shrinks with more seeds and the systematic "
              "per-image difference stays. GPU time: that many seeds of each arm under this protocol at the speed "
              "reports/benchmarks.md measured for the variant on the runs' device (an estimate; sources below the "
              f"table); at {costs.PAPER_EPOCHS} epochs: the same seeds for the paper protocol's length at the same "
              "speed, which also assumes the seeds spread there as they do here (only runs of that length can say).")


def _sources(table: pd.DataFrame, hours: str) -> list[str]:
    """The bench rows behind the table's GPU-hours (rows without an estimate say why in cost_source)."""
    cites = [c for t, h in zip(table.cost_source, table[hours]) if t and not math.isnan(h) for c in t.split("; ")]
    return ["", "Speeds: " + costs.sources(cites)] if cites else []


def _effect_power_lines(effect_table: pd.DataFrame) -> list[str]:
    """What would settle each effect: the minimum detectable effect with the seeds that ran, and the
    seeds per arm (and GPU time) that would detect the paper's."""
    lines = ["#### What would settle each effect", "", POWER_RULE, "",
             "| effect | paper | seeds run (per arm) | detectable at 80 % power (pp) | seeds per arm for the paper's "
             f"effect | GPU-hours (both arms) | at {costs.PAPER_EPOCHS} epochs |", "|---|---|---|---|---|---|---|"]
    for e in effect_table.itertuples():
        paper = "– (no number)" if math.isnan(e.paper_delta) else f"{e.paper_delta:+.2f}"
        mde = "– (no interval)" if math.isnan(e.mde) else f"±{e.mde:.2f}"
        if math.isnan(e.paper_delta):  # "matches": the seeds that would see Table 1's smallest effect
            seeds = f"{e.equivalence_seeds} (to see ±{rc.EQUIVALENCE_PP:.2f})"
            hours, paper_hours = e.equivalence_hours, e.equivalence_paper_protocol_hours
        else:
            seeds, hours, paper_hours = e.seeds_needed, e.gpu_hours, e.paper_protocol_hours
        lines.append(f"| {e.effect} | {paper} | {e.n_seeds} | {mde} | {seeds} | {rc.hours_text(hours)} | "
                     f"{rc.hours_text(paper_hours)} |")
    return lines + _sources(effect_table.assign(hours=[e if math.isnan(p) else g for p, e, g in zip(
        effect_table.paper_delta, effect_table.equivalence_hours, effect_table.gpu_hours)]), "hours")


def _verdict_power_lines(rows: pd.DataFrame) -> list[str]:
    """What would settle each verdict: how close to the paper the interval puts us, and the seeds that
    would separate our mean from the paper's at the observed difference."""
    lines = ["### What would settle each verdict", "",
             "Equivalence: the 90 % interval of ours − paper (two one-sided tests at 5 %) lies within ±x pp. Seeds to "
             "separate: the seeds of ours whose 95 % interval excludes the paper's value with 80 % power if the true "
             "difference is the one observed (the paper's σ over its 3 trials held; 80 % power, the same t-interval "
             "with its degrees of freedom recomputed at each seed count). GPU time: that many seeds of the variant "
             "under this protocol at the speed reports/benchmarks.md measured for it on the runs' device (an estimate).",
             "", "| variant | commit | n | Δ (pp) | verdict | within ±x pp of the paper | seeds to separate | GPU-hours |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        margin = "–" if math.isnan(r.equivalence_margin) else f"±{r.equivalence_margin:.2f}"
        lines.append(f"| {r.variant} | {short(r.commit)} | {r.n_seeds} | {r.delta:+.2f} | {r.verdict} | {margin} | "
                     f"{r.seeds_to_separate} | {rc.hours_text(r.gpu_hours_to_separate)} |")
    return lines + _sources(rows, "gpu_hours_to_separate")


def deviations(params: Params, reference: dict) -> list[str]:
    """The Table 1 deviations: the modules' DEVIATIONS, the profile's recipe changes, data subsets.
    Each experiment's own (§5.2, MultiMNIST) come from its report module."""
    out = list(capsnet.DEVIATIONS)
    recipes = {v.recipe for name, v in params.variants.items() if name in params.ablation.variants and v.model == "capsnet"}
    out += (capsnet.PAPER_RECIPE_DEVIATIONS if "paper" in recipes else [])
    out += (capsnet.OFFICIAL_RECIPE_DEVIATIONS if "official" in recipes else [])
    out += baseline.DEVIATIONS + train.DEVIATIONS
    out += recipe_differences(dataclasses.asdict(params.train), reference)
    if params.train.amp:
        out.append(train.BF16_NOTE)
    if not params.train.deterministic:
        out.append("train.deterministic = false: cuDNN autotuning and non-deterministic GPU kernels, so a re-run "
                   "of the same seed is not bit-identical (the paper protocol trains with deterministic: true).")
    if params.prepare.train_subset or params.prepare.test_subset:
        out.append(f"Data subsets: first {params.prepare.train_subset or 'all'} training and "
                   f"{params.prepare.test_subset or 'all'} test digits (prepare.*_subset).")
    return out


def recipe_differences(train_params: dict, reference: dict) -> list[str]:
    """The profile's training params that differ from the paper protocol."""
    recipe = reference["recipe"]
    return [f"train.{k} = {train_params[k]} (paper protocol: {recipe[k]})"
            for k in recipe if k != "source" and train_params.get(k) != recipe[k]]
