"""The cell table: one row per cell (options, variant, gpus) of ok runs, each quantity's median
or its strong and weak scaling ratio against the matching single runs, with its interval, and
the same in long form (medians.csv).

A run on k GPUs at global batch B with per-GPU batch b = B / k is compared with `single` runs of
the same setup (every option equal but the batch fields):

    strong efficiency = images/s_k(B) / (k × images/s_single(B))   same global batch
    weak efficiency   = images/s_k(k·b) / (k × images/s_single(b))  same per-GPU batch

Both are computed wherever the matching single runs exist, whichever way the run was planned
(`scaling` says how it was planned). summary.md, the figures and medians.csv all ask this
module, so a number means the same thing in every place it appears.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpbench import results
from dpbench.analysis.cells import CELL_FACTS, CELL_KEY
from dpbench.analysis.intervals import NONE, Estimate, median_ci, present, ratio_ci
from dpbench.analysis.options import STRONG, WEAK, value_text
from dpbench.analysis.tables import ok_runs, sort

# Quantities of a cell (options, variant, gpus): a median over its ok repeats, or a ratio of
# medians against the matching single runs. (name, what it is, interval?)
MEDIANS = [
    ("rate", "median throughput in the workload's unit (the cell's rate_unit)", True),
    ("images_per_s", "median images/s", True),
    ("step_ms_p50", "median step time (ms)", False),
    ("peak_mem_mib", "median peak allocated MiB", True),
    ("mem_dev0_over_mean_others", "device 0's memory over the others' mean", True),
    ("final_loss", "median final loss", False),
    ("test_acc", "median test accuracy", False),
    ("n_warnings", "median warnings", False),
]
RATIOS = [   # (name, scaling kind, divided by gpus?)
    ("speedup_strong", STRONG, False),
    ("efficiency_strong", STRONG, True),
    ("speedup_weak", WEAK, False),
    ("efficiency_weak", WEAK, True),
]
RATIO_NAMES = {name for name, _, _ in RATIOS}
# A cell's key and facts, in the column order of the cell table (medians.csv).
CELL_IDENT = [c for c in results.CELL_COLUMNS if c in CELL_KEY + CELL_FACTS]


def _batch(value: float) -> float | None:
    """A batch size usable as a key (a fractional per-GPU batch has no single run to match)."""
    return float(value) if present(value) and float(value).is_integer() else None


def single_pools(ok: pd.DataFrame) -> dict[tuple[str, float], np.ndarray]:
    """Throughput (in the workload's unit) of the ok single runs, by (setup, global batch)."""
    single = ok[(ok["variant"] == "single") & ok["rate"].notna()]
    return {(s, float(g)): grp["rate"].to_numpy()
            for (s, g), grp in single.groupby(["setup", "global_batch"], sort=True)}


def reference_batch(kind: str, global_batch: float, per_gpu_batch: float) -> float | None:
    """The global batch of the single runs a scaling kind compares with."""
    return _batch(global_batch) if kind == STRONG else _batch(per_gpu_batch)


def reference_text(kind: str, batch: float | None) -> str:
    """The single runs a ratio compares with: a value of medians.csv's reference column (frozen
    by tests/workflow/test_fixture_sets.py), so still written here."""
    if batch is None:
        return ""
    return f"single at global batch {value_text(batch)}" + (" (the per-GPU batch)" if kind == WEAK else "")


def with_efficiency(ok: pd.DataFrame) -> pd.DataFrame:
    """Each ok run with its own speedup_{strong,weak} and efficiency_{strong,weak}: its images/s
    against the median of the matching single runs (NaN where none ran)."""
    pools = single_pools(ok)
    out = ok.copy()
    for name, kind, per_gpu in RATIOS:
        refs = []
        for _, r in ok.iterrows():
            pool = pools.get((r["setup"], reference_batch(kind, r["global_batch"], r["per_gpu_batch"])))
            ref = np.median(pool) * (r["gpus"] if per_gpu else 1) if pool is not None else math.nan
            refs.append(ref)
        out[name] = ok["rate"].to_numpy() / np.asarray(refs, dtype=float) if len(ok) else []
    return out


def cells(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (options, variant, gpus) of ok runs: n_ok, each quantity's median (or ratio
    of medians) and its interval as <q>, <q>_ci_low, <q>_ci_high, and the reference of each
    scaling kind. Sorted like the tables."""
    ok = ok_runs(summary)
    if ok.empty:
        return pd.DataFrame(columns=CELL_IDENT + ["n_ok"])
    pools = single_pools(ok)
    rows = []
    for key, grp in ok.groupby(CELL_IDENT, sort=False, dropna=False):
        row = dict(zip(CELL_IDENT, key), n_ok=len(grp), precision=grp["precision"].iloc[0],
                   rate_unit=grp["rate_unit"].iloc[0], bound=regime(grp["bound"]))
        if "rehearsed" in grp.columns:
            row["rehearsed"] = bool(grp["rehearsed"].fillna(False).astype(bool).any())
        for q, _, interval in MEDIANS:
            est = median_ci(grp[q]) if interval else Estimate(grp[q].median(), math.nan, math.nan, math.nan)
            row.update(estimate_fields(q, est))
        for q, kind, per_gpu in RATIOS:
            batch = reference_batch(kind, row["global_batch"], row["per_gpu_batch"])
            pool = pools.get((row["setup"], batch))
            row[f"{kind}_reference"] = reference_text(kind, batch) if pool is not None else ""
            row[f"{kind}_reference_n"] = len(pool) if pool is not None else 0
            if row["variant"] == "single":   # the baseline against itself: 1 by definition
                est = Estimate(1.0, math.nan, math.nan, math.nan) if pool is not None else NONE
            elif pool is None:
                est = NONE
            else:
                est = ratio_ci(grp["rate"], pool, row["gpus"] if per_gpu else 1.0)
            row.update(estimate_fields(q, est))
        rows.append(row)
    return sort(pd.DataFrame(rows))


def regime(bounds: pd.Series) -> str:
    """A cell's regime: "host" or "device" where its runs agree, "mixed" where they do not, ""
    where none was probed (the CPU, records before the probe)."""
    seen = sorted({b for b in bounds if isinstance(b, str) and b})
    return seen[0] if len(seen) == 1 else ("mixed" if seen else "")


def estimate_fields(q: str, est: Estimate) -> dict[str, float]:
    """A quantity's columns in the cell table: q, q_ci_low, q_ci_high, q_ci_level."""
    return {q: est.value, f"{q}_ci_low": est.low, f"{q}_ci_high": est.high, f"{q}_ci_level": est.level}


def cell_estimate(c: pd.Series, q: str) -> Estimate:
    return Estimate(c[q], c[f"{q}_ci_low"], c[f"{q}_ci_high"], c[f"{q}_ci_level"],
                    at_least=q in RATIO_NAMES)


def cell_rows(cell_table: pd.DataFrame) -> list[dict]:
    """The cells in long form, one row per (cell, quantity): what medians.csv holds."""
    rows = []
    for _, c in cell_table.iterrows():
        ident = {k: c[k] for k in CELL_IDENT}
        for q, _, _ in MEDIANS:
            rows.append({**ident, "quantity": q, "n": c["n_ok"], "reference": "", **long_fields(c, q)})
        for q, kind, _ in RATIOS:
            ref = c[f"{kind}_reference"]
            if not ref:
                continue
            rows.append({**ident, "quantity": q, "n": c["n_ok"],
                         "reference": f"{ref}, n={c[f'{kind}_reference_n']}", **long_fields(c, q)})
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in rows]


def long_fields(c: pd.Series, q: str) -> dict[str, float]:
    est = cell_estimate(c, q)
    return {"value": est.value, "ci_low": est.low, "ci_high": est.high, "ci_level": est.level}
