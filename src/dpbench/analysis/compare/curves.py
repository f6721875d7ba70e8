"""The loss-curve test for curves that are not bit-reproducible: each run's curve becomes one
number, its mean loss after the chaotic first tenth, and the two sides' numbers are compared by a
two-sample t-test with the variance pooled from both sides (and from A/A curves where given).

Why one number per run: the difference between two GPU runs' curves is mostly a level the run
keeps throughout (in the 2x H200 references the uncentred correlation of a difference at lag 20
is about 0.7), so the steps of one run are not independent draws and a
per-step band built from 2-3 repeats has about 2 degrees of freedom, not one per step. A run is
the unit of replication; its mean over the curve averages away the per-step noise.

Seed-paired (report format 3): where both sides' runs carry seeds and two or more seeds are on
both sides, the runs are matched by seed and the test is on d_i = candidate(seed_i) -
baseline(seed_i). The seed (initial weights, batch order) sets most of a run's level (same-seed
summaries of two one-H200 launches correlate at 0.9996), which the unpaired test counts as noise.
Under "no change" the d_i are distributed like the seed-matched differences between A/A launches:
with A/A launches the null sd of a difference comes from those alone (the candidate left out),
t = mean(d) / se. A launch's offset (the machine's level that day, common to all its runs) is
one unit, not averaged over seeds: the A/A summaries (launch x seed) split into a launch offset
and each run's own residual (two-way, no interaction), and se^2 = 2 var(offset) + 2 var(residual)
/ n (df by Welch-Satterthwaite); dividing the whole s_AA by sqrt(n), as before, counted the offset
n times over. Without two A/A launches the test stays unpaired: where the seed carries less of the level (12-54% in the committed one-H200
curves), a one-sample t on the d_i (n - 1 df) finds less than the unpaired test.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import scipy.stats

from dpbench.analysis.compare.stats import detectable_se, holm

# The first tenth of training is chaotic (large, run-specific swings from the warm-up) and would
# dominate the summary's variance while saying little about where the run settles.
BURN_IN = 0.1
# The power the smallest detectable change is quoted at.
POWER = 0.8


def curve_summary(curves: np.ndarray) -> np.ndarray:
    """Each run's mean loss from step ceil(BURN_IN * T) on (curves: runs x T common steps); a run
    with a non-finite loss there summarises to inf, which no noise explains."""
    curves = np.atleast_2d(np.asarray(curves, float))
    tail = curves[:, int(math.ceil(BURN_IN * curves.shape[1])):]
    if tail.shape[1] == 0:
        tail = curves
    with np.errstate(invalid="ignore"):
        out = tail.mean(1)
    return np.where(np.isfinite(out), out, math.inf)


@dataclass
class CurveTest:
    """One cell's curve test: the change of the mean summary (candidate - baseline), its p (raw;
    p_holm filled in by curve_summary_tests), the pooled sd of a run's summary with its df, and
    the smallest change a test at this n and sd finds with 80% power."""
    n_baseline: int
    n_candidate: int
    summary_baseline: float | None
    summary_candidate: float | None
    change: float | None
    sd: float | None
    df: int
    p_value: float | None
    smallest_detectable: float | None
    p_holm: float | None = None
    verdict: str = "noise unknown"
    note: str = ""
    design: str = "unpaired"
    # Seed-matched pairs (the seed-paired designs): n_baseline = n_candidate = pairs there.
    pairs: int = 0
    # The standard error of the change (seed-paired: a launch offset as one unit, not over sqrt(n)).
    se: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _pooled(groups: list[np.ndarray]) -> tuple[float, int]:
    """Pooled variance and its degrees of freedom over groups of two or more values."""
    groups = [g for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in groups)
    if df == 0:
        return 0.0, 0
    return float(sum(((g - g.mean()) ** 2).sum() for g in groups) / df), df


def detectable(sd: float, df: int, n_b: int, n_c: int, alpha: float) -> float:
    """The change a two-sided t-test at level alpha finds with POWER, given the sd of one run
    (exact: the noncentral t at df)."""
    return detectable_se(df, alpha, POWER) * sd * math.sqrt(1 / n_b + 1 / n_c)


UNPAIRED, PAIRED, PAIRED_AA = "unpaired", "seed-paired", "seed-paired, noise from A/A launches"


def _by_seed(values: np.ndarray, seeds) -> dict:
    """seed -> value, for the seeds that name exactly one run (a seed run twice matches nothing)."""
    if seeds is None or len(seeds) != len(values):
        return {}
    known = [s for s in seeds if s is not None]
    return {s: float(v) for s, v in zip(seeds, values) if s is not None and known.count(s) == 1}


def aa_difference_variance(launches: list[dict]) -> tuple[float, int]:
    """The variance of a seed-matched difference between two launches of the same code, and its
    df, from A/A launches (each seed -> summary): per seed, the spread of its summaries across the
    launches that ran it (every pair of launches, m - 1 df for m of them), pooled over seeds;
    a difference holds two runs, so twice that. Launch offsets are not removed: a launch that moved
    all its runs alike counts as noise, as it would between baseline and candidate."""
    ss, df = 0.0, 0
    for seed in sorted({s for launch in launches for s in launch}, key=str):
        v = np.array([launch[seed] for launch in launches if seed in launch and math.isfinite(launch[seed])])
        if len(v) >= 2:
            ss, df = ss + float(((v - v.mean()) ** 2).sum()), df + len(v) - 1
    return (2 * ss / df, df) if df else (0.0, 0)


def aa_launch_se(launches: list[dict], n: int) -> tuple[float, float] | None:
    """(se, df) of the mean of n seed-matched differences between two launches, from A/A launches
    (each seed -> summary) over the seeds every one of them ran: summary = seed + launch offset +
    residual. A difference of two launches carries two offsets whatever n is, and 2n residuals
    averaged: se^2 = 2 var(offset) + 2 var(residual) / n, df by Welch-Satterthwaite. None with
    fewer than two launches or two shared seeds."""
    seeds = sorted(set.intersection(*[{s for s, v in launch.items() if math.isfinite(v)} for launch in launches]),
                   key=str) if len(launches) >= 2 else []
    if len(seeds) < 2:
        return None
    y = np.array([[launch[s] for s in seeds] for launch in launches])
    m, k = y.shape
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    df_e = (m - 1) * (k - 1)
    var_e = float((resid ** 2).sum() / df_e)
    ms_launch = float(k * y.mean(1).var(ddof=1))
    if ms_launch <= var_e:   # no offset beyond the residuals: the residuals alone, averaged over n
        return math.sqrt(2 * var_e / n), float(df_e)
    a, b = 2.0 / k, 2.0 / n - 2.0 / k   # se^2 = a ms_launch + b var_e
    v = a * ms_launch + b * var_e
    df = v ** 2 / ((a * ms_launch) ** 2 / (m - 1) + (b * var_e) ** 2 / df_e)
    return math.sqrt(v), float(df)


def paired_detectable(sd: float, df: int, n: int, alpha: float) -> float:
    """The change a two-sided t-test of a mean of n differences finds with POWER (noncentral t)."""
    return detectable_se(df, alpha, POWER) * sd / math.sqrt(n)


def _paired(res: CurveTest, b: dict, c: dict, aa_launches: list[dict] | None, alpha: float,
            offset_once: bool = True) -> CurveTest:
    seeds = sorted(b.keys() & c.keys(), key=str)
    d = np.array([c[s] - b[s] for s in seeds])
    res.design, res.pairs, res.n_baseline, res.n_candidate = PAIRED, len(d), len(d), len(d)
    res.summary_baseline = float(np.mean([b[s] for s in seeds]))
    res.summary_candidate = float(np.mean([c[s] for s in seeds]))
    res.change = float(d.mean())
    var, df = aa_difference_variance(aa_launches) if aa_launches else (0.0, 0)
    if df:
        res.design = PAIRED_AA
    else:
        var, df = float(d.var(ddof=1)), len(d) - 1
    if var == 0.0:
        res.note = "the seed-matched runs differ by the same amount: the noise is unknown"
        return res
    res.sd, res.df = math.sqrt(var), df
    res.se = res.sd / math.sqrt(len(d))
    if res.design == PAIRED_AA and offset_once:   # report format 4 on; before, s_AA / sqrt(n)
        split = aa_launch_se(aa_launches, len(d))
        # Without two seeds shared by the A/A launches the offset cannot be told from the
        # residuals: one difference's sd, the mean of n no better than one (conservative).
        res.se, res.df = split if split else (res.sd, df)
    t = res.change / res.se
    res.p_value = float(2 * scipy.stats.t.sf(abs(t), res.df))
    res.smallest_detectable = detectable_se(res.df, alpha, POWER) * res.se
    return res


def curve_summary_test(base: np.ndarray, cand: np.ndarray, alpha: float = 0.05,
                       aa: list[np.ndarray] | None = None, seeds: tuple | None = None,
                       aa_seeded: list[tuple] | None = None, offset_once: bool = True) -> CurveTest:
    """The test of one cell (base, cand: runs x steps over the steps all runs reached).

    aa: A/A curves of this cell (each a runs x steps array of one launch of the same code): their
    within-launch spread joins the pool, with its degrees of freedom. Without them a side needs two
    runs, or the noise is unknown.

    seeds: (the baseline rows' seeds, the candidate rows' seeds), None where unknown: two or more
    seeds on both sides make the test seed-paired. aa_seeded: the A/A launches the paired test
    learns its noise from, (runs x steps, seeds) each; never the candidate (the baseline may be
    one of them)."""
    b, c = curve_summary(base), curve_summary(cand)
    aa_summaries = [curve_summary(a) for a in (aa or []) if np.size(a)]
    res = CurveTest(len(b), len(c), None, None, None, None, 0, None, None)
    if not (len(b) and len(c)):
        res.note = "no runs on one side"
        return res
    res.summary_baseline, res.summary_candidate = float(b.mean()), float(c.mean())
    if not (np.isfinite(b).all() and np.isfinite(c).all()):
        if np.isfinite(b).all() != np.isfinite(c).all():
            res.change, res.p_value, res.verdict = math.inf, 0.0, "diverged"
            res.note = "loss not finite on one side"
        else:
            res.note = "loss not finite on either side"
        return res
    bs, cs = (_by_seed(b, seeds[0]), _by_seed(c, seeds[1])) if seeds else ({}, {})
    if len(bs.keys() & cs.keys()) >= 2:
        launches = [x for x in (_by_seed(curve_summary(m), s) for m, s in aa_seeded or [] if np.size(m)) if x]
        # Pairing pays only with the A/A launches' noise: on the committed one-H200 curves the seed
        # carries 12-54% of a run's level, so the d_i's own variance (n - 1 df) is a weaker test
        # than the unpaired one (docs/compare.md's calibration).
        if len(launches) >= 2:
            return _paired(res, bs, cs, launches, alpha, offset_once)
    res.change = float(c.mean() - b.mean())
    var, df = _pooled([b, c, *[a[np.isfinite(a)] for a in aa_summaries]])
    if min(len(b), len(c)) < 2 and not aa_summaries:
        res.note = "fewer than two runs a side: the noise is unknown"
        return res
    if df == 0 or var == 0.0:
        res.note = "the runs' curves agree exactly: the noise is unknown"
        return res
    res.sd, res.df = math.sqrt(var), df
    t = res.change / (res.sd * math.sqrt(1 / len(b) + 1 / len(c)))
    res.p_value = float(2 * scipy.stats.t.sf(abs(t), df))
    res.smallest_detectable = detectable(res.sd, df, len(b), len(c), alpha)
    return res


def curve_summary_tests(cells: dict, alpha: float = 0.05, tolerance: float = 0.0,
                        aa: dict | None = None, seeds: dict | None = None, aa_seeded: dict | None = None,
                        offset_once: bool = True) -> dict:
    """curve_summary_test per cell (key -> (base, cand) arrays), Holm over the tested cells; a
    cell diverges when its Holm p < alpha and its change exceeds tolerance. The smallest
    detectable change is quoted at alpha / (tested cells), the level Holm holds the first cell to.
    seeds, aa_seeded: per cell, curve_summary_test's (absent: the unpaired test)."""
    out = {k: curve_summary_test(b, c, alpha, (aa or {}).get(k), (seeds or {}).get(k), (aa_seeded or {}).get(k),
                                 offset_once)
           for k, (b, c) in cells.items()}
    keys = list(out)
    adjusted = holm([out[k].p_value for k in keys])
    m = max(1, sum(p is not None for p in adjusted))
    for k, q in zip(keys, adjusted):
        r = out[k]
        r.p_holm = q
        if r.verdict == "diverged" or q is None:
            continue
        if r.se is not None and r.pairs:
            r.smallest_detectable = detectable_se(r.df, alpha / m, POWER) * r.se
        elif r.sd is not None:
            r.smallest_detectable = detectable(r.sd, r.df, r.n_baseline, r.n_candidate, alpha / m)
        r.verdict = "diverged" if q < alpha and abs(r.change) > tolerance else "within noise"
    return out
