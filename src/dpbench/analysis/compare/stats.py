"""The statistics compare decides with: Welch's test, Holm's correction, the repeats' pooled
spread, and the two pictures of loss curves (bit for bit, and the baseline's per-step band)."""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import scipy.stats

from dpbench.analysis.compare.thresholds import Thresholds


# The baseline's variance per step is averaged over a window of neighbouring steps (a tenth of
# the curve, at least 9) to steady the picture. It adds few degrees of freedom: the differences
# between GPU repeats are mostly a level a run keeps (uncentred lag-20 correlation 0.69-0.75 in
# the 2x H200 reference; ~0 only once each difference's mean is removed), so the band is a
# picture of where curves part, and the verdict is the curve test's (compare.curves).
ENVELOPE_WINDOW = (9, 0.1)


def welch_p(x: np.ndarray, y: np.ndarray) -> float | None:
    """Two-sided p of Welch's t-test on the means (None with fewer than 2 values a side)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if min(len(x), len(y)) < 2:
        return None
    if x.var(ddof=1) == 0.0 and y.var(ddof=1) == 0.0:  # identical repeats resolve any difference
        return 0.0 if x.mean() != y.mean() else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-identical samples: precision note
        return float(scipy.stats.ttest_ind(x, y, equal_var=False).pvalue)


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
