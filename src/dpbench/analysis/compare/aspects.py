"""The aspects of a comparison besides throughput and loss curves: peak memory, warnings, final
accuracy and each run's status, one dataclass per row (its fields in the report's key order).
Cells are matched by their CELL key (loading.key_cells); a row shows the cell's CELL_KEY fields."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpbench import results as R
from dpbench.analysis.cells import cell_fields, cell_key
from dpbench.analysis.compare.loading import CELL, in_order, ok_values, shown
from dpbench.analysis.compare.stats import holm, welch_p
from dpbench.analysis.compare.thresholds import Thresholds


@dataclass(frozen=True)
class MemoryChange:
    """Peak allocated MiB of one device of a cell; a regression exceeds both thresholds."""
    variant: str
    gpus: int
    options: str
    device: int
    baseline_mib: float
    candidate_mib: float
    delta_mib: float
    delta_pct: float
    verdict: str
    severity: str


@dataclass(frozen=True)
class WarningChange:
    """A warning (category, message) of a cell, counted per ok run on each side (None: absent)."""
    variant: str
    gpus: int
    options: str
    category: str
    message: str
    count_per_run_baseline: float | None
    count_per_run_candidate: float | None
    severity: str


@dataclass(frozen=True)
class AccuracyChange:
    """Mean final test accuracy of a cell, Welch over repeats and Holm over cells."""
    variant: str
    gpus: int
    options: str
    acc_baseline: float
    acc_candidate: float
    change_pp: float
    p_value: float | None
    p_holm: float | None
    verdict: str
    severity: str


@dataclass(frozen=True)
class StatusChange:
    """A run whose status differs between the sides (or that one side lacks)."""
    run_id: str
    variant: str
    gpus: int
    options: str
    repeat: int
    baseline: str | None
    candidate: str | None
    change: str
    reason: str
    severity: str


def compare_memory(base: dict, cand: dict, th: Thresholds) -> list[MemoryChange]:
    def peaks(rs: dict) -> dict[tuple, float]:
        mem = rs["tables"]["memory"]
        return mem[mem["allocated_mib"].notna()].groupby([CELL, "device"])["allocated_mib"].max().to_dict()

    a, b = peaks(base), peaks(cand)
    rows = []
    for k in sorted(a.keys() & b.keys(), key=lambda k: (shown(k[0], base, cand), k[1])):
        delta = float(b[k] - a[k])
        rel = 100.0 * delta / a[k] if a[k] > 0 else math.inf
        # Both limits must be exceeded: small absolute noise on small tensors is not a regression.
        mib, pct = th.mem_threshold_mib, th.mem_threshold_pct
        verdict = ("regression" if delta > mib and rel > pct else
                   "improvement" if -delta > mib and -rel > pct else "no change")
        rows.append(MemoryChange(**cell_fields(shown(k[0], base, cand)), device=int(k[1]), baseline_mib=float(a[k]),
                                 candidate_mib=float(b[k]), delta_mib=delta, delta_pct=rel, verdict=verdict,
                                 severity="regression" if verdict == "regression" else "info"))
    return rows


def compare_warnings(base: dict, cand: dict) -> dict[str, list[WarningChange]]:
    runs_a = base["tables"]["ok_summary"].groupby(CELL).size().to_dict()
    runs_b = cand["tables"]["ok_summary"].groupby(CELL).size().to_dict()
    shared = runs_a.keys() & runs_b.keys()  # a missing group is reported under status, not here

    def per_run(rs: dict, runs: dict) -> dict[tuple, float]:
        w = rs["tables"]["warnings"]
        totals = w[w["count"].notna()].groupby([CELL, "category", "message"])["count"].sum()
        return {k: float(v) / runs[k[0]] for k, v in totals.items() if k[0] in shared}

    a, b = per_run(base, runs_a), per_run(cand, runs_b)

    def row(k: tuple, severity: str) -> WarningChange:
        return WarningChange(**cell_fields(shown(k[0], base, cand)), category=k[1], message=k[2],
                             count_per_run_baseline=a.get(k), count_per_run_candidate=b.get(k), severity=severity)

    def ordered(keys: set) -> list:
        return sorted(keys, key=lambda k: (shown(k[0], base, cand), k[1], k[2]))

    return {"new": [row(k, "finding") for k in ordered(b.keys() - a.keys())],
            "vanished": [row(k, "info") for k in ordered(a.keys() - b.keys())],
            "changed": [row(k, "info") for k in ordered(a.keys() & b.keys()) if not math.isclose(a[k], b[k])]}


def compare_accuracy(base: dict, cand: dict, th: Thresholds) -> list[AccuracyChange]:
    a = ok_values(base["tables"]["summary"], "test_acc")
    b = ok_values(cand["tables"]["summary"], "test_acc")
    keys = in_order(a.keys() & b.keys(), base, cand)
    raw = [welch_p(a[k], b[k]) for k in keys]
    rows = []
    for k, p, q in zip(keys, raw, holm(raw)):
        change = float(100.0 * (np.mean(b[k]) - np.mean(a[k])))
        if q is None:
            verdict = "noise unknown" if change else "no change"
        else:
            verdict = "differs" if q < th.alpha else "no change"
        rows.append(AccuracyChange(**cell_fields(shown(k, base, cand)), acc_baseline=float(np.mean(a[k])),
                                   acc_candidate=float(np.mean(b[k])), change_pp=change, p_value=p, p_holm=q,
                                   verdict=verdict, severity="finding" if verdict == "differs" else "info"))
    return rows


def _status_change(before: str | None, after: str | None) -> tuple[str | None, str]:
    if after is None:
        return "missing in candidate", "regression"
    if before is None:
        return "new in candidate", "info"
    if before == after:
        return None, "info"
    if before == R.STATUS_OK:
        return f"ok → {after}", "regression"
    return (f"{before} → ok (fixed)" if after == R.STATUS_OK else f"{before} → {after}"), "info"


NOT_IN_OTHER = "not in the other experiment"


def _one_sided_cells(base: dict, cand: dict, sets: dict | None) -> set:
    """The cells only one side planned, when the two sides ran different experiments (compare_sets):
    their runs are the other experiment's absence, not a run that went missing."""
    if not sets or not sets["experiments"]["differ"]:
        return set()
    return set(base["tables"]["summary"][CELL]) ^ set(cand["tables"]["summary"][CELL])


def compare_status(base: dict, cand: dict, sets: dict | None = None) -> list[StatusChange]:
    """Runs whose status changed. With `sets` (compare_sets) saying the experiments differ, a run
    of a cell only one side has is "not in the other experiment" (info); in the same experiment,
    a run the candidate lacks stays a regression."""
    a = base["tables"]["summary"].drop_duplicates("run_id").set_index("run_id").to_dict("index")
    b = cand["tables"]["summary"].drop_duplicates("run_id").set_index("run_id").to_dict("index")
    one_sided = _one_sided_cells(base, cand, sets)
    rows = []
    for rid in sorted(a.keys() | b.keys()):
        before, after = a.get(rid, {}).get("status"), b.get(rid, {}).get("status")
        run = b.get(rid) or a[rid]
        if (before is None or after is None) and run[CELL] in one_sided:
            change, severity = NOT_IN_OTHER, "info"
        else:
            change, severity = _status_change(before, after)
        if change is None:
            continue
        reason = run["reason"] if isinstance(run["reason"], str) else ""
        rows.append(StatusChange(run_id=rid, **cell_fields(cell_key(run)), repeat=int(run["repeat"]),
                                 baseline=before, candidate=after, change=change, reason=reason,
                                 severity=severity))
    return rows
