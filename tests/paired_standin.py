"""A stand-in for analysis.compare.paired.paired_throughput (the stats branch's), in tests only:
the shape of upgrade-stats' PairedVerdict (cells, launch, design, notes), with a plain Welch
test on log throughput. The plumbing's tests monkeypatch one_launch.throughput_test with it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dpbench.analysis.compare.stats import holm, welch_p


@dataclass
class PairedCell:
    cell: tuple
    n_base: int
    n_cand: int
    change: float
    p_holm: float | None
    verdict: str
    smallest_detectable: float | None


@dataclass
class PairedLaunch:
    cells: int
    change: float
    p: float | None
    verdict: str
    smallest_detectable: float | None


@dataclass
class PairedVerdict:
    cells: list[PairedCell]
    launch: PairedLaunch
    design: str
    alpha: float = 0.05
    notes: list[str] = field(default_factory=list)


def paired_throughput(samples: pd.DataFrame, base: str, cand: str, alpha: float = 0.05) -> PairedVerdict:
    logs = {}
    for cell, rows in samples.groupby(samples["cell"].map(tuple), sort=False):
        logs[cell] = (np.log(rows.loc[rows["environment"] == base, "samples_per_s"].to_numpy(float)),
                      np.log(rows.loc[rows["environment"] == cand, "samples_per_s"].to_numpy(float)))
    raw = [welch_p(a, b) for a, b in logs.values()]
    rows = []
    for (cell, (a, b)), p in zip(logs.items(), holm(raw)):
        change = float(np.exp(b.mean() - a.mean()) - 1)
        sd = float(np.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)) if min(len(a), len(b)) > 1 else None
        verdict = ("noise unknown" if p is None else "no change" if p >= alpha
                   else "slower" if change < 0 else "faster")
        rows.append(PairedCell(cell, len(a), len(b), change, p, verdict,
                               None if sd is None else 2.8 * sd * np.sqrt(2 / min(len(a), len(b)))))
    diffs = [float(b.mean() - a.mean()) for a, b in logs.values()]
    launch = PairedLaunch(len(rows), float(np.exp(np.mean(diffs)) - 1), None, "no change", None)
    return PairedVerdict(rows, launch, "stand-in: Welch per cell")
