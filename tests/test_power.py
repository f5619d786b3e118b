"""What would settle a claim (pipeline.report.power, claims): the power and seeds-needed arithmetic
against hand computation and against simulated experiments, and the claim statuses. The GPU time a
plan costs: tests/test_costs.py."""

import math

import numpy as np
import pandas as pd
import pytest
from claim_rows import effect_row
from scipy import stats as sps

from pipeline.report import claims as rc
from pipeline.report import power
from pipeline.report import stats
from pipeline.report.stats import EffectParts, satterthwaite

Z95, Z80 = 1.959964, 0.841621  # normal quantiles: two-sided 95 %, 80 % power


def test_the_normal_limit_by_hand():
    """With a known SE (ν = ∞) the detectable effect at 80 % power is (z_0.975 + z_0.80)·SE = 2.80·SE."""
    terms = [(0.25, math.inf)]  # SE 0.5
    assert power.detectable(terms) == pytest.approx((Z95 + Z80) * 0.5, rel=1e-4)
    assert power.power((Z95 + Z80) * 0.5, terms) == pytest.approx(0.80, abs=1e-4)
    assert power.power(0.0, terms) == pytest.approx(0.05, abs=1e-6)  # the level, both tails
    # two-sided: the far tail counts (P(Z < −1.96 − 1) is tiny but not zero)
    one_tail = sps.norm.sf(Z95 - 1.0)
    assert power.power(0.5, terms) == pytest.approx(one_tail + sps.norm.cdf(-Z95 - 1.0), rel=1e-6)


def test_few_seeds_need_the_t_distribution():
    """4 degrees of freedom: the critical value is t = 2.776, not 1.96, so the same effect has far less power."""
    terms = [(1.0, 4)]
    assert power.power(0.0, terms) == pytest.approx(0.05, abs=1e-6)
    assert power.power(2.8, terms) < 0.6  # the normal shortcut would say 0.80
    assert power.detectable(terms) > 3.5


def _simulated_power(parts: EffectParts, delta: float, n: int, trials: int = 20000, seed: int = 0) -> float:
    """The share of simulated experiments (n seeds per arm, true difference ``delta``, each arm's seed
    spread and the test-set term as in ``parts``) whose Welch–Satterthwaite 95 % t-interval excludes 0."""
    rng = np.random.default_rng(seed)
    a = rng.normal(delta, math.sqrt(parts.var_a), (trials, n))
    b = rng.normal(0.0, math.sqrt(parts.var_b), (trials, n))
    v_test = parts.terms(n, n)[2][0]
    d = a.mean(1) - b.mean(1) + rng.normal(0.0, math.sqrt(v_test), trials)
    va, vb = a.var(1, ddof=1) / n, b.var(1, ddof=1) / n
    df = np.array([satterthwaite([(x, n - 1), (y, n - 1), (v_test, parts.units - 1)]) for x, y in zip(va, vb)])
    half = sps.t.ppf(0.975, df) * np.sqrt(va + vb + v_test)
    return float(np.mean(np.abs(d) > half))


