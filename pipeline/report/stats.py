"""Seed-aware statistics for the report: intervals that include the spread between training seeds.

With three seeds, seed-to-seed spread is usually the largest noise in a test error; an interval
that resamples only test images (the trained models held fixed) is too narrow for any claim about
a *method*. Everything here therefore carries two terms.

Effect of variant A against variant B on one test set (`effect`), seeds A_1..A_m and B_1..B_n:

    d   = mean_s err(A_s) − mean_s err(B_s)
    SE² = s_A²/m + s_B²/n        between-seed variance of each variant's error (Welch's two terms)
        + V_test                 test-set sampling variance of the seed-averaged per-image difference,
                                 paired by image, clustered by source digit where given
    CI  = d ± t(ν) · SE          Student's t, ν by Welch–Satterthwaite over the three terms

This is what a two-level bootstrap (seeds, then test images) estimates, in closed form: with three
seeds a percentile bootstrap draws from ten distinct seed multisets and its interval is too narrow
(its variance is (n−1)/n of the sample's, and it uses normal rather than t quantiles). The seed
terms are measured on one fixed test set, so they already hold each model's own image-level noise;
adding V_test counts part of that twice, which errs on the wide side.

Our mean against the paper's value (`against_paper`) has no test term: both are measured on the same
MNIST test set. Its SE² = s²/n + σ_p²/k_p (the paper's σ is a sample std over k_p = 3 trials).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
PAPER_TRIALS = 3  # Table 1: "mean and standard deviation of 3 trials"


@dataclass(frozen=True)
class Interval:
    """A difference (percentage points) with its two-sided LEVEL interval; lo/hi NaN without one."""

    estimate: float
    lo: float
    hi: float
    se: float
    df: float

    @property
    def known(self) -> bool:
        return not math.isnan(self.lo)


def satterthwaite(terms: list[tuple[float, float]]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of variance terms [(variance, its df)]."""
    total = sum(v for v, _ in terms)
    denominator = sum(v * v / df for v, df in terms if v > 0 and df > 0)
    return math.inf if denominator == 0 else total * total / denominator


def t_interval(estimate: float, terms: list[tuple[float, float]], level: float = LEVEL) -> Interval:
    """estimate ± t(ν)·sqrt(Σ variances), ν from `satterthwaite`."""
    se = math.sqrt(sum(v for v, _ in terms))
    df = satterthwaite(terms)
    if se == 0:
        return Interval(estimate, estimate, estimate, se, df)
    from scipy import stats  # here, not above: the train and evaluate stages import this module, not scipy (1.3 s)

    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return Interval(estimate, estimate - half, estimate + half, se, df)


def test_variance(diff: np.ndarray, groups: np.ndarray | None = None) -> tuple[float, int]:
    """(variance of diff's mean under resampling of images or of whole groups, number of units).

    diff (N,) per-image values; groups (N,) integer cluster ids (the source digit of each
    affNIST-style image), whose images are resampled together. The ratio estimator's
    linearisation: G/(G−1) · Σ_g (D_g − d̄·n_g)² / N², which is var(diff, ddof=1)/N for singletons.
    """
    n = diff.shape[0]
    groups = np.arange(n) if groups is None else np.asarray(groups)
    sums, counts = np.bincount(groups, weights=diff), np.bincount(groups)  # (G,)
    keep = counts > 0
    sums, counts = sums[keep], counts[keep]
    g = sums.shape[0]
    if g < 2:
        return 0.0, g
    resid = sums - diff.mean() * counts  # (G,)
    return float(g / (g - 1) * (resid ** 2).sum() / n ** 2), g


@dataclass(frozen=True)
class EffectParts:
    """The pieces of an effect's seed-aware interval (`effect`): each arm's seed variance (pp²) and
    seed count, the test-set sampling variance with its number of resampled units, and how much of
    that test-set variance is seed noise that more seeds would average away (`terms`)."""

    estimate: float
    var_a: float
    n_a: int
    var_b: float
    n_b: int
    v_test: float
    units: int
    systematic: float = 0.0  # per-image variance of the seeds' mean difference that no seed count removes (pp²)
    within_a: float = 0.0  # mean over images of the per-image variance across A's seeds (pp²)
    within_b: float = 0.0

    def terms(self, n_a: int | None = None, n_b: int | None = None) -> list[tuple[float, float]]:
        """The interval's variance terms with ``n_a``/``n_b`` seeds per arm (default: those that ran).

        The test-set term is the variance of the mean of the per-image difference of the seed
        averages, whose per-image variance is systematic + within_a/n_a + within_b/n_b: averaging
        more seeds shrinks its seed-noise part, never the systematic one. At the seeds that ran it
        is the measured term itself."""
        n_a, n_b = n_a or self.n_a, n_b or self.n_b
        ran = self.systematic + self.within_a / self.n_a + self.within_b / self.n_b
        v_test = self.v_test * ((self.systematic + self.within_a / n_a + self.within_b / n_b) / ran if ran else 1.0)
        return [(self.var_a / n_a, n_a - 1), (self.var_b / n_b, n_b - 1), (v_test, self.units - 1)]

    def floor(self) -> list[tuple[float, float]]:
        """The terms with unlimited seeds: the systematic part of the test-set term, all that is left."""
        ran = self.systematic + self.within_a / self.n_a + self.within_b / self.n_b
        return [(self.v_test * (self.systematic / ran if ran else 1.0), self.units - 1)]


