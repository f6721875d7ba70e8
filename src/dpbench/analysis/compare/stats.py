"""The statistics compare decides with: Welch's test, Holm's correction, the repeats' pooled
spread, and the two pictures of loss curves (bit for bit, and the baseline's per-step band)."""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import numpy as np
import scipy.optimize
import scipy.stats

from dpbench.analysis.compare.thresholds import Thresholds


# The baseline's variance per step is averaged over a window of neighbouring steps (a tenth of
# the curve, at least 9) to steady the picture. It adds few degrees of freedom: the differences
# between GPU repeats are mostly a level a run keeps (uncentred lag-20 correlation 0.69-0.75 in
# the 2x H200 reference; ~0 only once each difference's mean is removed), so the band is a
# picture of where curves part, and the verdict is the curve test's (compare.curves).
ENVELOPE_WINDOW = (9, 0.1)


# Every value compare tests is measured to a finite precision: step times are recorded as
# float32 milliseconds (steps.csv, metrics.json), and so is every quantity made from them, so a
# value is known to no better than one float32 ulp of itself, 2**-23 relative. A spread below
# that is no measurement: the sd of one value is never taken below a rounding error's,
# resolution / sqrt(12). Without this floor identical repeats (sd 0) turn a difference of a
# hair into p = 0.
FLOAT32_RESOLUTION = 2.0 ** -23
IDENTICAL = "identical"


def resolution(values: np.ndarray, relative: float = FLOAT32_RESOLUTION) -> float:
    """The granularity of values recorded to `relative` precision: that share of the largest."""
    v = np.abs(np.asarray(values, float))
    v = v[np.isfinite(v)]
    return relative * float(v.max()) if len(v) else 0.0


def sd_floor(res: float) -> float:
    """The smallest sd a value rounded to `res` can be said to have (uniform rounding error)."""
    return res / math.sqrt(12.0)


def identical(x: np.ndarray, y: np.ndarray, res: float) -> bool:
    """Both sides' values all agree within the resolution: nothing here can be tested."""
    v = np.concatenate([np.asarray(x, float), np.asarray(y, float)])
    return bool(len(v)) and float(v.max() - v.min()) <= res