@pytest.mark.parametrize("var_a, var_b, v_test, delta", [
    (1.0, 1.0, 0.0, 1.0),      # many seeds: n ≈ 17
    (2.25, 0.25, 0.0, 2.0),    # few seeds, unequal arms: t matters (n ≈ 5)
    (0.04, 0.01, 0.002, 0.2),  # a test-set term that more seeds do not remove
])
def test_seeds_needed_reach_80_percent_power_in_simulation_and_fewer_do_not(var_a, var_b, v_test, delta):
    parts = EffectParts(delta, var_a, 3, var_b, 3, v_test, 10_000)
    n = power.effect_seeds_needed(parts, delta)
    assert n is not None and n >= 3
    assert _simulated_power(parts, delta, n) == pytest.approx(0.80, abs=0.035)  # MC SE ≈ 0.003; Welch is approximate
    fewer = n - max(2, n // 4)  # a few seeds fewer per arm: clearly below
    assert _simulated_power(parts, delta, fewer) < 0.75


def test_each_arm_keeps_its_own_seed_variance():
    wide_a = EffectParts(0.0, 4.0, 3, 0.25, 3, 0.0, 10_000)
    wide_b = EffectParts(0.0, 0.25, 3, 4.0, 3, 0.0, 10_000)
    both_wide = EffectParts(0.0, 4.0, 3, 4.0, 3, 0.0, 10_000)
    assert power.effect_seeds_needed(wide_a, 1.0) == power.effect_seeds_needed(wide_b, 1.0)
    assert power.effect_seeds_needed(wide_a, 1.0) < power.effect_seeds_needed(both_wide, 1.0)


def test_more_seeds_average_away_per_image_noise_but_not_the_systematic_part():
    parts = EffectParts(0.1, 0.01, 3, 0.01, 3, 0.003, 10_000, systematic=10.0, within_a=30.0, within_b=30.0)
    assert parts.terms()[2][0] == pytest.approx(0.003)  # at the seeds that ran: the measured term
    assert parts.terms(30, 30)[2][0] == pytest.approx(0.003 * (10 + 2) / (10 + 20))
    assert parts.terms(10 ** 6, 10 ** 6)[2][0] == pytest.approx(0.003 * 10 / 30, rel=1e-4)
    assert parts.floor() == [(pytest.approx(0.003 * 10 / 30), 9_999)]  # unlimited seeds


def test_an_effect_below_the_test_sets_noise_needs_more_seeds_than_any_budget():
    parts = EffectParts(0.0, 0.01, 3, 0.01, 3, 0.04, 10_000)  # test-set SE 0.2 pp, no seed noise in it
    assert power.effect_seeds_needed(parts, 0.05) is None
    assert power.seeds_phrase(None, 0.05) == f"more than {power.MAX_SEEDS}"
    settle = rc.effect_settling(parts, 0.05, [], [], [])
    assert settle["seeds_needed"].startswith("none suffices") and math.isnan(settle["gpu_hours"])


def test_equivalence_margin_is_the_90_percent_interval_two_one_sided_tests():
    terms = [(0.01, math.inf)]  # SE 0.1
    assert power.equivalence_margin(0.05, terms) == pytest.approx(0.05 + 1.644854 * 0.1, rel=1e-5)


def test_claims_are_supported_contradicted_or_say_what_would_settle_them():
    table = pd.DataFrame([
        effect_row("routing 3 vs 1, with reconstruction", -0.04, -0.30, -0.05),  # wholly on the paper's side
        effect_row("reconstruction on vs off, routing 3", -0.10, 0.02, 0.30),  # wholly on the other side
        effect_row("CapsNet r3 + recon vs baseline", -0.14, -0.29, 0.06, seeds="10", hours=0.64),
        effect_row("official vs paper recipe, routing 3, with reconstruction", math.nan, -0.03, 0.02,
                equivalence_margin=0.03)])
    gap = {"gap": 5.0, "ci_low": 2.0, "ci_high": 8.0, "paper_gap": 13.0, "n_seeds": 3, "seeds_needed": "4",
           "gpu_hours": 1.0, "cost_source": "", "set": "affNIST-style set", "verdict": "smaller gap", "protocol": "p"}
    both = pd.concat([rc.effect_claims(table, "p"), rc.gap_claim(gap)], ignore_index=True)
    claims = both.set_index("evidence").status
    assert claims["routing 3 vs 1, with reconstruction"] == "supported"
    assert claims["reconstruction on vs off, routing 3"] == "contradicted"
    assert claims["CapsNet r3 + recon vs baseline"] == ("not resolvable at 3 seeds — needs 10 per arm to detect the "
                                                         "paper's -0.14 pp at 80 % power, about 0.64 GPU-hours")
    shorter = rc.effect_claims(pd.DataFrame([effect_row("reconstruction on vs off, routing 3", -0.10, -0.25, 0.10, seeds="13",
                                                     hours=0.81, paper_protocol_hours=10.4)]), "p")
    assert shorter.status[0].endswith("about 0.81 GPU-hours (about 10 at the paper's 640 epochs, if seeds spread there "
                                      "as here)")
    assert claims["official vs paper recipe, routing 3, with reconstruction"] == "supported: within ±0.03 pp"
    assert claims["§5.2 gap"] == "supported"
    one_seed = rc.effect_claims(pd.DataFrame([effect_row("official vs paper recipe, routing 3, with reconstruction",
                                                      math.nan, math.nan, math.nan, status="no interval (one seed)")]), "p")
    assert one_seed.status[0] == "not resolvable: no interval (one seed); settling it needs a second seed of each recipe"
    lines = rc.render_claims(both, "p")
    assert "GPU time from reports/benchmarks.md, GPU: one H100: capsnet_r3_recon bf16: 24,000 images/s." in lines


def test_a_recipe_claim_is_contradicted_beyond_the_noise_and_supported_only_within_the_margin():
    """"Matches": an interval wholly off 0 contradicts it; one within ±EQUIVALENCE_PP supports it; a wider
    margin is not resolvable, with the seeds that would see the margin and their GPU time (the claim's
    hours are the equivalence plan's, not the paper effect's)."""
    def claim(lo, hi, margin):
        effect = effect_row("official vs paper recipe, routing 3, with reconstruction", math.nan, lo, hi, hours=9.0,
                         equivalence_margin=margin, equivalence_seeds="30", equivalence_hours=2.5)
        return rc.effect_claims(pd.DataFrame([effect]), "p").iloc[0]
    assert claim(0.01, 0.05, 0.05).status == "contradicted (the recipes differ beyond the noise)"
    assert claim(-0.05, -0.01, 0.05).status == "contradicted (the recipes differ beyond the noise)"
    assert claim(-0.04, 0.04, 0.04).status == "supported: within ±0.04 pp"
    wide = claim(-0.06, 0.06, 0.06)
    assert wide.status == ("not resolvable at 3 seeds (within ±0.06 pp only) — needs 30 per arm to detect a 0.04 pp "
                           "difference (Table 1's smallest effect) at 80 % power, about 2.5 GPU-hours")
    assert wide.gpu_hours == 2.5


def test_a_claim_without_an_interval_says_why_and_the_readme_names_a_protocol_not_the_headline():
    """An effect or §5.2 gap without an interval carries its own reason; GPU time is cited only where
    it was estimated; the README's headline protocol is the first claim's."""
    confounded = effect_row("routing 3 vs 1, with reconstruction", -0.04, math.nan, math.nan,  # its plan priced: 24,000
                         status="confounded: no commit in common", our_delta=-0.04)
    no_interval = rc.effect_claims(pd.DataFrame([confounded]), "p")
    assert no_interval.status[0] == "not resolvable: confounded: no commit in common"
    gap = {"gap": 5.0, "ci_low": math.nan, "ci_high": math.nan, "paper_gap": 13.0, "n_seeds": 1, "seeds_needed": "–",
           "gpu_hours": math.nan, "cost_source": "GPU: one H100 | capsnet_affnist bf16: 9,000 images/s",
           "set": "affNIST-style set", "verdict": "one seed: no verdict", "protocol": "q"}
    gap_claim = rc.gap_claim(gap)
    assert gap_claim.status[0] == "not resolvable: one seed: no verdict"
    table = pd.concat([no_interval, gap_claim], ignore_index=True)
    cited = [line for line in rc.render_claims(table, "p") if line.startswith("GPU time from")]
    assert len(cited) == 1 and "24,000" in cited[0] and "9,000" not in cited[0]  # the gap's row priced nothing
    readme = rc.readme_lines(table)
    assert readme[0].endswith("ours -0.04 pp (no interval), paper -0.04 pp.")
    assert readme[1].endswith("ours +5.00 pp (no interval) (affNIST-style set), under q, paper +13 pp (real affNIST).")


def test_seeds_needed_count_up_to_the_budget_itself_and_a_margin_bounds_either_side():
    """The seed budget is inclusive; a difference of zero needs no seeds ('–'); a negative estimate's
    equivalence margin is its lower end's distance from 0."""
    reached_at_5 = lambda n: [(0.0 if n >= 5 else 100.0, 4)]  # noiseless from 5 seeds on
    assert power.seeds_needed(1.0, reached_at_5, max_seeds=5) == 5
    assert power.seeds_needed(1.0, reached_at_5, max_seeds=4) is None
    assert power.seeds_phrase(None, 0.0) == "–" and power.seeds_phrase(None, math.nan) == "–"
    assert power.equivalence_margin(-0.05, [(0.01, math.inf)]) == pytest.approx(0.05 + 1.644854 * 0.1, rel=1e-5)


def test_without_noise_any_difference_is_detected_and_none_is_not():
    """Seeds that agree exactly and no test-set term: SE 0, so the detectable effect is 0 and power is
    1 for any difference, 0 for none (the report prints ±0.00, never ±nan)."""
    assert power.detectable([(0.0, 2), (0.0, 2)]) == 0.0
    assert (power.power(0.01, [(0.0, 2)]), power.power(0.0, [(0.0, 2)])) == (1.0, 0.0)


def test_a_claim_not_resolvable_says_whether_more_seeds_would_settle_it_and_what_they_cost():
    """Beyond the seed budget, beyond any seed count, or a count with its GPU time: whole hours from
    10 on, and why where there is no estimate."""
    def status(seeds, hours=math.nan, why=""):
        return rc.effect_claims(pd.DataFrame([effect_row("routing 3 vs 1, with reconstruction", -0.04, -0.30, 0.20,
                                                      seeds=seeds, hours=hours, cost_source=why)]), "p").status[0]
    goal = "detect the paper's -0.04 pp at 80 % power"
    assert status(rc.NONE_SUFFICES) == ("not resolvable at 3 seeds, nor by more: no number of seeds would "
                                        f"{goal} on this test set")
    assert status("more than 100") == f"not resolvable at 3 seeds — would need more than 100 seeds per arm to {goal}"
    assert status("40", 1234.4) == f"not resolvable at 3 seeds — needs 40 per arm to {goal}, about 1,234 GPU-hours"
    unpriced = status("40", why="no bench row for capsnet_r1")
    assert unpriced == (f"not resolvable at 3 seeds — needs 40 per arm to {goal}, GPU time not estimated "
                        "(no bench row for capsnet_r1)")


def test_far_tails_of_the_noncentral_t_give_0_or_1_not_nan():
    """Two smoke seeds (1 degree of freedom) with a tiny spread: scipy's noncentral t returns NaN far in
    its tail, which stopped the smoke run's report; there the power is 1. Where scipy 1.17 returns NaN
    now: three seeds a side (ν = 4) and an effect 10 SE wide, its lower tail at −t_crit."""
    assert power.power(79.4, [(1e-6, 1.0)]) == 1.0
    assert power.power(10.0, [(1.0, 4.0)]) == pytest.approx(1.0, abs=1e-6)
    assert math.isfinite(power.detectable([(1e-6, 1.0)]))


def test_hours_read_whole_from_10_on_and_a_phrase_needs_a_seed_count():
    assert [rc.hours_text(h) for h in (0.642, 9.4, 99.6, 1234.4, math.nan)] == ["0.64", "9.4", "100", "1,234", "–"]
    assert rc.hours_phrase("–", math.nan) == "" and rc.hours_phrase("more than 100", 5.0) == ""
    assert rc.hours_phrase("12", math.nan) == ", GPU time not estimated (no bench row)"


def test_a_claim_of_a_positive_effect_reads_its_side_and_each_claim_reads_its_own_protocols_effect():
    """The §5.2 gap (the paper's +13 pp) is supported above 0, contradicted below, not resolvable across
    it; a claim reads its effect under the protocol asked for, not another protocol's; a positive paper
    effect and our interval are signed."""
    def gap(lo, hi):
        return rc.gap_claim({"gap": (lo + hi) / 2, "ci_low": lo, "ci_high": hi, "paper_gap": 13.0, "n_seeds": 3,
                             "seeds_needed": "4", "gpu_hours": 1.0, "cost_source": "", "set": "affNIST-style set",
                             "verdict": "", "protocol": "p"}).status[0]
    assert (gap(2.0, 8.0), gap(-8.0, -2.0)) == ("supported", "contradicted")
    assert gap(-1.0, 5.0).startswith("not resolvable at 3 seeds — needs 4 per arm")
    routing = "routing 3 vs 1, with reconstruction"
    table = pd.DataFrame([effect_row(routing, -0.04, -0.30, -0.06),
                          effect_row(routing, -0.04, 0.10, 0.30) | {"protocol": "q"}])
    first = rc.effect_claims(table, "p").iloc[0]
    assert (first.status, first.ours, first.protocol) == ("supported", "-0.18 pp [-0.30, -0.06]", "p")
    assert rc.effect_claims(table, "q").status[0] == "contradicted"
    positive = rc.effect_claims(pd.DataFrame([effect_row(routing, 0.10, 0.02, 0.30)]), "p").iloc[0]
    assert (positive.paper, positive.ours, positive.status) == ("+0.10 pp", "+0.16 pp [+0.02, +0.30]", "supported")


def test_a_confounded_recipe_claim_says_what_settles_it_then_the_seeds_and_hours_of_the_plan():
    confounded = effect_row("official vs paper recipe, routing 3, with reconstruction", math.nan, math.nan, math.nan,
                         status="confounded: no commit in common", equivalence_seeds="30", equivalence_hours=2.5)
    assert rc.effect_claims(pd.DataFrame([confounded]), "p").status[0] == (
        "not resolvable: confounded: no commit in common; settling it needs both recipes at one commit, 30 seeds per "
        "arm to detect a 0.04 pp difference (Table 1's smallest effect) at 80 % power, about 2.5 GPU-hours")


def test_the_paper_terms_are_the_verdicts_own_and_an_interval_needs_two_seeds():
    """paper_terms is the verdict's interval (stats.against_paper: the paper's σ over its trials with their
    degrees of freedom), and however large the effect, one seed has no interval: two at the least."""
    ours, paper, sigma = [0.30, 0.35, 0.42], 0.25, 0.02
    terms = power.paper_terms(float(np.var(ours, ddof=1)), len(ours), sigma)
    mine, theirs = stats.t_interval(float(np.mean(ours)) - paper, terms), stats.against_paper(ours, paper, sigma)
    assert (mine.lo, mine.hi, mine.df) == pytest.approx((theirs.lo, theirs.hi, theirs.df))
    assert power.seeds_needed(10.0, lambda n: [(0.01 / n, n - 1)]) == 2
