"""Launch-to-launch noise of throughput, learned from A/A launches.

Repeats within one launch agree far closer than two launches of the same code do: another day,
another machine lease, another neighbour shifts every cell at once (on one H200: the same
experiment launched on two machines moved by -0.9..-1.4% in all ten cells, while its own repeats
spread by 0.1%). A regression check must hold a change against that, and the only way to know it
is to launch the same thing more than once: A/A data.

The model, on the log of each launch's median images/s per cell (variant, GPUs, options):

    y[cell, launch] = cell level + launch shift + residual

- the launch shift is common to every cell of a launch (sd sigma_launch: the machine's speed
  that day); it is only seen with several launches, and each launch adds one degree of freedom;
- the residual is a cell's own wobble (sd sigma_cell, which also holds the median's sampling
  noise); every (cell, launch) beyond the first of each adds one degree of freedom.

Estimated by the two-way analysis of variance without replication. A comparison of two launches
then gets two tests at alpha/2 each, t prediction intervals with the A/A data's degrees of
freedom (few launches give wide floors rather than false alarms):

- the common shift, the median over the K compared cells of their log changes, against
  2 (sigma_launch^2 + sigma_cell^2 v_K): the shift of two launches plus the median's own noise;
- a cell's departure from the median of the other K-1 cells (independent of the cell itself)
  against 2 sigma_cell^2 (1 + v_{K-1}), Bonferroni over the cells.

v_K, the variance of the median of K unit normals, is taken as min(1, pi / 2K): exact for K = 1,
its limit for large K, and above it in between (0.79 against 0.5 at K = 2), so never too narrow.

What the model assumes: every cell wobbles alike (one pooled sigma_cell), and the A/A launches
ran what the comparison runs, with as many repeats. A cell bound by the host (eager bf16 at a
small batch: -17% between two one-H200 machines, where fp32 cells moved 1%) wobbles more than
the pool; learn from launches of the same experiment, which hold such cells and widen the pool.

No I/O here: dpbench.analysis.compare loads the launches and applies the floors.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats


class NotEnoughLaunches(ValueError):
    """The A/A data cannot give the two noise terms (too few launches or cells, or no spread)."""


def median_variance(k: int) -> float:
    """An upper bound of the variance of the median of k unit normals (see the module's text)."""
    return min(1.0, math.pi / (2 * k))


@dataclass(frozen=True)
class LaunchNoise:
    launches: list[str]
    cells: int
    """Cells present (ok) in every launch: the ones the model is fitted on."""
    sigma_cell: float
    """sd of a cell's log median around its launch's common shift."""
    df_cell: int
    launch_mean_sd: float
    """sd of a launch's mean log median over the cells (the common shift plus averaged residuals)."""
    df_launch: int
    sigma_launch: float
    """The common shift's own sd (0 when the launches' means agree within their residuals)."""
    shifts: dict[str, float]
    """Each launch's mean log median relative to the first launch's, as a relative change."""

    def shift_band(self, alpha: float, compared: int) -> float:
        """Half-width, in log images/s, of the common shift (median over `compared` cells) that
        two launches of the same code exceed with probability alpha."""
        var = 2 * (self.sigma_launch ** 2 + self.sigma_cell ** 2 * median_variance(compared))
        return float(stats.t.ppf(1 - alpha / 2, self.df_launch) * math.sqrt(var))

    def cell_band(self, alpha: float, compared: int) -> float:
        """Half-width, in log images/s, of a cell's departure from the median of the other
        compared cells that one of `compared` cells exceeds by chance with probability alpha
        (Bonferroni over the cells)."""
        var = 2 * self.sigma_cell ** 2 * (1 + median_variance(max(compared - 1, 1)))
        q = 1 - alpha / (2 * max(compared, 1))
        return float(stats.t.ppf(q, self.df_cell) * math.sqrt(var))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _relative(log_value: float) -> float:
    """A change in log images/s as a relative change (a band's upper edge)."""
    return float(math.expm1(log_value))


def fit(log_medians: np.ndarray, launches: list[str]) -> LaunchNoise:
    """The model from a cells x launches array of log median images/s (complete rows only)."""
    y = np.asarray(log_medians, dtype=float)
    if y.ndim != 2 or y.shape[1] != len(launches):
        raise ValueError(f"expected a cells x {len(launches)} array, got shape {y.shape}")
    cells, n = y.shape
    if n < 2:
        raise NotEnoughLaunches(f"A/A noise needs at least 2 launches of the same experiment, got {n}")
    if cells < 2:
        raise NotEnoughLaunches(f"A/A noise needs at least 2 cells that ran ok in every launch "
                                f"({', '.join(launches)}), found {cells}")
    if not np.isfinite(y).all():
        raise NotEnoughLaunches("A/A noise needs a positive, finite median images/s in every cell of "
                                "every launch")
    launch_means = y.mean(axis=0)
    residual = y - y.mean(axis=1, keepdims=True) - launch_means + y.mean()
    df_cell = (cells - 1) * (n - 1)
    var_cell = float((residual ** 2).sum() / df_cell)
    df_launch = n - 1
    var_launch_mean = float(launch_means.var(ddof=1))
    if var_cell == 0.0 or var_launch_mean == 0.0:
        # Real launches never agree to the last bit: these are copies, and would give zero-width bands.
        raise NotEnoughLaunches(f"the A/A launches ({', '.join(launches)}) have identical medians: "
                                "copies of one launch cannot show the noise between launches")
    return LaunchNoise(
        launches=list(launches), cells=cells,
        sigma_cell=math.sqrt(var_cell), df_cell=df_cell,
        launch_mean_sd=math.sqrt(var_launch_mean), df_launch=df_launch,
        sigma_launch=math.sqrt(max(0.0, var_launch_mean - var_cell / cells)),
        shifts={t: _relative(m - launch_means[0]) for t, m in zip(launches, launch_means)})


def common_shift(log_changes: np.ndarray) -> float:
    """The shift of a comparison shared by its cells: the median of their log changes, so that
    a minority of cells that really changed does not move it."""
    return float(np.median(np.asarray(log_changes, dtype=float)))


def verdicts(changes: dict[Any, float], model: LaunchNoise, alpha: float) -> dict[str, Any]:
    """Whether a comparison's common shift, and each cell's departure from the others, is
    beyond launch noise. changes: each cell's relative change of its median (candidate /
    baseline - 1). With one cell only the shift is tested."""
    keys = list(changes)
    logs = np.log1p(np.array([changes[k] for k in keys], dtype=float))
    k = len(keys)
    shift = common_shift(logs) if k else 0.0
    # Two tests (the shared shift, a cell's own departure), alpha split between them; the bands
    # are symmetric in log images/s, so a slowdown is held to the same band as a speed-up.
    shift_band, cell_band = model.shift_band(alpha / 2, max(k, 1)), model.cell_band(alpha / 2, k)
    cells = {}
    for i, key in enumerate(keys):
        others = np.delete(logs, i)
        gap = float(logs[i] - common_shift(others)) if len(others) else 0.0
        cells[key] = {"departure": _relative(gap), "departure_beyond": bool(len(others) and abs(gap) > cell_band)}
    return {"shift": _relative(shift), "shift_floor": _relative(shift_band),
            "shift_beyond": bool(abs(shift) > shift_band), "cell_floor": _relative(cell_band),
            "cells": cells}


def simulate(rng: np.random.Generator, fitted: int, changed: dict[int, float] | None = None,
             shift: float = 0.0, sigma_launch: float = 0.007, sigma_cell: float = 0.001,
             cells: int = 10, alpha: float = 0.05) -> dict[str, Any]:
    """One simulated check of the model's error rates: fit on `fitted` A/A launches, then judge
    a new pair of launches of the same cells in which the cells in `changed` changed by that
    relative amount and every cell by `shift`. Defaults: the one-H200 launches (0.7%, 0.1%)."""
    level = np.log(rng.uniform(1e4, 5e4, cells))[:, None]
    y = level + rng.normal(0, sigma_launch, fitted + 2)[None, :] + rng.normal(0, sigma_cell, (cells, fitted + 2))
    model = fit(y[:, :fitted], [f"l{i}" for i in range(fitted)])
    base, cand = y[:, fitted], y[:, fitted + 1] + shift
    for c, change in (changed or {}).items():
        cand[c] += math.log1p(change)
    return verdicts({c: math.expm1(cand[c] - base[c]) for c in range(cells)}, model, alpha)


def flagged(judged: dict[str, Any]) -> set:
    """The cells a judgement calls beyond launch noise (by the shift or by their own departure)."""
    return {c for c, r in judged["cells"].items() if r["departure_beyond"] or judged["shift_beyond"]}


__all__ = ["LaunchNoise", "NotEnoughLaunches", "median_variance", "fit", "common_shift", "verdicts",
           "simulate", "flagged"]


def across_launches(low: float, high: float, level: float, model: LaunchNoise) -> tuple[float, float]:
    """One launch's interval of a cell's median (images/s, at confidence `level`) widened to
    cover another launch's median: the launch-to-launch sd of a cell's log median (the common
    shift and the cell's own wobble) added on either side at the level's normal quantile."""
    sd = math.sqrt(model.sigma_launch ** 2 + model.sigma_cell ** 2)
    z = float(stats.norm.ppf((1 + level) / 2))
    return low * math.exp(-z * sd), high * math.exp(z * sd)
