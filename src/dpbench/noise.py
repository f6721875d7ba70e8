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
then gets two tests, each a t prediction interval (its degrees of freedom from the A/A data, so
few launches give wide floors rather than false alarms):

- the common shift (the median over the compared cells of their log changes) against the
  spread of a launch's mean over cells: shift_floor;
- a cell's departure from that shift against sigma_cell: cell_floor, Bonferroni over the cells.

What the model assumes: every cell wobbles alike (one pooled sigma_cell), and the A/A launches
ran what the comparison runs, with as many repeats. A cell bound by the host (eager bf16 at a
small batch: -17% between two one-H200 machines, where fp32 cells moved 1%) wobbles more than
the pool; learn from launches of the same experiment, which hold such cells and widen the pool.

No I/O here: dpbench.compare loads the launches and applies the floors.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats


class NotEnoughLaunches(ValueError):
    """The A/A data cannot separate the two noise terms (too few launches or shared cells)."""


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

    def shift_band(self, alpha: float) -> float:
        """Half-width, in log images/s, of the common shift two launches of the same code
        exceed with probability alpha."""
        return float(stats.t.ppf(1 - alpha / 2, self.df_launch) * math.sqrt(2) * self.launch_mean_sd)

    def cell_band(self, alpha: float, cells: int) -> float:
        """Half-width, in log images/s, of the departure from the common shift that one of
        `cells` cells exceeds by chance with probability alpha (Bonferroni over the cells)."""
        q = 1 - alpha / (2 * max(cells, 1))
        return float(stats.t.ppf(q, self.df_cell) * math.sqrt(2) * self.sigma_cell)

    def shift_floor(self, alpha: float) -> float:
        """shift_band as a relative change (its upper edge)."""
        return _floor(self.shift_band(alpha))

    def cell_floor(self, alpha: float, cells: int) -> float:
        """cell_band as a relative change (its upper edge)."""
        return _floor(self.cell_band(alpha, cells))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _floor(log_half_width: float) -> float:
    """A symmetric band on the log scale as the relative change at its edge."""
    return float(math.expm1(log_half_width))


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
    launch_means = y.mean(axis=0)
    residual = y - y.mean(axis=1, keepdims=True) - launch_means + y.mean()
    df_cell = (cells - 1) * (n - 1)
    var_cell = float((residual ** 2).sum() / df_cell)
    df_launch = n - 1
    var_launch_mean = float(launch_means.var(ddof=1))
    return LaunchNoise(
        launches=list(launches), cells=cells,
        sigma_cell=math.sqrt(var_cell), df_cell=df_cell,
        launch_mean_sd=math.sqrt(var_launch_mean), df_launch=df_launch,
        sigma_launch=math.sqrt(max(0.0, var_launch_mean - var_cell / cells)),
        shifts={t: float(math.expm1(m - launch_means[0])) for t, m in zip(launches, launch_means)})


def common_shift(log_changes: np.ndarray) -> float:
    """The shift of a comparison shared by its cells: the median of their log changes, so that
    a minority of cells that really changed does not move it."""
    return float(np.median(np.asarray(log_changes, dtype=float)))


def verdicts(changes: dict[Any, float], model: LaunchNoise, alpha: float) -> dict[str, Any]:
    """Per cell, whether its relative change is beyond launch noise, and why.

    changes: relative change of each cell's median (candidate / baseline - 1).
    """
    keys = list(changes)
    logs = np.log1p(np.array([changes[k] for k in keys], dtype=float))
    shift = common_shift(logs) if len(keys) else 0.0
    # Two tests per cell (the shared shift, the cell's own departure): alpha split between them.
    # The bands are symmetric in log images/s: a slowdown is judged as strictly as a speed-up.
    shift_band, cell_band = model.shift_band(alpha / 2), model.cell_band(alpha / 2, len(keys))
    shift_floor, cell_floor = _floor(shift_band), _floor(cell_band)
    shift_beyond = bool(abs(shift) > shift_band)
    cells = {}
    for k, lg in zip(keys, logs):
        departure = float(math.expm1(lg - shift))
        cells[k] = {"departure": departure, "departure_beyond": abs(lg - shift) > cell_band,
                    "cell_floor": cell_floor, "shift": float(math.expm1(shift)),
                    "shift_beyond": shift_beyond}
    return {"shift": float(math.expm1(shift)), "shift_floor": shift_floor, "shift_beyond": shift_beyond,
            "cell_floor": cell_floor, "cells": cells}


__all__ = ["LaunchNoise", "NotEnoughLaunches", "fit", "common_shift", "verdicts"]
