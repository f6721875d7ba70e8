"""C8's evidence as numbers: speed-up over one GPU per group, variant and GPU count with its range
over repeats, the crossovers along the batch, the dtype DataParallel's replicas computed in, the
cause the C7 probe's step breakdown names, and the verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dpbench.analysis.intervals import ratio_ci
from dpbench.claims import CONFIRMED, NUANCE, REFUTED
from dpbench.claims.c7.verdict import BUDGET_KEYS, dp_step_breakdowns, overhead_growth
from dpbench.claims.records import ProbeRecord


BF16 = "torch.bfloat16"


def _series_name(options: dict[str, Any], precision: str) -> str:
    """What a curve holds fixed while the batch varies: precision, memory format, feed..."""
    rest = {k: v for k, v in options.items()
            if k not in BUDGET_KEYS | {"global_batch", "precision", "channels_last"}}
    name = precision + ("+channels_last" if options.get("channels_last") else "")
    return name + "".join(f", {k}={v}" for k, v in sorted(rest.items()))


def _speed_status(lo: float, hi: float, repeats: int) -> str:
    """A speed-up is faster or slower only where its range over the repeats (slowest against
    fastest and back) lies wholly on one side of 1; one repeat measures no noise."""
    if repeats < 2:
        return "noise unknown"
    return "faster" if lo > 1 else "slower" if hi < 1 else "within noise"


def _train_size(ev, run_ids) -> int | None:
    """The training set's size as the runs' records know it (None where none says)."""
    return next((n for n in (ev.train_size(rid) for rid in run_ids) if n), None)


def c8_points(ev) -> list[dict[str, Any]]:
    """Speed-up over single (1 GPU, same group) per group, variant and GPU count, with the range
    over repeats (slowest against fastest and back: tables.ratio_ci, a distribution-free interval
    whose confidence it keeps), and whether that range says faster, slower or neither."""
    points = []
    for g in ev.claim_groups("C8"):
        single = ev.rows(g, "single", 1)
        if single.empty:
            continue
        s = single["images_per_s"].astype(float)
        opts = ev.groups[g]["options"]
        precision = str(single["precision"].iloc[0]) if "precision" in single else opts.get("precision", "fp32")
        for variant in ("dp", "ddp"):
            for gpus in ev.groups[g]["gpus"]:
                r = ev.rows(g, variant, gpus)
                if r.empty:
                    continue
                ips = r["images_per_s"].astype(float)
                sp = ips.median() / s.median()
                # the tables' interval on a ratio of medians: the two ranges' ratio with a few repeats
                est = ratio_ci(ips, s)
                lo, hi = (sp, sp) if math.isnan(est.low) else (est.low, est.high)
                n = min(len(r), len(single))
                status = _speed_status(lo, hi, n)
                points.append({"group": g, "series": _series_name(opts, precision), "variant": variant,
                               "gpus": int(gpus), "global_batch": int(r["global_batch"].iloc[0]),
                               "images_per_s": ips.median(), "single_images_per_s": s.median(),
                               "speedup": sp, "speedup_lo": lo, "speedup_hi": hi, "repeats": n,
                               # the range's confidence (a lower bound: 25% for 2 repeats against 2)
                               "level": None if math.isnan(est.level) else est.level,
                               "status": status, "faster": status == "faster", "slower": status == "slower",
                               "efficiency": sp / gpus, "train_size": _train_size(ev, r["run_id"]),
                               "wall_s": r["wall_s"].median(), "single_wall_s": single["wall_s"].median()})
    return points


def _interpolate(seg: list[dict[str, Any]]) -> float:
    """Where the medians cross 1 between adjacent batches of seg, linearly in log2(batch)."""
    for a, b in zip(seg, seg[1:]):
        if (a["speedup"] - 1) * (b["speedup"] - 1) <= 0 and a["speedup"] != b["speedup"]:
            xa, xb = math.log2(a["global_batch"]), math.log2(b["global_batch"])
            return 2 ** (xa + (1 - a["speedup"]) * (xb - xa) / (b["speedup"] - a["speedup"]))
    return math.nan


def crossovers(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (series, variant, gpus) with two or more batches: where the speed-up crosses 1. A
    crossing is called only between a batch measured slower and the next measured faster (or
    back), each beyond its repeats' range; those two batches bracket it, and any batch between
    them was within noise. The point estimate interpolates the medians in log2(batch)."""
    out = []
    keys = sorted({(p["series"], p["variant"], p["gpus"]) for p in points})
    for series, variant, gpus in keys:
        curve = sorted((p for p in points if (p["series"], p["variant"], p["gpus"]) == (series, variant, gpus)),
                       key=lambda p: p["global_batch"])
        if len(curve) < 2:
            continue
        called = [i for i, p in enumerate(curve) if p["faster"] or p["slower"]]
        found = []
        for i, j in zip(called, called[1:]):
            a, b = curve[i], curve[j]
            if a["faster"] != b["faster"]:
                found.append({"batch": _interpolate(curve[i:j + 1]), "between": [a["global_batch"], b["global_batch"]],
                              "within_noise": [p["global_batch"] for p in curve[i + 1:j]],
                              "direction": "faster above" if b["faster"] else "slower above"})
        ups = [x for x in found if x["direction"] == "faster above"]
        # where it paid off: above its last crossing to faster; "only from" where no smaller batch was faster too
        paid_off_from = ups[-1]["between"][1] if ups else None
        only = bool(ups) and not any(p["status"] == "faster" and p["global_batch"] < ups[-1]["between"][0]
                                     for p in curve)
        out.append({"series": series, "variant": variant, "gpus": gpus, "crossings": found,
                    "paid_off_from": paid_off_from, "paid_off_only_from": only,
                    "batches": [p["global_batch"] for p in curve], "speedups": [p["speedup"] for p in curve],
                    "statuses": [p["status"] for p in curve],
                    "level": min((p["level"] for p in curve if p["level"] is not None), default=None),
                    "all_faster": all(p["faster"] for p in curve), "all_slower": all(p["slower"] for p in curve)})
    return out


