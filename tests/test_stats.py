"""Seed-aware intervals and verdicts (pipeline.report.stats) on hand-computable and simulated data."""

import math

import numpy as np
import pytest
from scipy import stats as sp

from pipeline.report import stats


def nested_errors(rates_pct, n):
    """(S, n) 0/1: seed s errs on its first rates_pct[s] % of the n images."""
    out = np.zeros((len(rates_pct), n), dtype=bool)
    for s, r in enumerate(rates_pct):
        out[s, :round(n * r / 100)] = True
    return out


def test_effect_is_welch_seed_terms_plus_the_paired_test_term_by_hand():
    a, b = nested_errors([1, 2, 3], 100), nested_errors([0, 0, 0], 100)
    got = stats.effect(a, b)
    assert got.estimate == pytest.approx(2.0)
    seed_term = np.var([1.0, 2.0, 3.0], ddof=1) / 3  # 1/3; B's seeds agree: 0
    per_image = np.array([100, 200 / 3, 100 / 3] + [0] * 97)  # seed-averaged A − B per image, in pp
    test_term = per_image.var(ddof=1) / 100
    assert got.se == pytest.approx(math.sqrt(seed_term + test_term))
    df = (seed_term + test_term) ** 2 / (seed_term ** 2 / 2 + test_term ** 2 / 99)
    assert got.df == pytest.approx(df)
    half = sp.t.ppf(0.975, df) * got.se
    assert (got.lo, got.hi) == pytest.approx((2.0 - half, 2.0 + half))


def test_seed_spread_widens_the_interval_and_one_seed_gives_none():
    same = stats.effect(nested_errors([2, 2, 2], 1000), nested_errors([1, 1, 1], 1000))
    spread = stats.effect(nested_errors([1, 2, 3], 1000), nested_errors([0.5, 1, 1.5], 1000))
    assert same.estimate == pytest.approx(spread.estimate) == pytest.approx(1.0)
    assert spread.hi - spread.lo > 2 * (same.hi - same.lo)
    one = stats.effect(nested_errors([2], 1000), nested_errors([1, 1, 1], 1000))
    assert one.estimate == pytest.approx(1.0) and not one.known and math.isnan(one.lo)
    assert stats.effect_words(one) == "no interval (one seed)"


def test_the_test_term_splits_into_seed_noise_and_the_systematic_difference_by_hand():
    """What power.py projects to more seeds: A's two seeds err on images 0, 1 and on image 0 (B never),
    so A's per-image seed variance is 0, 5000, 0, 0 pp² (mean 1250, which two seeds halve), and the
    seed-averaged difference 100, 50, 0, 0 pp has variance 6875/3 pp², of which 6875/3 − 1250/2 =
    5000/3 is systematic: no seed count removes it."""
    a = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=bool)
    b = np.zeros((2, 4), dtype=bool)
    parts = stats.effect_parts(a, b)
    assert (parts.within_a, parts.within_b) == (pytest.approx(1250.0), 0.0)
    assert parts.systematic == pytest.approx(5000 / 3)
    assert parts.v_test == pytest.approx(6875 / 3 / 4)  # the measured term: its variance over the 4 images
    assert parts.terms(4, 4)[2][0] == pytest.approx(parts.v_test * (5000 / 3 + 1250 / 4) / (6875 / 3))


