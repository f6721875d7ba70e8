"""The within-launch throughput test of a paired upgrade check: two environments' runs of the same
cells interleaved in one launch, so the noise is the spread of runs within the launch and no
shift between machine leases enters.

Per cell, log samples/s is compared by a two-sample t-test with the variance pooled from both
sides (throughput is multiplicative: a change is a ratio, and its log is what the t-test's normal
errors fit). The whole launch's common change is the mean of the cells' log changes, its
standard error from the cells' within-cell variances (degrees of freedom by Welch-Satterthwaite).
Holm's correction runs over the cells' tests and the launch's together. Every test quotes the
smallest change it finds at 80% power, at Holm's first level (alpha / tests), solved on the
noncentral t at the df it has (the textbook (t + t) * se gives 68-79% power at 4 df).

A run's samples/s is known to float32 precision (its step times are recorded so): a cell's sd is
never taken below that resolution's rounding error, and a cell whose runs all agree within it,
on both sides, is "identical" (p = 1), never "faster" at p = 0.

Equivalence: per cell and for the launch, two one-sided tests (TOST, each at alpha) of the
change against +-delta (default 2%, `equivalence`); "within +-delta" says the data exclude a change
that large, which "no change" (nothing detected) does not. Each cell's statement is its own (no
correction: an intersection-union test of all cells needs none).
Numbers only: the report words them.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats

from dpbench.analysis.compare.curves import POWER
from dpbench.analysis.compare.stats import (FLOAT32_RESOLUTION, IDENTICAL, detectable_se, holm, identical,
                                            sd_floor, tost_p)

NOISE_UNKNOWN = "noise unknown"
# The equivalence margin's default (the schema's `compare.equivalence`).
EQUIVALENCE = 0.02
# A log samples/s is known to float32's relative precision, in log units the same number.
LOG_RESOLUTION = FLOAT32_RESOLUTION


@dataclass
class PairedCell:
    cell: Hashable
    n_base: int
    n_cand: int
    change: float
    """Ratio of the candidate's geometric mean samples/s to the baseline's, minus 1."""
    p: float | None
    p_holm: float | None
    verdict: str
    smallest_detectable: float | None
    """The relative change this cell's test finds at 80% power (at Holm's first level)."""
    sd_log: float | None = None
    df: int = 0
    tost_p: float | None = None
    """Two one-sided tests of the change against +-delta (the larger p of the two)."""
    within: bool | None = None
    """The change is shown to lie within +-delta (tost_p < alpha); None: not tested."""


@dataclass
class PairedLaunch:
    """The change common to all tested cells and its test."""
    cells: int
    change: float | None
    se_log: float | None
    df: float | None
    p: float | None
    verdict: str
    smallest_detectable: float | None
    p_holm: float | None = None
    tost_p: float | None = None
    within: bool | None = None


@dataclass
class PairedVerdict:
    cells: list[PairedCell]
    launch: PairedLaunch
    design: str
    alpha: float = 0.05
    delta: float = EQUIVALENCE
    """The equivalence margin (relative) the cells' TOST used."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _t_test(b: np.ndarray, c: np.ndarray) -> tuple[float, float | None, float | None, int]:
    """(mean log change, p, pooled sd, df) of log values; p None below two runs a side. The sd
    is floored at the values' resolution (LOG_RESOLUTION), so no difference gets p = 0, and
    sides that agree within it get p = 1 (`identical`)."""
    d = float(c.mean() - b.mean())
    if min(len(b), len(c)) < 2:
        return d, None, None, 0
    df = len(b) + len(c) - 2
    sd = math.sqrt((((b - b.mean()) ** 2).sum() + ((c - c.mean()) ** 2).sum()) / df)
    sd = max(sd, sd_floor(LOG_RESOLUTION))
    if identical(b, c, LOG_RESOLUTION):
        return d, 1.0, sd, df
    t = d / (sd * math.sqrt(1 / len(b) + 1 / len(c)))
    return d, float(2 * scipy.stats.t.sf(abs(t), df)), sd, df


def detectable_log(se: float, df: float, alpha: float) -> float:
    """The log change a two-sided t-test at level alpha finds with POWER, given its standard
    error (exact: the noncentral t at df)."""
    return detectable_se(df, alpha, POWER) * se


def _equivalence(change: float, se: float, df: float, delta: float, alpha: float) -> tuple[float, bool]:
    """TOST of a log change against the relative margin +-delta: (p, within)."""
    p = tost_p(change, se, df, math.log1p(-delta), math.log1p(delta))
    return p, p < alpha


def _direction(d: float) -> str:
    return "faster" if d > 0 else "slower"


def _order(samples: pd.DataFrame, base: str, cand: str) -> str:
    """The environments' order in the launch as letters (A: base, B: cand), e.g. ABBAABBA."""
    first = samples.sort_values("order").drop_duplicates("cell")["cell"].iloc[0]
    runs = samples[samples["cell"] == first].sort_values("order")["environment"]
    return "".join({base: "A", cand: "B"}.get(e, "?") for e in runs)


