"""C7's evidence as numbers: the C7 probe's DataParallel step breakdowns (each stage against one
GPU's share of the same work, what persistent replica threads save; C8 names its cause from
them too), the training runs' step times with cudnn.benchmark on and off, and the verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.records import STAGES, ProbeRecord, dp_step_id


THREAD_SHARE = 0.5         # ... and persistent threads this much of DP's time beyond a perfect split
SLOWDOWN = 1.5             # benchmark-on step time over benchmark-off that counts as "much slower"
UNCHANGED = 1.1            # ... and the ratio under which it counts as no effect
# Options that set a run's length, not what it measures: groups differing only in these are twins.
BUDGET_KEYS = {"max_steps", "warmup_steps", "epochs", "eval_each_epoch", "eval_samples", "log_every"}
# What one GPU pays for the work of each DataParallel stage: (its stage in SINGLE_STAGES, whether
# the replicas split it over the GPUs). The replicas' forward and backward split one GPU's; the
# loss on the gathered outputs and the optimizer step are one GPU's own; scatter, replication,
# gather and the gradients' reduce have no counterpart on one GPU.
ONE_GPU_SHARE = {"replica_threads": ("forward", True), "loss": ("loss", False),
                 "backward": ("backward", True), "optimizer": ("optimizer", False)}


def stage_excess(stages: dict[str, float], single_stages: dict[str, float], gpus: int) -> dict[str, float]:
    """Each stage of a DataParallel step less what one GPU pays for the same work (ONE_GPU_SHARE)."""
    out = {}
    for s in STAGES:
        if s in stages:
            part = ONE_GPU_SHARE.get(s)
            share = 0.0 if part is None else single_stages[part[0]] / (gpus if part[1] else 1)
            out[s] = stages[s] - share
    return out


def _thread_saving(steps: dict[str, Any]) -> dict[str, Any]:
    """What persistent replica threads save against stock DP, and whether that names the cause:
    the saving must lie beyond the step-to-step spread (the two kinds' timed steps' ranges do
    not overlap) and be at least THREAD_SHARE of stock DP's time beyond a perfect split of one
    GPU's step over its GPUs."""
    stock, pers, single = (steps[k] for k in ("dp", "dp_persistent_threads", "single"))
    gpus = steps.get("gpus") or 2
    saving = stock["step_ms"] - pers["step_ms"]
    overhead = stock["step_ms"] - single["step_ms"] / gpus
    share = saving / overhead if overhead > 0 else math.nan
    if "step_ms_min" not in stock or "step_ms_max" not in pers:
        beyond = None   # the record has no step-to-step spread: the saving is not told apart
    else:
        beyond = pers["step_ms_max"] < stock["step_ms_min"]
    return {"saving_ms": saving, "overhead_ms": overhead, "share": share, "beyond_noise": beyond,
            "threads_are_the_cost": bool(beyond) and share >= THREAD_SHARE}


def _overhead_range(steps: dict[str, Any]) -> tuple[float, float]:
    """Stock DP's time beyond a perfect split of one GPU's step, over the timed steps' ranges
    (its fastest against one GPU's slowest, and back); the medians' where no range was recorded."""
    dp, single, gpus = steps["dp"], steps["single"], steps.get("gpus") or 2
    mid = dp["step_ms"] - single["step_ms"] / gpus
    if "step_ms_min" not in dp or "step_ms_min" not in single:
        return mid, mid
    return dp["step_ms_min"] - single["step_ms_max"] / gpus, dp["step_ms_max"] - single["step_ms_min"] / gpus


def _breakdown(p: ProbeRecord, flag: str, batch: int) -> dict[str, Any]:
    steps = p.values(dp_step_id(flag, batch, "steps"))
    stages = p.values(dp_step_id(flag, batch, "stages.dp"))
    single_stages = p.values(dp_step_id(flag, batch, "stages.single"))
    stock, pers, single = (steps[k]["step_ms"] for k in ("dp", "dp_persistent_threads", "single"))
    gpus = steps.get("gpus") or 2
    excess = stage_excess(stages, single_stages, gpus) if single_stages else {}
    largest = max(excess, key=excess.get) if excess else None
    saved = _thread_saving(steps)
    threads = saved["threads_are_the_cost"]
    return {"benchmark": flag, "batch": steps.get("batch", batch), "gpus": gpus, "steps": steps,
            "single_ms": single, "dp_ms": stock, "dp_persistent_ms": pers,
            "dp_speedup": single / stock, "dp_persistent_speedup": single / pers,
            "stages": stages, "persistent_stages": p.values(dp_step_id(flag, batch, "stages.dp_persistent_threads")),
            "single_stages": single_stages, "excess": excess, "largest_excess_stage": largest,
            "overhead_range_ms": list(_overhead_range(steps)),
            "threads": saved, "cause": "fresh replica threads" if threads else largest,
            "threads_are_the_cost": threads}