def replica_dtypes(ev) -> dict[str, str]:
    """The C7 probe's dtypes a replica computed in under the caller's autocast(bfloat16): stock
    DataParallel (its new threads start with autocast's default dtype), and dpbench's dp variant
    as the training runs build it; {} where not measured."""
    p: ProbeRecord | None = ev.probes.get("C7")
    return p.values("c7.dp_step.replica_autocast_dtype") if p else {}


@dataclass
class C8Speed:
    """What C8's runs (and the C7 probe's step breakdowns) showed."""
    verdict: str
    points: list[dict[str, Any]]        # every speed-up over one GPU (c8_points)
    curves: list[dict[str, Any]]        # per series, variant and GPU count along the batch (crossovers)
    breakdowns: list[dict[str, Any]]    # the C7 probe's DataParallel steps taken apart, benchmark off
    growth: dict[str, Any] | None       # overhead_growth over those
    dtypes: dict[str, str]              # replica_dtypes

    @property
    def dp(self) -> list[dict[str, Any]]:
        return [p for p in self.points if p["variant"] == "dp" and p["gpus"] > 1]

    @property
    def dp_curves(self) -> list[dict[str, Any]]:
        return [c for c in self.curves if c["variant"] == "dp" and c["gpus"] > 1]

    @property
    def cause(self) -> dict[str, Any] | None:
        """The breakdown at the smallest batch taken apart (the C7 group's)."""
        return self.breakdowns[0] if self.breakdowns else None


def from_runs(ev) -> C8Speed | None:
    """None where no DataParallel run on 2+ GPUs has a speed-up."""
    points = c8_points(ev)
    dp = [p for p in points if p["variant"] == "dp" and p["gpus"] > 1]
    if not dp:
        return None
    if all(p["faster"] for p in dp):
        verdict = CONFIRMED
    elif all(p["slower"] for p in dp):
        verdict = REFUTED
    else:
        verdict = NUANCE   # faster at some batches, slower at others (or not told apart)
    breakdowns = dp_step_breakdowns(ev, "off")
    return C8Speed(verdict, points, crossovers(points), breakdowns, overhead_growth(breakdowns), replica_dtypes(ev))