def paired_throughput(samples: pd.DataFrame, base: str, cand: str, alpha: float = 0.05,
                      delta: float = EQUIVALENCE) -> PairedVerdict:
    """The within-launch test (samples: one row per run with cell, environment, order,
    samples_per_s); runs of other environments are ignored."""
    samples = samples[samples["environment"].isin([base, cand])]
    logs = {cell: (np.log(g.loc[g["environment"] == base, "samples_per_s"].to_numpy(float)),
                   np.log(g.loc[g["environment"] == cand, "samples_per_s"].to_numpy(float)))
            for cell, g in samples.groupby("cell", sort=True)}
    verdict = paired_logs(logs, alpha, delta)
    n_b = sorted({r.n_base for r in verdict.cells})
    n_c = sorted({r.n_cand for r in verdict.cells})
    verdict.design = (f"paired within one launch: {base} (A) vs {cand} (B) interleaved "
                      f"{_order(samples, base, cand) if len(samples) else ''}; {len(verdict.cells)} cells, "
                      f"{'/'.join(map(str, n_b))} vs {'/'.join(map(str, n_c))} runs a side; per cell a pooled "
                      "two-sample t-test on log samples/s; the launch: mean log change over cells; Holm over both; "
                      f"equivalence within +-{100 * delta:g}% by two one-sided tests at {alpha:g}")
    return verdict


def paired_logs(logs: dict[Hashable, tuple[np.ndarray, np.ndarray]], alpha: float = 0.05,
                delta: float = EQUIVALENCE) -> PairedVerdict:
    """The test itself on cell -> (baseline's, candidate's) log samples/s; cells missing a side
    are left out."""
    logs = {k: v for k, v in logs.items() if len(v[0]) and len(v[1])}
    rows = []
    for k, (b, c) in logs.items():
        d, p, sd, df = _t_test(b, c)
        rows.append(PairedCell(k, len(b), len(c), math.expm1(d), p, None, NOISE_UNKNOWN, None, sd, df))
    launch = _launch(rows)
    # One family: the cells' tests and the launch's, so an A/A raises any alarm at most alpha.
    adjusted = holm([r.p for r in rows] + [launch.p])
    m = max(1, sum(q is not None for q in adjusted))
    for r, q in zip(rows, adjusted):
        r.p_holm = q
        if q is not None:
            b, c = logs[r.cell]
            r.verdict = (IDENTICAL if identical(b, c, LOG_RESOLUTION) else
                         _direction(r.change) if q < alpha else "no change")
            se = r.sd_log * math.sqrt(1 / r.n_base + 1 / r.n_cand)
            r.smallest_detectable = math.expm1(detectable_log(se, r.df, alpha / m))
            r.tost_p, r.within = _equivalence(math.log1p(r.change), se, r.df, delta, alpha)
    launch.p_holm = adjusted[-1]
    if launch.p_holm is not None:
        launch.verdict = (IDENTICAL if all(r.verdict == IDENTICAL for r in rows if r.p is not None) else
                          _direction(launch.change) if launch.p_holm < alpha and launch.change else "no change")
        launch.smallest_detectable = math.expm1(detectable_log(launch.se_log, launch.df, alpha / m))
        launch.tost_p, launch.within = _equivalence(math.log1p(launch.change), launch.se_log, launch.df,
                                                    delta, alpha)
    return PairedVerdict(rows, launch, "paired within one launch", alpha, delta)


def _launch(rows: list[PairedCell]) -> PairedLaunch:
    """The common change and its raw p; verdict and detectable change follow Holm."""
    tested = [r for r in rows if r.sd_log is not None]
    if not tested:
        return PairedLaunch(0, None, None, None, None, NOISE_UNKNOWN, None)
    m = len(tested)
    d = float(np.mean([math.log1p(r.change) for r in tested]))
    # Var of each cell's log change, then of their mean; df by Welch-Satterthwaite.
    v = np.array([r.sd_log ** 2 * (1 / r.n_base + 1 / r.n_cand) for r in tested]) / m ** 2
    dfs = np.array([r.df for r in tested], float)
    se = math.sqrt(v.sum())   # never 0: each cell's sd is floored at the resolution (_t_test)
    df = float(v.sum() ** 2 / (v ** 2 / dfs).sum())
    return PairedLaunch(m, math.expm1(d), se, df, float(2 * scipy.stats.t.sf(abs(d) / se, df)),
                        NOISE_UNKNOWN, None)


@dataclass
class DetectableSpread:
    """One cell's smallest detectable change over several launches: the range of the launches'
    own values (each from its 4-odd df) and the value at the sd pooled over them."""
    cell: Hashable
    launches: int
    low: float
    high: float
    pooled: float
    pooled_df: int


def detectable_spread(verdicts: list[PairedVerdict]) -> list[DetectableSpread]:
    """Per cell, the spread of the smallest detectable change across launches of it (A/A
    comparisons of the same cell, say): one launch's value is an estimate from its own few df,
    not a property of the cell. The pooled value takes the cell's sd pooled over the launches
    (df-weighted) at their summed df, for the n a side and Holm level of the first launch."""
    by: dict[Hashable, list[tuple[PairedCell, int]]] = {}
    for v in verdicts:
        m = max(1, sum(r.p is not None for r in v.cells) + (v.launch.p is not None))
        for r in v.cells:
            if r.smallest_detectable is not None and r.sd_log is not None:
                by.setdefault(r.cell, []).append((r, m))
    out = []
    for cell, rows in by.items():
        values = [r.smallest_detectable for r, _ in rows]
        df = sum(r.df for r, _ in rows)
        sd = math.sqrt(sum(r.df * r.sd_log ** 2 for r, _ in rows) / df)
        first, m = rows[0]
        se = sd * math.sqrt(1 / first.n_base + 1 / first.n_cand)
        alpha = verdicts[0].alpha / m
        out.append(DetectableSpread(cell, len(rows), min(values), max(values),
                                    math.expm1(detectable_log(se, df, alpha)), df))
    return out