def dp_step_breakdowns(ev, flag: str = "off") -> list[dict[str, Any]]:
    """The C7 probe's DataParallel step breakdowns at one cudnn.benchmark setting, one per batch,
    smallest first (the C7 group's batch; the probe adds the largest of C8's sweep): one GPU,
    stock DP and DP on persistent replica threads, each DP stage's excess over one GPU's share
    of the same work, and the stage with the largest."""
    p: ProbeRecord | None = ev.probes.get("C7")
    if p is None:
        return []
    steps = [o for o in p.with_prefix(f"c7.dp_step.bench_{flag}.b") if o.id.endswith(".steps")]
    return [_breakdown(p, flag, b) for b in sorted({int(o.get("batch")) for o in steps})]


def dp_step_cause(ev, flag: str = "off") -> dict[str, Any] | None:
    """The breakdown at the C7 group's batch; None where the probe did not take the step apart."""
    found = dp_step_breakdowns(ev, flag)
    return found[0] if found else None


def overhead_growth(breakdowns: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Stock DP's time beyond a perfect split at the smallest and the largest batch broken down:
    whether it grows with the batch beyond the timed steps' ranges (then part of it is a cost
    per image, the data moved) or not (a cost per step, which a larger batch spreads over more
    images). None with one batch: one batch cannot tell the two apart."""
    if len(breakdowns) < 2:
        return None
    a, b = breakdowns[0], breakdowns[-1]
    return {"batches": [a["batch"], b["batch"]],
            "overhead_ms": [a["threads"]["overhead_ms"], b["threads"]["overhead_ms"]],
            "grows": bool(b["overhead_range_ms"][0] > a["overhead_range_ms"][1])}


def _twin(ev, group: str, key: str) -> str | None:
    """Another group whose options equal this one's except `key` (absent or different) and the
    step budget: the other leg of a comparison of `key`."""
    mine = {k: v for k, v in ev.groups[group]["options"].items() if k not in BUDGET_KEYS | {key}}
    for g, spec in ev.groups.items():
        other = spec["options"]
        if g != group and other.get(key) != ev.groups[group]["options"].get(key) and \
                {k: v for k, v in other.items() if k not in BUDGET_KEYS | {key}} == mine:
            return g
    return None


def c7_training(ev) -> list[dict[str, Any]]:
    """Step p50 with cudnn.benchmark on and off (medians and ranges over repeats), per variant and GPU count."""
    out = []
    for on in ev.claim_groups("C7"):
        if not ev.groups[on]["options"].get("cudnn_benchmark"):
            continue
        off = _twin(ev, on, "cudnn_benchmark")
        if off is None:
            continue
        for variant in ev.groups[on]["variants"]:
            for gpus in ([1] if variant == "single" else ev.groups[on]["gpus"]):
                a, b = ev.rows(on, variant, gpus), ev.rows(off, variant, gpus)
                if a.empty or b.empty:
                    continue
                p_on, p_off = a["step_ms_p50"].median(), b["step_ms_p50"].median()
                out.append({"variant": variant, "gpus": gpus, "on_group": on, "off_group": off,
                            "p50_on_ms": p_on, "p50_off_ms": p_off, "ratio": p_on / p_off,
                            "ratio_lo": a["step_ms_p50"].min() / b["step_ms_p50"].max(),
                            "ratio_hi": a["step_ms_p50"].max() / b["step_ms_p50"].min(),
                            "repeats": min(len(a), len(b))})
    return out


@dataclass
class C7Training:
    """What C7's training runs decided, with the probe's step breakdowns at each setting."""
    verdict: str                         # the probe's where no DataParallel run on 2+ GPUs decided
    training: list[dict[str, Any]]       # per variant and GPU count: step p50 on and off
    cause_on: dict[str, Any] | None      # the C7 probe's breakdown with cudnn.benchmark on
    cause_off: dict[str, Any] | None
    slowest: dict[str, Any] | None = None   # the DataParallel entry that decides: the largest ratio


def from_training(ev, probe_verdict: str) -> C7Training:
    training = c7_training(ev)
    cause_on, cause_off = dp_step_cause(ev, "on"), dp_step_cause(ev, "off")
    dp = [t for t in training if t["variant"] == "dp" and t["gpus"] > 1]
    if not dp:
        return C7Training(probe_verdict, training, cause_on, cause_off)
    others_slow = any(t["ratio_lo"] > SLOWDOWN for t in training if t["variant"] != "dp")
    t = max(dp, key=lambda t: t["ratio"])
    if t["ratio_hi"] <= UNCHANGED:
        verdict = REFUTED
    elif t["ratio_lo"] > SLOWDOWN and not others_slow and probe_verdict in (CONFIRMED, NOT_RUN):
        verdict = CONFIRMED
    else:
        verdict = NUANCE  # slower, but mildly, within the repeats' spread, not DP's alone, or the thread mechanism not shown
    return C7Training(verdict, training, cause_on, cause_off, t)

