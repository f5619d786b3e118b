"""What would settle each claim: the report's power analysis, its GPU cost, and the Claims section.

Three seeds make wide intervals, so most verdicts read "consistent" and most effects "not
distinguishable from noise". This module says which of the paper's claims the runs support or
contradict, and for the rest how many seeds it would take (pipeline.report.power: 80 % power for the
report's own two-sided interval, t-based, with each arm's measured seed variance) and what they
would cost on the device the runs trained on (pipeline.report.costs, from reports/benchmarks.md). Pure
functions over loaded runs and the report's tables; pipeline.report.document and report_stage call them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.report import costs
from pipeline.report import power
from pipeline.report import stats
from pipeline.report.runs import Run

# "matches" needs a margin: the smallest difference Table 1 itself calls an effect (routing 3 vs 1
# with reconstruction, 0.29 → 0.25 %). A recipe difference smaller than that changes none of its rows.
EQUIVALENCE_PP = 0.04
NONE_SUFFICES = "none suffices (the test set's own noise hides it)"  # an effect no seed count would detect


def run_cost(runs: list[Run], seeds: int, bench: list[costs.BenchRow], epochs: int | None = None) -> tuple[float, str]:
    """(GPU-hours for ``seeds`` more runs like ``runs``, under their protocol or, with ``epochs``, for
    that many epochs of their images per epoch at their speed, the bench row it comes from), or (NaN,
    why not): no recorded training length, runs that trained to a target accuracy (with ``epochs``),
    or no bench row for their variant (its own, or a stand-in's: costs.with_stand_ins), configuration and device."""
    run = runs[0]
    recorded = [r.images_trained for r in runs if r.images_trained]
    device = run.config.get("environment", {}).get("device_name", "")
    row = costs.speed(bench, run.variant, device, run.cfg)
    if not recorded:
        return math.nan, f"{run.variant}: training length not recorded"
    if row is None:
        return math.nan, (f"no bench row for {run.variant} ({costs.configuration(run.cfg)}) on "
                          f"{device or 'its device'} in reports/benchmarks.md")
    if epochs is None:
        return costs.gpu_hours(seeds, float(np.mean(recorded)), row), row.cite()
    if any(r.config.get("stop_reason") == "target" for r in runs):
        return math.nan, f"{run.variant} trained to a target accuracy, not for a number of epochs"
    per_epoch = [r.images_trained / r.epochs_trained for r in runs if r.images_trained and r.epochs_trained]
    return costs.gpu_hours(seeds, float(np.mean(per_epoch)) * epochs, row), row.cite()


def pair_cost(runs_a: list[Run], runs_b: list[Run], seeds: int | None,
              bench: list[costs.BenchRow], epochs: int | None = None) -> tuple[float, str]:
    """GPU-hours for ``seeds`` runs of each arm (under their protocol, or for ``epochs`` epochs:
    `run_cost`) and the rows they come from; NaN and why not."""
    if seeds is None:
        return math.nan, ""
    (ha, sa), (hb, sb) = run_cost(runs_a, seeds, bench, epochs), run_cost(runs_b, seeds, bench, epochs)
    if math.isnan(ha) or math.isnan(hb):  # no estimate: say why
        return math.nan, "; ".join(s for s, h in ((sa, ha), (sb, hb)) if math.isnan(h))
    return ha + hb, f"{sa}; {sb}"


def paper_protocol_cost(runs_a: list[Run], runs_b: list[Run], seeds: int | None,
                        bench: list[costs.BenchRow]) -> float:
    """`pair_cost` at the paper's PAPER_EPOCHS for arms that trained fewer epochs (the same seeds at the
    same speed: an estimate that also assumes the seeds spread at 640 epochs as they did here); NaN
    where the arms trained the paper's length already, or where `pair_cost` has no estimate."""
    if all(r.epochs_trained >= costs.PAPER_EPOCHS for r in runs_a + runs_b):
        return math.nan
    return pair_cost(runs_a, runs_b, seeds, bench, costs.PAPER_EPOCHS)[0]


def verdict_settling(runs: list[Run], errors: list[float], paper: float, paper_std: float | None,
                     bench: list[costs.BenchRow]) -> dict:
    """Columns of a Table 1 row (ours − paper): the equivalence margin the interval supports (two
    one-sided tests at 5 %), the seeds that would separate our mean from the paper's value at the
    observed difference (80 % power) and their GPU time."""
    out = {"equivalence_margin": math.nan, "seeds_to_separate": "–", "gpu_hours_to_separate": math.nan,
           "cost_source": ""}
    if len(errors) < 2 or math.isnan(paper):
        return out
    var, n, delta = float(np.var(errors, ddof=1)), len(errors), float(np.mean(errors)) - paper
    out["equivalence_margin"] = power.equivalence_margin(delta, power.paper_terms(var, n, paper_std))
    needed = power.seeds_needed(delta, lambda k: power.paper_terms(var, k, paper_std))
    out["seeds_to_separate"] = power.seeds_phrase(needed, delta)
    if needed is not None:
        out["gpu_hours_to_separate"], out["cost_source"] = run_cost(runs, needed, bench)
    return out


def effect_settling(parts: stats.EffectParts, paper_delta: float, runs_a: list[Run], runs_b: list[Run],
                    bench: list[costs.BenchRow]) -> dict:
    """Columns of an effect row: the minimum detectable effect with the seeds that ran, the seeds per
    arm that would detect the paper's effect (80 % power) and their GPU time for both arms."""
    known = parts.n_a > 1 and parts.n_b > 1
    mde = power.detectable(parts.terms()) if known else math.nan
    needed = power.effect_seeds_needed(parts, paper_delta) if known else None
    hours, source = pair_cost(runs_a, runs_b, needed, bench)
    phrase = power.seeds_phrase(needed, paper_delta) if known else "–"
    if needed is None and phrase.startswith("more than") and power.power(paper_delta, parts.floor()) < power.POWER:
        phrase = NONE_SUFFICES
    return {"mde": mde, "seeds_needed": phrase, "gpu_hours": hours, "cost_source": source,
            "paper_protocol_hours": paper_protocol_cost(runs_a, runs_b, needed, bench)}


def equivalence_settling(parts: stats.EffectParts, runs_a: list[Run], runs_b: list[Run],
                         bench: list[costs.BenchRow]) -> dict:
    """Columns of an effect the paper states none for ("matches": the recipes): the margin the
    interval supports (two one-sided tests at 5 %), and the seeds per arm that would detect an
    EQUIVALENCE_PP difference (80 % power) with their GPU time."""
    known = parts.n_a > 1 and parts.n_b > 1
    margin = power.equivalence_margin(parts.estimate, parts.terms()) if known else math.nan
    needed = power.effect_seeds_needed(parts, EQUIVALENCE_PP) if known else None
    hours, source = pair_cost(runs_a, runs_b, needed, bench)
    return {"equivalence_margin": margin, "equivalence_seeds": power.seeds_phrase(needed, EQUIVALENCE_PP) if known
            else "–", "equivalence_hours": hours, "cost_source": source,
            "equivalence_paper_protocol_hours": paper_protocol_cost(runs_a, runs_b, needed, bench)}


def hours_text(hours: float) -> str:
    """GPU-hours as the report writes them: two significant digits below 10, whole hours above, – for none."""
    return "–" if math.isnan(hours) else f"{hours:.2g}" if hours < 10 else f"{hours:,.0f}"


def hours_phrase(seeds: str, hours: float, why: str = "", paper_hours: float = math.nan) -> str:
    """', about 2.9 GPU-hours' for a seed count, then, where ``paper_hours`` is known, what the same
    seeds cost at the paper's 640 epochs; or why there is no estimate ('' without a count)."""
    if not seeds.isdigit():
        return ""
    if math.isnan(hours):
        return f", GPU time not estimated ({why or 'no bench row'})"
    at_paper = "" if math.isnan(paper_hours) else (f" (about {hours_text(paper_hours)} at the paper's "
                                                   f"{costs.PAPER_EPOCHS} epochs, if seeds spread there as here)")
    return f", about {hours_text(hours)} GPU-hours{at_paper}"


# (claim, the effect row it rests on): each a Table 1 or §5.2 statement of the paper
CLAIMS = [
    ("Routing helps: 3 iterations beat 1 (with reconstruction)", "routing 3 vs 1, with reconstruction"),
    ("Reconstruction helps (routing 3)", "reconstruction on vs off, routing 3"),
    ("CapsNet beats the baseline CNN (routing 3 + reconstruction)", "CapsNet r3 + recon vs baseline"),
    ("The official code's recipe matches the paper's text (routing 3 + reconstruction)",
     "official vs paper recipe, routing 3, with reconstruction"),
]
GAP_CLAIM = "§5.2: CapsNet is more robust to affine transformations than a CNN (affNIST accuracy)"


def _status(lo: float, hi: float, paper: float, n: int, seeds: str, hours: float, goal: str, why: str,
            paper_hours: float = math.nan) -> str:
    if (paper < 0 and hi < 0) or (paper > 0 and lo > 0):
        return "supported"
    if (paper < 0 and lo > 0) or (paper > 0 and hi < 0):
        return "contradicted"
    if seeds == NONE_SUFFICES:
        return f"not resolvable at {n} seeds, nor by more: no number of seeds would {goal} on this test set"
    if seeds.startswith("more than"):
        return f"not resolvable at {n} seeds — would need {seeds} seeds per arm to {goal}"
    return f"not resolvable at {n} seeds — needs {seeds} per arm to {goal}{hours_phrase(seeds, hours, why, paper_hours)}"


COLUMNS = ["claim", "paper", "ours", "status", "evidence", "cost_source", "gpu_hours", "protocol"]  # the runs' protocol


def effect_claims(effect_table: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """One row per Table 1 claim of the paper under ``protocol`` (the headline one), read from its
    effect: supported, contradicted, or not resolvable at n seeds with the seeds and GPU time it
    would take."""
    rows = []
    effects_here = effect_table[effect_table.protocol == protocol].set_index("effect")
    for claim, effect in CLAIMS:
        if effect not in effects_here.index:
            continue
        e = effects_here.loc[effect]
        equivalence = math.isnan(e.paper_delta)
        paper = "no difference (one method to the paper)" if equivalence else f"{e.paper_delta:+.2f} pp"
        ours = f"{e.our_delta:+.2f} pp " + ("(no interval)" if math.isnan(e.ci_low) else
                                             f"[{e.ci_low:+.2f}, {e.ci_high:+.2f}]")
        if equivalence:
            status = _equivalence_status(e)
        elif math.isnan(e.ci_low):
            status = f"not resolvable: {e.status}"
        else:
            status = _status(e.ci_low, e.ci_high, e.paper_delta, int(e.n_seeds), e.seeds_needed, e.gpu_hours,
                             f"detect the paper's {e.paper_delta:+.2f} pp at 80 % power", e.cost_source,
                             e.paper_protocol_hours)
        rows.append({"claim": claim, "paper": paper, "ours": ours, "status": status, "evidence": effect,
                     "cost_source": e.cost_source, "gpu_hours": e.equivalence_hours if equivalence else e.gpu_hours,
                     "protocol": protocol})
    return pd.DataFrame(rows, columns=COLUMNS)


def gap_claim(gap: dict) -> pd.DataFrame:
    """§5.2's claim (CapsNets are more robust to affine transforms than the CNN), from its gap."""
    rows = []
    if gap is not None:
        ours = f"{gap['gap']:+.2f} pp " + ("(no interval)" if math.isnan(gap["ci_low"]) else
                                           f"[{gap['ci_low']:+.2f}, {gap['ci_high']:+.2f}]")
        if math.isnan(gap["ci_low"]):
            status = f"not resolvable: {gap['verdict']}"
        else:
            status = _status(gap["ci_low"], gap["ci_high"], gap["paper_gap"], gap["n_seeds"], gap["seeds_needed"],
                             gap["gpu_hours"], f"detect the paper's {gap['paper_gap']:+.0f} pp at 80 % power",
                             gap["cost_source"])
        rows.append({"claim": GAP_CLAIM, "paper": f"{gap['paper_gap']:+.0f} pp (real affNIST)",
                     "ours": ours + f" ({gap['set']})", "status": status, "evidence": "§5.2 gap",
                     "cost_source": gap["cost_source"], "gpu_hours": gap["gpu_hours"], "protocol": gap["protocol"]})
    return pd.DataFrame(rows, columns=COLUMNS)


def _equivalence_status(e) -> str:
    """A "matches" claim: supported only within ±EQUIVALENCE_PP (two one-sided tests at 5 %)."""
    goal = f"detect a {EQUIVALENCE_PP:.2f} pp difference (Table 1's smallest effect) at 80 % power"
    seeds, hours, why = e.equivalence_seeds, e.equivalence_hours, e.cost_source
    paper_hours = e.equivalence_paper_protocol_hours
    if math.isnan(e.ci_low):  # confounded, or one seed a side: no interval, so no seed variance to plan with
        first = "both recipes at one commit" if str(e.status).startswith("confounded") else "a second seed of each recipe"
        plan = "" if seeds == "–" else f", {seeds} seeds per arm to {goal}{hours_phrase(seeds, hours, why, paper_hours)}"
        return f"not resolvable: {e.status}; settling it needs {first}{plan}"
    if e.ci_low > 0 or e.ci_high < 0:
        return "contradicted (the recipes differ beyond the noise)"
    if e.equivalence_margin <= EQUIVALENCE_PP:
        return f"supported: within ±{e.equivalence_margin:.2f} pp"
    return (f"not resolvable at {int(e.n_seeds)} seeds (within ±{e.equivalence_margin:.2f} pp only) — needs {seeds} "
            f"per arm to {goal}{hours_phrase(seeds, hours, why, paper_hours)}")


CLAIMS_RULE = ("Each claim is read from the 95 % seed-aware interval of its effect (the ablation effects below; "
               "§5.2's gap): **supported** when the interval lies wholly on the paper's side of 0, **contradicted** "
               "when wholly on the other side, otherwise **not resolvable** at the seeds that ran — then with the "
               "seeds per arm that would detect the paper's stated effect with 80 % power (the same t-interval, "
               "each arm's measured seed variance; pipeline/report/power.py) and what they cost "
               "on the runs' GPU at the runs' protocol (reports/benchmarks.md's row for each variant; an estimate) and, "
               f"for runs shorter than the paper's, at its {costs.PAPER_EPOCHS} epochs (the same seeds at the same speed, "
               "assuming the seeds spread there as they do here: only runs of that length can say). "
               f"\"Matches\" is supported only within ±{EQUIVALENCE_PP:.2f} pp (two one-sided tests at 5 %), "
               "Table 1's smallest effect.")


def render_claims(table: pd.DataFrame, protocol: str) -> list[str]:
    """The report's Claims section (markdown lines), under the headline ``protocol``."""
    lines = ["## Claims", "", f"Under the first protocol below ({protocol}). " + CLAIMS_RULE, "",
             "| claim | paper | ours (95 % interval) | status |", "|---|---|---|---|"]
    lines += [f"| {c.claim} | {c.paper} | {_ours(c, protocol)} | {c.status} |" for c in table.itertuples()]
    cites = [s for c in table.itertuples() if c.cost_source and not math.isnan(c.gpu_hours)
             for s in c.cost_source.split("; ")]
    if cites:
        lines += ["", "GPU time from " + costs.sources(cites)]
    return lines


def _ours(claim, headline: str) -> str:
    """A claim's "ours", naming its runs' protocol where it is not the headline one (§5.2's runs can
    lag a protocol behind Table 1's)."""
    return claim.ours if claim.protocol == headline else f"{claim.ours}, under {claim.protocol}"


def readme_lines(table: pd.DataFrame) -> list[str]:
    """The README block's claims, one line each (the headline protocol: the first claim's, Table 1's)."""
    headline = table.protocol.iloc[0]
    return [f"- {c.claim}: **{c.status}**; ours {_ours(c, headline)}, paper {c.paper}." for c in table.itertuples()]