def effect_parts(errors_a: np.ndarray, errors_b: np.ndarray, groups: np.ndarray | None = None) -> EffectParts:
    """error(A) − error(B) in percentage points and the pieces of its interval (module docstring).

    errors_a (m, N), errors_b (n, N): 0/1 per seed and test image, the same N images in the same
    order. With one seed on an arm its seed variance is unknown (NaN).
    """
    if errors_a.shape[1:] != errors_b.shape[1:]:
        raise ValueError(f"effect needs the same test images, got {errors_a.shape} and {errors_b.shape}")
    a, b = 100 * errors_a.astype(float), 100 * errors_b.astype(float)  # (m, N), (n, N) in pp
    rate_a, rate_b = a.mean(axis=1), b.mean(axis=1)  # (m,), (n,) per-seed error %
    m, n = len(rate_a), len(rate_b)
    per_image = a.mean(axis=0) - b.mean(axis=0)  # (N,) seed-averaged paired difference
    v_test, units = test_variance(per_image, groups)
    within_a = float(a.var(axis=0, ddof=1).mean()) if m > 1 else 0.0
    within_b = float(b.var(axis=0, ddof=1).mean()) if n > 1 else 0.0
    systematic = max(float(per_image.var(ddof=1)) - within_a / m - within_b / n, 0.0) if len(per_image) > 1 else 0.0
    return EffectParts(float(rate_a.mean() - rate_b.mean()), float(rate_a.var(ddof=1)) if m > 1 else math.nan, m,
                       float(rate_b.var(ddof=1)) if n > 1 else math.nan, n, v_test, units, systematic, within_a,
                       within_b)


def effect(errors_a: np.ndarray, errors_b: np.ndarray, groups: np.ndarray | None = None,
           level: float = LEVEL) -> Interval:
    """error(A) − error(B) in percentage points with a seed-aware interval (module docstring).

    errors_a (m, N), errors_b (n, N): 0/1 per seed and test image, the same N images in the same
    order. With one seed on either side the seed spread is unknown: the estimate comes without
    an interval (lo, hi NaN), never with a test-only one.
    """
    return interval_of(effect_parts(errors_a, errors_b, groups), level)


def interval_of(parts: EffectParts, level: float = LEVEL) -> Interval:
    """The seed-aware interval of an effect already split into its parts (`effect_parts`)."""
    if parts.n_a < 2 or parts.n_b < 2:
        return Interval(parts.estimate, math.nan, math.nan, math.nan, math.nan)
    return t_interval(parts.estimate, parts.terms(), level)


def against_paper(ours: list[float], paper: float, paper_std: float | None,
                  paper_trials: int = PAPER_TRIALS, level: float = LEVEL) -> Interval:
    """Our mean − the paper's value (pp), interval from our seed spread and the paper's σ."""
    n = len(ours)
    delta = float(np.mean(ours)) - paper
    if n < 2:
        return Interval(delta, math.nan, math.nan, math.nan, math.nan)
    terms = [(float(np.var(ours, ddof=1)) / n, n - 1)]
    if paper_std:
        terms.append((paper_std ** 2 / paper_trials, paper_trials - 1))
    return t_interval(delta, terms, level)


VERDICT_RULE = (f"Verdict from the {LEVEL:.0%} interval of ours − paper, SE² = s²/n + σ_p²/{PAPER_TRIALS} (our seed "
                f"std s over n seeds, the paper's σ_p over its {PAPER_TRIALS} trials; both on the same MNIST test set), "
                "Student's t with Welch–Satterthwaite degrees of freedom: `not reproduced` when the interval lies "
                "wholly above 0 (our error is higher beyond the noise), `better` when wholly below 0, `consistent` "
                "when it covers 0 — the paper's value is within our noise, which with few seeds is a wide statement, "
                "not proof of equality (the interval says how wide). One seed: no interval, no verdict.")


def verdict(interval: Interval) -> str:
    """`not reproduced` | `better` | `consistent` | `one seed: no verdict` (VERDICT_RULE)."""
    if not interval.known:
        return "one seed: no verdict"
    if interval.lo > 0:
        return "not reproduced"
    return "better" if interval.hi < 0 else "consistent"


def effect_words(interval: Interval) -> str:
    """What an effect's interval supports, for tables and the README."""
    if not interval.known:
        return "no interval (one seed)"
    if interval.hi < 0:
        return "A lower, beyond seed and test noise"
    if interval.lo > 0:
        return "A higher, beyond seed and test noise"
    return "not distinguishable from noise"