def welch_p(x: np.ndarray, y: np.ndarray, res: float | None = None) -> float | None:
    """Two-sided p of Welch's t-test on the means (None with fewer than 2 values a side).

    res: the values' resolution (default: float32 precision of the largest, `resolution`); each
    side's sd is floored at sd_floor(res), so identical repeats never give p = 0, and two sides
    whose every value agrees within res give p = 1 (`identical`)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if min(len(x), len(y)) < 2:
        return None
    res = resolution(np.concatenate([x, y])) if res is None else res
    if identical(x, y, res):
        return 1.0
    floor = sd_floor(res) ** 2
    vx, vy = x.var(ddof=1), y.var(ddof=1)
    if vx >= floor and vy >= floor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # near-identical samples: precision note
            return float(scipy.stats.ttest_ind(x, y, equal_var=False).pvalue)
    ax, ay = max(vx, floor) / len(x), max(vy, floor) / len(y)
    se = math.sqrt(ax + ay)
    df = (ax + ay) ** 2 / (ax ** 2 / (len(x) - 1) + ay ** 2 / (len(y) - 1))
    return float(2 * scipy.stats.t.sf(abs(y.mean() - x.mean()) / se, df))


def power(effect_se: float, df: float, alpha: float) -> float:
    """The power of a two-sided t-test at level alpha for a true change of effect_se standard
    errors (the noncentral t: the exact power at df, not the normal approximation)."""
    crit = scipy.stats.t.ppf(1 - alpha / 2, df)
    nct = scipy.stats.nct
    effect_se = abs(effect_se)
    far = nct.cdf(-crit, df, effect_se)   # the wrong tail; scipy's nct can return nan far out there
    return float(nct.sf(crit, df, effect_se) + (far if math.isfinite(far) else 0.0))


@functools.lru_cache(maxsize=4096)   # a root-finding on the noncentral t; calibrations ask the same df often
def detectable_se(df: float, alpha: float, target: float = 0.8) -> float:
    """The true change, in standard errors, that a two-sided t-test at level alpha on df degrees
    of freedom finds with power `target` (solved on the noncentral t). The textbook
    (t_{1-alpha/2} + t_{power}) * se under-states it at few df: at 4 df it has 68-79% power."""
    hi = 2 * (scipy.stats.t.ppf(1 - alpha / 2, df) + scipy.stats.t.ppf(target, df)) + 10
    while power(hi, df, alpha) < target:
        hi *= 2
    return float(scipy.optimize.brentq(lambda e: power(e, df, alpha) - target, 0.0, hi, xtol=1e-10))


def tost_p(change: float, se: float, df: float, low: float, high: float) -> float:
    """p of two one-sided t-tests that the true change lies inside (low, high): the larger of the
    two one-sided p's (equivalence at level alpha when below alpha)."""
    if se <= 0 or not math.isfinite(se):
        return 0.0 if low < change < high else 1.0
    p_low = scipy.stats.t.sf((change - low) / se, df)
    p_high = scipy.stats.t.cdf((change - high) / se, df)
    return float(max(p_low, p_high))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (family-wise error); None entries are not tests."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    out = list(pvalues)
    if not idx:
        return out
    p = np.array([pvalues[i] for i in idx], float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    for rank, j in enumerate(order):
        out[idx[j]] = float(adjusted[rank])
    return out


def pooled_cv(x: np.ndarray, y: np.ndarray) -> float:
    cvs = [(v.std(ddof=1) / v.mean()) ** 2 * (len(v) - 1) for v in (x, y)]
    return math.sqrt(sum(cvs) / (len(x) + len(y) - 2))


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


def exact_check(pairs: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """Bitwise comparison of paired curves (repeat -> (baseline, candidate) Series)."""
    first, worst, n = None, 0.0, 0
    for repeat, (b, c) in sorted(pairs.items()):
        both = b.index.union(c.index)
        bv, cv = b.reindex(both).to_numpy(float), c.reindex(both).to_numpy(float)
        n += len(both)
        # A step that one side has and the other lacks is a difference too.
        same = _same_bits(bv, cv) & both.isin(b.index) & both.isin(c.index)
        if same.all():
            continue
        i = int(np.flatnonzero(~same)[0])
        with np.errstate(invalid="ignore"):
            d = np.abs(cv - bv)
        d = np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
        worst = max(worst, float(d.max()))
        at = (int(both[i][0]), int(both[i][1]))
        if first is None or at < first["at"]:
            first = {"at": at, "repeat": repeat, "diff": float(d[i])}
    return {"steps_matched": n, "first": first, "max_abs_diff": worst}


def _rolling_mean(v: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(v) < 2:
        return v
    k = np.ones(min(window, len(v)))
    return np.convolve(v, k, "same") / np.convolve(np.ones_like(v), k, "same")


def envelope_check(base: np.ndarray, cand: np.ndarray, th: Thresholds) -> dict[str, Any]:
    """The candidate's mean curve against the baseline's spread (arrays: repeats x steps)."""
    base, cand = np.atleast_2d(np.asarray(base, float)), np.atleast_2d(np.asarray(cand, float))
    fin_b, fin_c = np.isfinite(base).all(0), np.isfinite(cand).all(0)
    out: dict[str, Any] = {"steps_matched": int(base.shape[1]), "outside_fraction": None,
                           "max_abs_diff": None, "at_index": None, "first_outside": None,
                           "distinct_baseline_curves": 0}
    one_sided = fin_b != fin_c
    if one_sided.any():
        i = int(np.flatnonzero(one_sided)[0])
        return {**out, "max_abs_diff": math.inf, "at_index": i, "first_outside": i,
                "verdict": "diverged", "note": "loss not finite on one side"}
    keep = fin_b & fin_c  # steps where both sides blew up alike carry no signal
    base, cand = base[:, keep], cand[:, keep]
    index = np.flatnonzero(keep)
    if base.shape[1] == 0:
        return {**out, "verdict": "noise unknown", "note": "no finite step in common"}
    diff = cand.mean(0) - base.mean(0)
    j = int(np.argmax(np.abs(diff)))
    out.update(max_abs_diff=float(abs(diff[j])), at_index=int(index[j]),
               distinct_baseline_curves=len({row.tobytes() for row in base}))
    if out["distinct_baseline_curves"] < 2:
        note = ("one baseline repeat" if len(base) < 2 else "the baseline repeats are identical")
        return {**out, "verdict": "noise unknown",
                "note": f"{note}: the noise is unknown, no divergence called"}
    n_b, n_c = len(base), len(cand)
    var = _rolling_mean(base.var(0, ddof=1), max(ENVELOPE_WINDOW[0], int(ENVELOPE_WINDOW[1] * base.shape[1])))
    half = np.maximum(th.envelope_k * np.sqrt(var * (1.0 / n_b + 1.0 / n_c)), th.loss_tolerance)
    outside = np.abs(diff) > half
    out["outside_fraction"] = float(outside.mean())
    out["first_outside"] = int(index[np.flatnonzero(outside)[0]]) if outside.any() else None
    diverged = out["outside_fraction"] > th.envelope_fraction
    # Two runs say little about how far a run's whole level can wander (same seed or not).
    note = "two baseline repeats: the spread is poorly known" if n_b == 2 else ""
    return {**out, "verdict": "diverged" if diverged else "within noise", "note": note}
