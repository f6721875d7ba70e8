"""Medians and ratios with distribution-free intervals: the confidence their repeats give."""
from __future__ import annotations

import math

import pytest

from dpbench.analysis.intervals import (
    CONFIDENCE,
    NO_INTERVAL,
    interval_text,
    level_text,
    median_ci,
    range_coverage,
    ratio_ci,
    repeats_for,
)


def test_intervals_contain_the_estimate_and_state_the_confidence_their_repeats_give():
    # the range of n values holds the median with 1 - 2^(1-n): 50% for 2, 75% for 3, 94% for 5
    for values, level in (([990.0, 1000.0, 1010.0], 0.75), ([1.0, 2.0], 0.5), ([5.0, 1.0, 9.0, 3.0, 4.0], 0.9375)):
        est = median_ci(values)
        assert (est.low, est.high) == (min(values), max(values)) and est.low <= est.value <= est.high
        assert est.level == pytest.approx(level)
    # with enough repeats the interval narrows to inner order statistics and still reaches 95%
    est = median_ci(list(range(1, 21)))
    assert 1 < est.low < est.value < est.high < 20 and est.level >= CONFIDENCE
    assert (est.low, est.high) == (6, 15)   # k = 6: 1 - 2 P(Bin(20, 1/2) <= 5) = 0.959; k = 7 gives 0.885
    assert range_coverage(20, 6) == pytest.approx(0.9586, abs=1e-4)
    assert repeats_for(CONFIDENCE) == 6
    # a ratio spans low/high and high/low of the two ranges, at the product of their confidences
    ratio = ratio_ci([1700.0, 1800.0], [990.0, 1000.0, 1010.0], 2)
    assert ratio.value == pytest.approx(0.875)
    assert (ratio.low, ratio.high) == pytest.approx((1700 / 2020, 1800 / 1980))
    assert ratio.level == pytest.approx(0.5 * 0.75)
    assert ratio.at_least and level_text(ratio.level, ratio.at_least) == "≥37%"   # a bound; 37.5% never rounds up


def test_one_repeat_has_no_interval():
    assert math.isnan(median_ci([3000.0]).low)
    assert math.isnan(ratio_ci([5000.0, 5200.0], [3000.0], 2).low)   # the baseline ran once
    assert interval_text(median_ci([3000.0]), "{:.0%}", 1) == NO_INTERVAL
