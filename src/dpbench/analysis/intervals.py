"""Medians and ratios of medians with distribution-free intervals and the confidence each carries.

Intervals come from the order of the repeats alone (no assumption about their distribution),
and each carries the confidence it has: a handful of repeats cannot give 95%, and a bootstrap
of three values would call their range 95% when it holds the median three times in four.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple

import numpy as np
from scipy import stats

# The confidence an interval aims at. Intervals are distribution-free (order statistics of the
# repeats), so their confidence follows from the number of repeats alone; with too few repeats
# for this level an interval is the full range, at the lower confidence it has, and says so.
CONFIDENCE = 0.95
NO_INTERVAL = "n=1, no interval"


def present(value: Any) -> bool:
    """A value that is there: neither None nor NaN."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


class Estimate(NamedTuple):
    """A median or a ratio of medians, with its interval and that interval's confidence (the
    probability that it holds the true value; NaN bounds and level when there is none). For a
    ratio the level is a lower bound (at_least): the interval can hold the ratio when a side's
    interval misses its median."""
    value: float
    low: float
    high: float
    level: float
    at_least: bool = False


NONE = Estimate(math.nan, math.nan, math.nan, math.nan)


def range_coverage(n: int, k: int = 1) -> float:
    """Confidence that the k-th smallest and k-th largest of n values hold their population's
    median: each value falls below it with probability 1/2, so the count below is binomial."""
    return float(1 - 2 * stats.binom.cdf(k - 1, n, 0.5))


def repeats_for(level: float) -> int:
    """The fewest values whose full range holds the median with at least `level` confidence."""
    n = 2
    while range_coverage(n) < level:
        n += 1
    return n


def ratio_repeats_for(level: float) -> tuple[int, int]:
    """The fewest repeats in all, (a, b) with a <= b, whose two ranges bound a ratio's confidence
    at `level` or more."""
    total = 4
    while True:
        for a in range(2, total // 2 + 1):
            if range_coverage(a) * range_coverage(total - a) >= level:
                return a, total - a
        total += 1


def _order_interval(x: np.ndarray, level: float) -> tuple[float, float, float]:
    """(low, high, confidence): the narrowest order-statistic interval of at least `level`
    confidence, or the full range (and its own confidence) when n is too small for it."""
    s, n, k = np.sort(x), len(x), 1
    while k + 1 <= n // 2 and range_coverage(n, k + 1) >= level:
        k += 1
    return float(s[k - 1]), float(s[n - k]), range_coverage(n, k)


def median_ci(values: Iterable[float]) -> Estimate:
    """The median with its distribution-free interval; no interval with fewer than 2 values."""
    x = np.asarray([v for v in values if present(v)], dtype=float)
    if len(x) == 0:
        return NONE
    if len(x) < 2:
        return Estimate(float(np.median(x)), math.nan, math.nan, math.nan)
    return Estimate(float(np.median(x)), *_order_interval(x, CONFIDENCE))


def ratio_ci(num: Iterable[float], den: Iterable[float], scale: float = 1.0) -> Estimate:
    """median(num) / (scale × median(den)), with the interval that spans the two medians'
    intervals (low over high, high over low): when both hold their medians it holds the ratio,
    so for independent groups its confidence is at least the product of theirs (each aims at
    the square root of CONFIDENCE; simulated, 3 and 3 normal repeats are covered about 90% of
    the time, against the 56% bound). No interval unless each group has 2 positive values."""
    a = np.asarray([v for v in num if present(v)], dtype=float)
    b = np.asarray([v for v in den if present(v)], dtype=float)
    if len(a) == 0 or len(b) == 0 or np.median(b) == 0:
        return NONE
    value = float(np.median(a) / (scale * np.median(b)))
    if len(a) < 2 or len(b) < 2 or min(a.min(), b.min()) <= 0:
        return Estimate(value, math.nan, math.nan, math.nan)
    lo_a, hi_a, conf_a = _order_interval(a, math.sqrt(CONFIDENCE))
    lo_b, hi_b, conf_b = _order_interval(b, math.sqrt(CONFIDENCE))
    return Estimate(value, lo_a / (scale * hi_b), hi_a / (scale * lo_b), conf_a * conf_b, at_least=True)


# Still said here, not in report/: analysis.perf_targets's rows carry an interval in words.
def interval_text(est: Estimate, spec: str, n: int | None = None) -> str:
    """'95% CI 1.62–1.71', '75% CI 1.62–1.71' (the confidence three repeats give), or
    'n=1, no interval'."""
    if not (present(est.low) and present(est.high)):
        return NO_INTERVAL if n is None or n < 2 else "no interval"
    return f"{level_text(est.level, est.at_least)} CI {spec.format(est.low)}–{spec.format(est.high)}"


def level_text(level: float, at_least: bool = False) -> str:
    """A confidence as a whole percent, never rounded up to a level it does not reach; '≥56%'
    where it is a lower bound (a ratio's)."""
    return f"{'≥' if at_least else ''}{math.floor(level * 100 + 1e-9)}%"