def test_each_arm_s_seed_noise_leaves_the_test_term_over_its_own_seeds_and_one_image_has_none_systematic():
    """B's three seeds err on image 1 once: its per-image seed variance is 0, 3333⅓, 0, 0 pp² (mean 833⅓,
    which B's 3 seeds divide, A's 2 divide its 1250); the difference 100, 16⅔, 0, 0 pp has variance
    6875/3, so 6875/3 − 1250/2 − 2500/9 = 12500/9 is systematic. One image has no variance to split."""
    a = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=bool)
    b = np.array([[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    parts = stats.effect_parts(a, b)
    assert (parts.within_a, parts.within_b) == (pytest.approx(1250.0), pytest.approx(2500 / 3))
    assert parts.systematic == pytest.approx(12500 / 9)
    one_image = stats.effect_parts(np.array([[1], [0]], dtype=bool), np.array([[0], [0]], dtype=bool))
    assert one_image.systematic == 0.0


def test_a_test_term_of_one_group_adds_nothing_to_the_interval():
    """Every image from one source digit: one unit to resample, a test term (0, 0 df) that the
    degrees of freedom pass over (no division by its zero df), so the seed terms alone make the interval."""
    assert stats.satterthwaite([(0.01, 2), (0.0, 0)]) == pytest.approx(2.0)
    a, b = nested_errors([1, 2, 3], 100), nested_errors([0, 0, 0], 100)
    grouped = stats.effect(a, b, np.zeros(100, dtype=int))
    seeds_alone = stats.t_interval(2.0, [(1 / 3, 2)])
    assert (grouped.lo, grouped.hi) == pytest.approx((seeds_alone.lo, seeds_alone.hi))


def test_cluster_term_resamples_whole_digits_by_hand():
    digits, k = 100, 10
    a = np.zeros((3, digits * k), dtype=bool)
    a[:, :20 * k] = True  # every seed of A fails every transform of 20 digits, B nothing: Δ = +20 pp, no seed spread
    b = np.zeros_like(a)
    by_digit = stats.effect(a, b, groups=np.repeat(np.arange(digits), k))
    by_image = stats.effect(a, b)
    assert by_digit.estimate == by_image.estimate == pytest.approx(20.0)
    # digits: G/(G−1)·Σ_g (D_g − d·n_g)²/N² with D_g = 1000 for 20 digits, 0 for 80, d·n_g = 200
    assert by_digit.se == pytest.approx(math.sqrt(100 / 99 * (20 * 800 ** 2 + 80 * 200 ** 2) / 1000 ** 2))
    # images: var(δ, ddof=1)/N, δ = 100 on 200 images and 0 on 800
    assert by_image.se == pytest.approx(math.sqrt((200 * 80 ** 2 + 800 * 20 ** 2) / 999 / 1000))
    assert by_digit.se > 3 * by_image.se  # ten correlated transforms per digit are not ten samples


def test_coverage_is_95_percent_where_the_true_effect_is_known():
    """Simulated experiments with a known truth: each has a new test set (image difficulty h ~ U(0, 1))
    and new seeds (a model errs on images with h < its threshold, μ + σ·z per seed). The true effect
    is μ_A − μ_B = 1 pp; seed spread σ = 0.5 pp is the largest noise, as in the published runs.
    The interval must cover it 95 % of the time (measured: 94.1 %; Welch's t is a little liberal
    with 3 seeds a side): a 90 % interval (89.9 %) or one without the seed terms (about 55 %)
    falls outside [0.93, 0.97] (4,000 experiments: binomial SE 0.35 pp)."""
    rng = np.random.default_rng(0)
    experiments, seeds, n = 4000, 3, 1000
    h = rng.random((experiments, n))
    tau_a = (5.0 + 0.5 * rng.standard_normal((experiments, seeds))) / 100
    tau_b = (4.0 + 0.5 * rng.standard_normal((experiments, seeds))) / 100
    err_a = h[:, None, :] < tau_a[:, :, None]  # (E, S, N)
    err_b = h[:, None, :] < tau_b[:, :, None]
    covered = [(iv.lo <= 1.0 <= iv.hi) for iv in (stats.effect(err_a[e], err_b[e]) for e in range(experiments))]
    assert 0.93 <= np.mean(covered) <= 0.97
    narrower = [(iv.lo <= 1.0 <= iv.hi) for iv in (stats.effect(err_a[e], err_b[e], level=0.90)
                                                   for e in range(experiments))]
    assert np.mean(narrower) < 0.92  # the test tells 95 % from 90 %


def test_against_paper_combines_our_seeds_and_the_papers_sigma_by_hand():
    got = stats.against_paper([0.5, 1.0, 1.5], 0.25, 0.005)
    ours, theirs = 0.25 / 3, 0.005 ** 2 / 3  # s²/n with s = 0.5; σ_p²/3 trials
    df = (ours + theirs) ** 2 / (ours ** 2 / 2 + theirs ** 2 / 2)
    half = sp.t.ppf(0.975, df) * math.sqrt(ours + theirs)
    assert got.estimate == pytest.approx(0.75) and (got.lo, got.hi) == pytest.approx((0.75 - half, 0.75 + half))
    assert stats.verdict(got) == "consistent"  # 3 seeds this spread cannot tell 1.0 % from 0.25 %
    no_sigma = stats.against_paper([0.5, 1.0, 1.5], 0.25, None)  # the baseline, MultiMNIST: no paper σ
    assert no_sigma.df == pytest.approx(2) and no_sigma.se == pytest.approx(math.sqrt(ours))


@pytest.mark.parametrize("ours,paper,expected", [
    ([0.40, 0.42, 0.44], 0.25, "not reproduced"),  # tight seeds, all far above
    ([0.10, 0.12, 0.14], 0.25, "better"),
    ([0.20, 0.30, 0.40], 0.25, "consistent"),      # the paper's value inside our interval
    ([0.40], 0.25, "one seed: no verdict"),
])
def test_verdict_branches(ours, paper, expected):
    assert stats.verdict(stats.against_paper(ours, paper, 0.005)) == expected


def test_verdict_boundary_is_the_interval_edge():
    iv = stats.Interval(0.1, 0.0, 0.2, 0.05, 4)
    assert stats.verdict(iv) == "consistent"  # touching 0 is covering it
    assert stats.verdict(stats.Interval(0.1, 1e-9, 0.2, 0.05, 4)) == "not reproduced"
    assert stats.verdict(stats.Interval(-0.1, -0.2, -1e-9, 0.05, 4)) == "better"
    assert stats.effect_words(stats.Interval(-0.1, -0.2, -1e-9, 0.05, 4)) == "A lower, beyond seed and test noise"
    assert stats.effect_words(iv) == "not distinguishable from noise"
    upper = stats.Interval(-0.1, -0.2, 0.0, 0.05, 4)  # touching 0 from below covers it too
    assert (stats.verdict(upper), stats.effect_words(upper)) == ("consistent", "not distinguishable from noise")


def test_seeds_that_agree_exactly_give_an_interval_of_one_point_not_none():
    """Zero spread is a measurement (three seeds at one error), not a missing one: its interval is the
    estimate itself, so the verdict reads it."""
    tight = stats.t_interval(0.05, [(0.0, 2)])
    assert (tight.lo, tight.hi, tight.se) == (0.05, 0.05, 0.0) and tight.known
    assert stats.verdict(stats.against_paper([0.30, 0.30, 0.30], 0.25, None)) == "not reproduced"


def test_the_test_term_counts_the_groups_present_not_the_largest_id():
    """Source digits numbered 0 and 5 are two resampled units, as 0 and 1 are; one group is no unit to
    resample (no term, not a division by zero)."""
    diff = np.array([1.0, 3.0, 0.0, 2.0])
    assert stats.test_variance(diff, np.array([0, 0, 5, 5])) == stats.test_variance(diff, np.array([0, 0, 1, 1]))
    assert stats.test_variance(diff, np.array([0, 0, 1, 1]))[1] == 2
    assert stats.test_variance(diff, np.zeros(4, dtype=int)) == (0.0, 1)


def test_an_effect_refuses_arms_scored_on_different_images_and_one_seed_has_no_variance():
    with pytest.raises(ValueError, match="same test images"):
        stats.effect_parts(nested_errors([1, 2], 100), nested_errors([1, 2], 99))
    parts = stats.effect_parts(nested_errors([1, 2, 3], 100), nested_errors([1], 100))
    assert math.isnan(parts.var_b) and parts.n_b == 1 and not stats.interval_of(parts).known


def test_against_the_paper_honours_its_level():
    wide = stats.against_paper([0.5, 1.0, 1.5], 0.25, 0.005)
    narrow = stats.against_paper([0.5, 1.0, 1.5], 0.25, 0.005, level=0.80)
    assert narrow.estimate == wide.estimate and narrow.se == wide.se
    ratio = sp.t.ppf(0.9, wide.df) / sp.t.ppf(0.975, wide.df)  # the same SE and df, the 80 % quantile
    assert narrow.hi - narrow.lo == pytest.approx((wide.hi - wide.lo) * ratio)
