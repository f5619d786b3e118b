"""What it would take to settle a claim: power, the minimum detectable effect and the seeds needed
for the report's seed-aware intervals (pipeline.report.stats), at 80 % power and the report's level.

Every interval of the report is d ± t(ν)·SE with SE² a sum of variance terms and ν their
Welch–Satterthwaite degrees of freedom (`stats.t_interval`). A claim is settled when that
interval excludes 0. If the true difference is δ, the statistic d/SE follows a noncentral t with
ν degrees of freedom and noncentrality δ/SE, so the probability of settling it is

    power(δ) = P(T_ν,δ/SE > t_crit) + P(T_ν,δ/SE < −t_crit),   t_crit = t_ν(1 − α/2)   (two-sided)

With more seeds the seed terms shrink (s²/n) and ν grows, so `seeds_needed` steps n up, recomputing
SE and ν at each n (not a normal shortcut, which overstates the power of a few seeds), until the
power reaches 80 %. What more seeds do not shrink stays: the systematic part of an effect's
test-set term (the 10,000 test images are all there are; its per-image seed noise does average
away, stats.EffectParts.terms) and the paper's σ over its 3 trials. Past `MAX_SEEDS` a claim is
called unresolvable by seeds alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pipeline.report.stats import LEVEL, PAPER_TRIALS, EffectParts, satterthwaite, t_interval

POWER = 0.80  # the conventional target: a real effect of the stated size is seen 4 times in 5
MAX_SEEDS = 100  # per arm; beyond it a claim is "not resolvable by seeds alone"
Terms = list[tuple[float, float]]  # [(variance, its degrees of freedom)], as stats.t_interval takes them


def power(delta: float, terms: Terms, level: float = LEVEL) -> float:
    """The probability that the two-sided ``level`` t-interval over ``terms`` excludes 0 when the
    true difference is ``delta`` (module docstring)."""
    se = math.sqrt(sum(v for v, _ in terms))
    if se == 0:
        return 1.0 if delta else 0.0
    from scipy import stats as sps  # here, not above: a cold train or evaluate stage imports no scipy

    df = min(satterthwaite(terms), 1e7)  # ν = ∞ (no finite term): the noncentral t is the normal
    critical = float(sps.t.ppf(0.5 + level / 2, df))
    shift = abs(delta) / se
    value = float(sps.nct.sf(critical, df, shift) + sps.nct.cdf(-critical, df, shift))
    if math.isnan(value):  # scipy's noncentral t fails far out in its tails: there the answer is 0 or 1
        return 1.0 if shift > critical else 0.0
    return value


def detectable(terms: Terms, level: float = LEVEL, target: float = POWER) -> float:
    """The minimum detectable effect: the |δ| the interval over ``terms`` excludes 0 for with
    probability ``target``."""
    se = math.sqrt(sum(v for v, _ in terms))
    if se == 0:
        return 0.0
    from scipy import optimize

    high = se
    while power(high, terms, level) < target:
        high *= 2
    return float(optimize.brentq(lambda d: power(d, terms, level) - target, 0.0, high, xtol=se * 1e-6))


def seeds_needed(delta: float, terms_at: Callable[[int], Terms], level: float = LEVEL, target: float = POWER,
                 max_seeds: int = MAX_SEEDS) -> int | None:
    """The fewest seeds n (2 ≤ n ≤ max_seeds) whose interval, ``terms_at(n)``, excludes 0 with
    probability ``target`` when the true difference is ``delta``; None when even max_seeds do not."""
    if delta == 0 or math.isnan(delta):
        return None
    for n in range(2, max_seeds + 1):
        if power(delta, terms_at(n), level) >= target:
            return n
    return None


def effect_seeds_needed(parts: EffectParts, delta: float, level: float = LEVEL) -> int | None:
    """Seeds per arm (both arms alike) for an effect's interval (stats.effect_parts) to detect ``delta``
    at POWER; the test-set term stays as measured."""
    return seeds_needed(delta, lambda n: parts.terms(n, n), level)


def paper_terms(var: float, n: int, paper_std: float | None, paper_trials: int = PAPER_TRIALS) -> Terms:
    """The terms of ours − the paper's value (stats.against_paper) with ``n`` seeds of ours."""
    terms = [(var / n, n - 1)]
    if paper_std:
        terms.append((paper_std ** 2 / paper_trials, paper_trials - 1))
    return terms


def equivalence_margin(estimate: float, terms: Terms, level: float = LEVEL) -> float:
    """The margin x of "within ±x" the data support: two one-sided tests at α = 1 − level, i.e. the
    (2·level − 1) interval (90 % for the report's 95 %) lies within [−x, x]."""
    interval = t_interval(estimate, terms, 2 * level - 1)
    return max(abs(interval.lo), abs(interval.hi))


def seeds_phrase(n: int | None, delta: float) -> str:
    """A seeds-needed figure in words, for tables: '7', 'more than 100', '–' (nothing to detect)."""
    if delta == 0 or math.isnan(delta):
        return "–"
    return f"more than {MAX_SEEDS}" if n is None else str(n)
