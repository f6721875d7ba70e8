"""Ledger findings that rest on the claims experiment's runs: C1, C8, and the training half of C6 and C7.

Every cell is measured over repeats; a difference counts only beyond the spread of those
repeats, or beyond a floor where the repeats agree closer than identical runs can (for memory:
one set of the run's gradients, sized from its config). Shares and floors are named constants
so that a verdict can be traced to the number that decided it. Verdicts state the conditions
they were measured under (from which output size, between which batches) and say nothing
about others.
"""
from __future__ import annotations

import math
from statistics import median
from typing import Any

import pandas as pd

from dpbench import DP_VARIANTS
from dpbench.analysis.collect import model_mib
from dpbench.analysis.tables import ratio_ci
from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.from_probes import c1_max_batch, probe_finding
from dpbench.claims.records import SINGLE_STAGES, STAGES, Finding, ProbeRecord, dp_step_id
from dpbench.plan.config import RunConfig

MIB = 2 ** 20
FEATURES = 512             # ResNet18's penultimate width (dpbench.run.model.FEATURES)
BACKBONE_PARAMS = 11_168_832   # ResNet18-CIFAR without its output layer; tests check both against the model
NOISE_FLOOR_MIB = 1.0      # below this a per-device difference is allocator granularity, not evidence
# Bytes of one parameter (and so of its gradient) per run precision: bf16 is autocast, which
# keeps the parameters in fp32.
PARAM_BYTES = {"fp32": 4, "bf16": 4}
OUTPUT_BYTES = {"fp32": 4, "bf16": 2}   # of the model's outputs: autocast's Linear returns bf16
GATHER_SHARE = 0.5         # the gathered outputs must explain this much of device 0's excess
THREAD_SHARE = 0.5         # ... and persistent threads this much of DP's time beyond a perfect split
FIRST_STEPS = 5            # steps compared before trajectories drift apart chaotically
CONFIDENCE = 0.95          # of the intervals on training differences
# A reduction's effect on the final loss whose whole interval lies within this share of the
# seed-to-seed spread (single's sd over seeds) is negligible in practice: changing the seed moves
# the loss four times as much, so no one training a single run could see it.
NEGLIGIBLE = 0.25
SLOWDOWN = 1.5             # benchmark-on step time over benchmark-off that counts as "much slower"
UNCHANGED = 1.1            # ... and the ratio under which it counts as no effect
# Options that set a run's length, not what it measures: groups differing only in these are twins.
BUDGET_KEYS = {"max_steps", "warmup_steps", "epochs", "eval_each_epoch", "eval_samples", "log_every"}


def param_count(num_classes: int = 10) -> int:
    """ResNet18-CIFAR's parameters with an output layer of num_classes (weights and biases)."""
    return BACKBONE_PARAMS + (FEATURES + 1) * num_classes


def grad_set_mib(num_classes: int, precision: str) -> float | None:
    """One set of the model's gradients in its parameter dtype (MiB); None for a precision whose
    parameter dtype is not known here."""
    size = PARAM_BYTES.get(precision)
    return None if size is None else param_count(num_classes) * size / MIB


def uneven_split(batch: int, gpus: int) -> bool:
    """Whether DataParallel's scatter (torch.chunk) gives devices different shares: 6 on 4 GPUs
    is 2/2/2 on three devices, an even split, though 6 % 4 != 0."""
    return len(set(chunk_sizes(batch, gpus))) > 1


def _multi_gpu(ev, groups: list[str]) -> int:
    return min((n for g in groups for n in ev.groups[g]["gpus"] if n > 1), default=2)


def _not_run(ev, groups: list[str]) -> Finding:
    return Finding(verdict=NOT_RUN, not_run=ev.not_run(_multi_gpu(ev, groups), groups),
                   measured_on=[ev.measured_on_runs()])


def _fmt_batch(b: float) -> str:
    return f"{b:,.0f}"


def _about(b: float) -> str:
    """An interpolated batch to two significant figures: "about 4,100", not "about 4,095"."""
    return f"{float(f'{b:.2g}'):,.0f}"


# -- C1: memory on device 0, as a function of the output size ------------------------------

def _device_mib(ev, run_id: str) -> pd.DataFrame:
    """Per device, each measure less the dataset resident there (collect's rule): allocated,
    reserved and NVML alike, so that no comparison counts the gpu feed's data as device 0's cost."""
    mem = ev.tables["memory"]
    rows = mem[mem["run_id"] == run_id]
    data = pd.to_numeric(rows["data_mib"], errors="coerce").fillna(0.0).to_numpy()
    out = pd.DataFrame({"allocated": [model_mib(r) for r in rows.to_dict("records")],
                        "reserved": pd.to_numeric(rows["reserved_mib"], errors="coerce").to_numpy() - data,
                        "nvml": pd.to_numeric(rows["nvml_used_mib"], errors="coerce").to_numpy() - data},
                       index=rows["device"].to_numpy())
    return out.dropna(subset=["allocated"]).sort_index()


def device0_excess_estimate(global_batch: int, gpus: int, num_classes: int = 10, precision: str = "fp32",
                            momentum: bool = True, loss_on_gathered: bool = True) -> dict[str, float]:
    """MiB that device 0 holds beyond the mean of the other devices at the end of the forward
    pass, item by item from sizes. The master weights are not among them: every other device
    holds a replica's copy while the step runs. The summed gradients are: the last step's stay
    until zero_grad, which follows the forward pass. With the loss on the gathered outputs
    (variant dp) device 0 also holds the whole batch's outputs and the loss's log-softmax of
    them (kept for backward, fp32); with the loss inside the replicas neither exists."""
    if precision not in OUTPUT_BYTES:
        raise ValueError(f"no sizes known for precision {precision!r} (known: {', '.join(sorted(OUTPUT_BYTES))}); "
                         f"add its bytes to PARAM_BYTES and OUTPUT_BYTES in dpbench.claims.from_runs")
    weights = param_count(num_classes) * PARAM_BYTES[precision] / MIB
    sample = (3 * 32 * 32 * 4 + 8) / MIB                  # one image and its int64 label
    own = -(-global_batch // gpus)                         # scatter gives device 0 the largest chunk
    others = (global_batch - own) / (gpus - 1)
    out_bytes = OUTPUT_BYTES[precision]
    logits = global_batch * num_classes / MIB
    return {"summed_grads": weights,
            "momentum": weights if momentum else 0.0,
            # the global batch arrives on device 0 and stays there; its own chunk is a view of it
            "input_batch": (global_batch - others) * sample,
            "gathered_logits": logits * out_bytes if loss_on_gathered else 0.0,
            "loss_log_softmax": logits * 4 if loss_on_gathered else 0.0}


def _c1_run(ev, rid: str) -> dict[str, Any] | None:
    """One run's devices: device 0 against the mean of the others, and every device's allocation."""
    mib = _device_mib(ev, rid)
    if 0 not in mib.index or len(mib) < 2:
        return None
    others = mib.drop(index=0)
    return {"run_id": rid, "dev0": mib.loc[0].to_dict(), "others": others.mean().to_dict(),
            "excess": mib.loc[0, "allocated"] - others["allocated"].mean(),
            "allocated": mib["allocated"].to_dict(), "config": ev.run_config(rid)}


def _alike_spread(variant: str, per_run: list[dict]) -> float:
    """Spread of allocated memory over the devices that should hold the same, pooled over every
    repeat: all of a DDP run's ranks; DataParallel's devices other than 0. Identical runs differ
    by whole buffers (a gradient set allocated at the peak or not), and which rank holds it
    changes between repeats: one run's ranks alone can agree to the byte."""
    vals = [m for r in per_run for d, m in r["allocated"].items() if variant == "ddp" or d != 0]
    return max(vals) - min(vals) if vals else 0.0


def _c1_cell(group: str, variant: str, gpus: int, per_run: list[dict]) -> dict[str, Any]:
    excess = [r["excess"] for r in per_run]
    cfg = per_run[0]["config"]
    cell = {"group": group, "variant": variant, "gpus": gpus, "repeats": len(per_run),
            "run_ids": [r["run_id"] for r in per_run],
            "excess_mib": median(excess), "repeat_spread_mib": max(excess) - min(excess),
            "alike_spread_mib": _alike_spread(variant, per_run),
            **{f"dev0_{k}_mib": median(r["dev0"][k] for r in per_run) for k in ("allocated", "reserved", "nvml")},
            **{f"others_{k}_mib": median(r["others"][k] for r in per_run) for k in ("allocated", "reserved", "nvml")},
            "config_found": cfg is not None}
    if cfg is None:
        return cell
    # a key the record lacks is RunConfig's default, which the run trained with
    cell.update(num_classes=int(cfg.get("num_classes", RunConfig.num_classes)),
                precision=cfg.get("precision", RunConfig.precision),
                global_batch=int(cfg.get("global_batch", RunConfig.global_batch)),
                momentum=float(cfg.get("momentum", RunConfig.momentum)))
    cell["params"] = param_count(cell["num_classes"])
    cell["grad_set_mib"] = grad_set_mib(cell["num_classes"], cell["precision"])
    if variant in DP_VARIANTS and cell["precision"] not in OUTPUT_BYTES:
        cell["unsized"] = f"no sizes known for precision {cell['precision']!r}"
    elif variant in DP_VARIANTS:
        est = device0_excess_estimate(cell["global_batch"], gpus, cell["num_classes"],
                                      cell["precision"], cell["momentum"] > 0, variant == "dp")
        cell.update(estimate_mib=est, estimate_total_mib=sum(est.values()),
                    logits_estimate_mib=est["gathered_logits"] + est["loss_log_softmax"])
    return cell


def _same_model(a: dict, b: dict) -> bool:
    return "num_classes" in a and "num_classes" in b and \
        (a["num_classes"], a["precision"]) == (b["num_classes"], b["precision"])


def _set_noise(c: dict, cells: list[dict]) -> None:
    """A cell's noise: the largest of what identical runs showed (its repeats, its alike devices
    over the repeats, the DDP ranks over the repeats of its group or of the same model on as many
    GPUs) and, where the run's config sizes it, one set of the model's gradients: identical runs
    swing by that much, gradients allocated or not at the moment of the peak."""
    ddp = [d["alike_spread_mib"] for d in cells if d["variant"] == "ddp" and d["gpus"] == c["gpus"]
           and (d["group"] == c["group"] or _same_model(d, c))]
    terms = {"repeats": c["repeat_spread_mib"], "alike devices": c["alike_spread_mib"],
             "DDP ranks x repeats": max(ddp, default=0.0), "one gradient set": c.get("grad_set_mib") or 0.0,
             "allocator floor": NOISE_FLOOR_MIB}
    c["noise_terms"] = terms
    c["noise_basis"] = max(terms, key=terms.get)
    c["noise_mib"] = terms[c["noise_basis"]]


def _c1_cells(ev, groups: list[str]) -> list[dict[str, Any]]:
    """One cell per (group, variant, gpus): medians over repeats of device 0 against the others."""
    cells = []
    for g in groups:
        summ = ev.rows(g)
        for (variant, gpus), runs in summ[summ["gpus"] > 1].groupby(["variant", "gpus"]):
            if variant not in (*DP_VARIANTS, "ddp"):
                continue
            per_run = [r for r in (_c1_run(ev, rid) for rid in runs["run_id"]) if r is not None]
            if per_run:
                cells.append(_c1_cell(g, variant, int(gpus), per_run))
    for c in cells:
        _set_noise(c, cells)
        c["ratio"] = c["dev0_allocated_mib"] / c["others_allocated_mib"] if c["others_allocated_mib"] else math.nan
    return cells


def _gathered(cell: dict, cells: list[dict]) -> dict[str, Any]:
    """How much of a dp cell's excess the gathered outputs explain, and the noise of that part:
    measured as dp's excess less that of DataParallel with the loss inside the replicas (same
    group; the sum of both cells' noise), else from sizes (dp's noise)."""
    twin = [c for c in cells if c["group"] == cell["group"] and c["gpus"] == cell["gpus"]
            and c["variant"] in ("dp_sum", "dp_mean")]
    none = {"gathered_share": None, "gathered_mib": None, "gathered_noise_mib": cell["noise_mib"]}
    if cell["excess_mib"] <= 0:
        return {**none, "share_basis": "no excess"}
    if twin:
        # a difference of two cells carries both cells' noise
        part, noise, basis = (cell["excess_mib"] - twin[0]["excess_mib"], cell["noise_mib"] + twin[0]["noise_mib"],
                              f"measured against {twin[0]['variant']}")
    elif "logits_estimate_mib" in cell:
        part, noise, basis = cell["logits_estimate_mib"], cell["noise_mib"], "estimated from sizes"
    else:
        return {**none, "share_basis": cell.get("unsized", "no run config (metrics.json) to size the outputs")}
    return {"gathered_share": part / cell["excess_mib"], "gathered_mib": part, "gathered_noise_mib": noise,
            "share_basis": basis}


def _judge(c: dict, cells: list[dict]) -> None:
    """A dp cell's excess is evidence beyond its noise; the article's reason holds there when the
    gathered outputs' part is beyond its noise too and most of the excess."""
    c.update(_gathered(c, cells))
    c["above_noise"] = bool(c["excess_mib"] > c["noise_mib"])
    c["attributable"] = c["gathered_mib"] is not None and bool(c["gathered_mib"] > c["gathered_noise_mib"]) \
        and bool(c["gathered_share"] >= GATHER_SHARE)
    c["outputs_dominate"] = c["above_noise"] and c["attributable"]


def _noise_text(c: dict[str, Any]) -> str:
    t = c["noise_terms"]
    grad = (f"one gradient set {t['one gradient set']:.1f} ({c['params']:,} parameters in "
            f"{PARAM_BYTES[c['precision']] * 8}-bit: identical runs differ by whether it is allocated at the peak)"
            if c.get("grad_set_mib") else "one gradient set not sized (no run config or unknown precision)")
    return (f"noise {c['noise_mib']:.1f} MiB = the largest of: spread over repeats {t['repeats']:.1f}, over alike "
            f"devices and repeats {t['alike devices']:.1f}, over DDP ranks and repeats {t['DDP ranks x repeats']:.1f}, "
            f"{grad}, allocator floor {t['allocator floor']:.1f}")


def _c1_line(c: dict[str, Any]) -> str:
    head = (f"{c['variant']} on {c['gpus']} GPUs, batch {c.get('global_batch', '?')}, "
            f"{c.get('num_classes', '?')} outputs ({c.get('precision', '?')}), {c['repeats']} repeats: ")
    alloc = (f"allocated less resident data, device 0 {c['dev0_allocated_mib']:.1f} MiB vs others "
             f"{c['others_allocated_mib']:.1f}: {c['excess_mib']:+.1f} MiB ({c['ratio']:.2f}x)")
    if c["variant"] == "ddp":
        alloc = (f"allocated less resident data per rank {c['dev0_allocated_mib']:.1f} / "
                 f"{c['others_allocated_mib']:.1f} MiB (spread over ranks and repeats {c['alike_spread_mib']:.1f} MiB)")
    extra = [f"reserved less resident data {c['dev0_reserved_mib']:.0f} vs {c['others_reserved_mib']:.0f} MiB"]
    if not math.isnan(c["dev0_nvml_mib"]):
        extra.append(f"NVML less resident data {c['dev0_nvml_mib']:.0f} vs {c['others_nvml_mib']:.0f} MiB")
    line = head + alloc + "; " + _noise_text(c) + "; " + ", ".join(extra)
    if "estimate_mib" in c:
        e = c["estimate_mib"]
        parts = " + ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in e.items() if v)
        line += f"; from sizes (this run's classes, dtype, momentum): {parts} = {c['estimate_total_mib']:.1f} MiB"
    if c.get("gathered_share") is not None:
        line += (f"; gathered outputs {c['gathered_mib']:+.1f} MiB = {c['gathered_share']:.0%} of the excess "
                 f"({c['share_basis']}; noise {c['gathered_noise_mib']:.1f} MiB)")
    return line


def _with_max_batch(ev, f: Finding) -> Finding:
    """C1's runs measure memory at fixed batches; the probe (dpbench.claims.c1_max_batch) what
    that costs in batch. Its numbers join the evidence and the summary; its verdict counts only
    where no run measured memory."""
    if "C1" not in ev.probes:
        return f
    p = probe_finding(ev, "C1", c1_max_batch)
    f.evidence += p.evidence
    f.measured_on += p.measured_on
    f.data["probe"] = p.data.get("probe")
    if p.verdict == NOT_RUN:
        return f
    if f.verdict == NOT_RUN:
        f.evidence.insert(0, f.not_run or NOT_RUN)
        f.verdict, f.summary, f.not_run = p.verdict, p.summary, None
    else:
        f.summary = f"{f.summary}; {p.summary}"
    return f


def c1(ev) -> Finding:
    return _with_max_batch(ev, _c1_from_runs(ev))


def _sweeps(dp: list[dict]) -> list[list[dict]]:
    """dp cells grouped by what an output-size sweep holds fixed (batch, GPUs, precision), each
    sorted by output size."""
    by: dict[tuple, list[dict]] = {}
    for c in dp:
        by.setdefault((c.get("global_batch", 0), c["gpus"], str(c.get("precision", "?"))), []).append(c)
    return [sorted(v, key=lambda c: c.get("num_classes", 0)) for _, v in sorted(by.items())]


def _onset(sweep: list[dict]) -> tuple[dict | None, bool]:
    """The smallest output size measured from which the gathered outputs dominate device 0's
    excess at every larger size of the sweep (None where the largest does not), and whether the
    sweep is that clean: no size below the onset dominated (an effect that comes and goes with
    the output size states no condition)."""
    first = None
    for c in reversed(sweep):
        if not c["outputs_dominate"]:
            break
        first = c
    below = sweep[:sweep.index(first)] if first else sweep
    return first, not any(c["outputs_dominate"] for c in below)


def _size_text(c: dict) -> str:
    """One output size: is device 0's excess beyond noise, and is it the gathered outputs?"""
    n = f"{c['num_classes']:,} outputs" if "num_classes" in c else f"{c['group']} (no run config)"
    head = f"at {n} {c['excess_mib']:+.0f} MiB ({c['ratio']:.2f}x)"
    if not c["above_noise"]:
        return f"{head}, within noise ({c['noise_mib']:.0f} MiB)"
    if c["gathered_share"] is None:
        return f"{head} beyond noise ({c['noise_mib']:.0f} MiB), not attributed ({c['share_basis']})"
    part = (f"the gathered outputs {c['gathered_mib']:+.0f} MiB, {c['gathered_share']:.0%} of it "
            f"({c['share_basis']}, noise {c['gathered_noise_mib']:.0f} MiB)")
    if c["outputs_dominate"]:
        return f"{head} beyond noise ({c['noise_mib']:.0f} MiB), {part}"
    return (f"{head} beyond noise ({c['noise_mib']:.0f} MiB), mostly not the outputs: {part}; the rest, from "
            f"sizes, is the summed gradients, the optimizer state and the input batch")


def _sweep_text(sweep: list[dict], first: dict | None) -> str:
    c0 = sweep[0]
    at = f"batch {c0.get('global_batch', '?')} on {c0['gpus']} GPUs, {c0.get('precision', '?')}"
    if first is None:
        return f"{at}: " + "; ".join(_size_text(c) for c in sweep)
    i = sweep.index(first)
    text = (f"from {first.get('num_classes', 0):,} outputs at {at}: " + "; ".join(_size_text(c) for c in sweep[i:]))
    if i:
        text += "; below that, " + "; ".join(_size_text(c) for c in sweep[:i])
    return text


def _c1_verdict(dp: list[dict], onsets: list[tuple[dict | None, bool]]) -> str:
    """Refuted where device 0 is nowhere heavier beyond noise; confirmed where, in a sweep of the
    output size, the gathered outputs dominate from some size on (the condition the summary
    states) and no sweep has them come and go; needs nuance otherwise."""
    if not any(c["above_noise"] for c in dp):
        return REFUTED
    if any(first for first, _ in onsets) and all(clean for _, clean in onsets):
        return CONFIRMED
    return NUANCE


def _c1_advice(verdict: str, sweeps: list[list[dict]], onsets: list[tuple[dict | None, bool]]) -> str | None:
    """Advice that follows what was measured; None (the standing, neutral advice) where no condition was found."""
    starts = [(s, first) for s, (first, _) in zip(sweeps, onsets) if first]
    if verdict == CONFIRMED:
        d = starts[0][1]
        return (f"With a wide output (here from {d.get('num_classes', 0):,} outputs at batch {d.get('global_batch', '?')}) "
                f"compute the loss inside the replicas and return per-replica sums divided by the global batch "
                f"(dpbench's dp_sum), or use DDP: device 0 then no longer holds the whole batch's outputs. "
                f"Below that, device 0's extra is the summed gradients, the optimizer state and the input batch; "
                f"size the batch for it.")
    if verdict == NUANCE and sweeps and not any(c["outputs_dominate"] for s in sweeps for c in s):
        widest = max((c for s in sweeps for c in s), key=lambda c: c.get("num_classes", 0))
        return (f"Size the batch for device 0: besides its share of activations it keeps the summed gradients, the "
                f"optimizer state (one model-sized buffer for SGD with momentum, two for Adam) and the whole input "
                f"batch. Up to the widest output measured here ({widest.get('num_classes', '?'):,} outputs at batch "
                f"{widest.get('global_batch', '?')}) the gathered outputs were not the larger part of it; they grow "
                f"with batch x outputs. DDP keeps these evenly on every rank.")
    return None


def ddp_vs_dp_device0(cells: list[dict]) -> list[dict[str, Any]]:
    """Per group with both: a DDP rank's allocated peak (the mean of its ranks) against DP's
    device 0, which DDP's every rank resembles (the whole model, its gradients and optimizer
    state), and whether the difference lies beyond the two cells' noise added up."""
    out = []
    for c in cells:
        same = [d for d in cells if d["variant"] == "dp" and (d["group"], d["gpus"]) == (c["group"], c["gpus"])]
        if c["variant"] != "ddp" or not same:
            continue
        d = same[0]
        rank = (c["dev0_allocated_mib"] + (c["gpus"] - 1) * c["others_allocated_mib"]) / c["gpus"]
        diff, noise = rank - d["dev0_allocated_mib"], c["noise_mib"] + d["noise_mib"]
        out.append({"group": c["group"], "gpus": c["gpus"], "num_classes": c.get("num_classes"),
                    "ddp_rank_mib": rank, "dp_dev0_mib": d["dev0_allocated_mib"], "dp_others_mib": d["others_allocated_mib"],
                    "diff_mib": diff, "noise_mib": noise,
                    "call": "higher" if diff > noise else "lower" if diff < -noise else "within noise"})
    return out


def _rank_text(r: dict[str, Any]) -> str:
    at = f"{r['num_classes']:,} outputs" if r["num_classes"] is not None else r["group"]
    beyond = "within noise" if r["call"] == "within noise" else f"{r['call']} beyond noise"
    return f"at {at} {r['diff_mib']:+.0f} MiB, {beyond} ({r['noise_mib']:.0f} MiB)"


def _c1_from_runs(ev) -> Finding:
    groups = ev.claim_groups("C1")
    cells = _c1_cells(ev, groups)
    dp = [c for c in cells if c["variant"] == "dp"]
    if not dp:
        return _not_run(ev, groups)
    for c in dp:
        _judge(c, cells)
    # An output-size sweep needs each cell's size: cells without a run config (metrics.json)
    # join the evidence lines, not the sweeps, their onsets or the advice.
    sized = [c for c in dp if "num_classes" in c]
    sweeps = _sweeps(sized)
    onsets = [_onset(s) for s in sweeps]
    verdict = _c1_verdict(dp, onsets)
    heads = {CONFIRMED: "the article is right ",
             NUANCE: "device 0 is heavier beyond noise, but the gathered outputs do not (cleanly) explain it: ",
             REFUTED: "device 0 holds no more than the others beyond noise: "}
    # "right" leads only the sweeps where it is; the others say what they showed
    texts = [(heads[CONFIRMED] if verdict == CONFIRMED and first else "") + _sweep_text(s, first)
             for s, (first, _) in zip(sweeps, onsets)]
    if len(sized) < len(dp):
        texts.append(f"{len(dp) - len(sized)} dp cell(s) without a run config: not placed on the output-size sweep")
    parts = [("" if verdict == CONFIRMED else heads[verdict]) + " | ".join(texts)]
    inside = [c for c in cells if c["variant"] in ("dp_sum", "dp_mean")]
    if inside:
        worst = max(inside, key=lambda c: c["excess_mib"])
        parts.append(f"loss inside the replicas: at most {worst['excess_mib']:+.0f} MiB ({worst['ratio']:.2f}x)")
    reserved = [c["dev0_reserved_mib"] / c["others_reserved_mib"] for c in dp if c["others_reserved_mib"] > 0]
    if reserved:
        parts.append(f"reserved memory less resident data (what nvidia-smi sees, less the context) device 0 / others "
                     f"{min(reserved):.2f}-{max(reserved):.2f}x")
    ddp = [c for c in cells if c["variant"] == "ddp"]
    if ddp:
        parts.append("DDP ranks within " + f"{max(c['alike_spread_mib'] for c in ddp):.1f} MiB of each other "
                     "over ranks and repeats")
    grads = sorted({round(c["grad_set_mib"], 1) for c in dp if c.get("grad_set_mib")})
    if grads:
        parts.append(f"noise at least one gradient set ({', '.join(f'{g:.1f}' for g in grads)} MiB)")
    ranks = ddp_vs_dp_device0(cells)
    if ranks:
        parts.append("each DDP rank against DP's device 0 (allocated less resident data): "
                     + "; ".join(_rank_text(r) for r in ranks))
    lines = [_c1_line(c) for c in cells]
    lines += [f"{r['group']}: each DDP rank peaks at {r['ddp_rank_mib']:.0f} MiB allocated (the ranks' mean), DP's "
              f"device 0 at {r['dp_dev0_mib']:.0f} MiB and its other devices at {r['dp_others_mib']:.0f} MiB: "
              f"{_rank_text(r)}" for r in ranks]
    conditions = [{"batch": s[0].get("global_batch"), "gpus": s[0]["gpus"], "precision": s[0].get("precision"),
                   "outputs": [c.get("num_classes") for c in s],
                   "from_outputs": first.get("num_classes") if first else None, "clean": clean}
                  for s, (first, clean) in zip(sweeps, onsets)]
    return Finding(verdict=verdict, summary="; ".join(parts), evidence=lines,
                   data={"cells": cells, "conditions": conditions, "ddp_vs_dp": ranks}, runs_used=True,
                   advice=_c1_advice(verdict, sweeps, onsets), measured_on=[ev.measured_on_runs()])


# -- C6: reductions in training, with statistics -------------------------------------------

def chunk_sizes(n: int, parts: int) -> list[int]:
    """torch.chunk's split of n samples into `parts` (DataParallel's scatter), without torch."""
    size = -(-n // parts)
    sizes = [size] * (n // size)
    return sizes + ([n % size] if n % size else [])


def reweighting(n: int, parts: int) -> dict[str, Any]:
    """Mean of per-replica means: each sample's weight relative to the true mean's 1/n."""
    chunks = chunk_sizes(n, parts)
    rel = [n / (len(chunks) * c) - 1 for c in chunks]
    return {"batch": n, "chunks": chunks, "relative_weight": rel, "max_abs": max(abs(r) for r in rel)}


def _interval(values: list[float]) -> dict[str, float]:
    """Mean and its two-sided confidence interval (Student's t) over paired differences."""
    from scipy import stats

    n = len(values)
    m = sum(values) / n
    if n < 2:
        return {"mean": m, "lo": math.nan, "hi": math.nan, "n": n, "sd": math.nan}
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n, "sd": sd}


def practical_size(ci: dict[str, float], seed_sd: float) -> dict[str, Any]:
    """An effect's interval as shares of the seed-to-seed sd (the sd taken as known: it comes
    from as few seeds), and whether the whole interval lies within NEGLIGIBLE of it (None where
    there is no interval or no spread to weigh it against)."""
    if ci["n"] < 2 or not seed_sd > 0:
        return {"share": math.nan, "share_lo": math.nan, "share_hi": math.nan, "negligible": None}
    largest = max(abs(ci["lo"]), abs(ci["hi"]))
    return {"share": ci["mean"] / seed_sd, "share_lo": ci["lo"] / seed_sd, "share_hi": ci["hi"] / seed_sd,
            "negligible": bool(largest < NEGLIGIBLE * seed_sd)}


def _excludes_zero(ci: dict[str, float]) -> bool:
    return ci["n"] >= 2 and (ci["lo"] > 0 or ci["hi"] < 0)


def _steps(ev, run_id: str) -> pd.DataFrame:
    st = ev.tables["steps"]
    return st[st["run_id"] == run_id].sort_values(["epoch", "step"])[["epoch", "step", "loss_global"]]


def _loss_gap(base: pd.DataFrame, other: pd.DataFrame) -> dict[str, Any]:
    m = base.merge(other, on=["epoch", "step"], suffixes=("_a", "_b"))
    gap = (m["loss_global_a"] - m["loss_global_b"]).abs()
    if gap.empty:
        return {"first_steps_max": math.nan, "all_steps_max": math.nan, "steps": 0, "by_step": []}
    return {"first_steps_max": float(gap.head(FIRST_STEPS).max()), "all_steps_max": float(gap.max()),
            "steps": int(len(gap)), "by_step": [float(g) for g in gap]}


def _seed_of(ev, row) -> Any:
    cfg = ev.run_config(row.run_id)
    return cfg.get("seed", row.repeat) if cfg else f"repeat {row.repeat}"


def c6_training(ev) -> list[dict[str, Any]]:
    """Per C6 group on an uneven split: paired (same seed) differences of final loss and test
    accuracy between the reductions and one device, over the repeats."""
    out = []
    for g in ev.claim_groups("C6"):
        single = ev.rows(g, "single", 1)
        if single.empty:
            continue
        batch = int(single["global_batch"].iloc[0])
        for gpus in sorted(set(ev.groups[g]["gpus"]) - {1}):
            runs = {"single": single, **{v: ev.rows(g, v, gpus) for v in ("dp_mean", "dp_sum")}}
            if any(r.empty for r in runs.values()):
                continue
            by_seed = {v: {_seed_of(ev, r): r for r in rows.itertuples()} for v, rows in runs.items()}
            seeds = sorted(set.intersection(*(set(s) for s in by_seed.values())), key=str)
            if not seeds:
                continue
            diffs: dict[str, dict[str, list[float]]] = {}
            for a, b in (("dp_mean", "single"), ("dp_sum", "single"), ("dp_mean", "dp_sum")):
                for metric in ("final_loss", "test_acc"):
                    vals = [float(getattr(by_seed[a][s], metric)) - float(getattr(by_seed[b][s], metric))
                            for s in seeds]
                    diffs.setdefault(f"{a}-{b}", {})[metric] = [v for v in vals if not math.isnan(v)]
            gaps = {v: [_loss_gap(_steps(ev, by_seed["single"][s].run_id), _steps(ev, by_seed[v][s].run_id))
                        for s in seeds] for v in ("dp_mean", "dp_sum")}
            deterministic = [bool((ev.run_config(r.run_id) or {}).get("deterministic")) for r in single.itertuples()]
            spread = {m: _interval([float(getattr(by_seed["single"][s], m)) for s in seeds]) for m in ("final_loss", "test_acc")}
            out.append({"group": g, "gpus": gpus, "batch": batch, "uneven": uneven_split(batch, gpus),
                        "bn_eval": ev.groups[g]["options"].get("batchnorm") == "eval",
                        "deterministic": all(deterministic), "seeds": [str(s) for s in seeds],
                        "reweighting": reweighting(batch, gpus),
                        "intervals": {pair: {m: _interval(v) for m, v in d.items() if v} for pair, d in diffs.items()},
                        "single_spread": spread,
                        "first_steps_gap": {v: median(x["first_steps_max"] for x in gs) for v, gs in gaps.items()},
                        "gaps_first_seed": {v: gs[0] for v, gs in gaps.items()}})
    return out


def _ci_text(ci: dict[str, float], scale: float = 1.0, unit: str = "") -> str:
    if ci["n"] < 2:
        return f"{ci['mean'] * scale:+.3g}{unit} (n=1, no interval)"
    return (f"{ci['mean'] * scale:+.3g}{unit} [{ci['lo'] * scale:+.3g}, {ci['hi'] * scale:+.3g}] "
            f"({CONFIDENCE:.0%} CI, {ci['n']} seeds)")


def _with_training(ev, f: Finding, verdict: str, text: str) -> Finding:
    """A probe's finding once training runs decided: their text follows the probe's summary (or
    replaces it where the probe did not run, whose reason then leads the evidence), and the
    verdict is the one decided with them."""
    if f.not_run:
        f.evidence.insert(0, f.not_run)
        f.summary = text
    else:
        f.summary = f"{f.summary}; {text}"
    f.measured_on.append(ev.measured_on_runs())
    f.verdict, f.not_run, f.runs_used = verdict, None, True
    return f


def _c6_line(t: dict[str, Any]) -> str:
    iv = t["intervals"]
    w = t["reweighting"]
    out = [f"training {t['group']}, batch {t['batch']} on {t['gpus']} GPUs (chunks {'/'.join(map(str, w['chunks']))}), "
           f"{'deterministic' if t['deterministic'] else 'not deterministic'}, seeds {', '.join(t['seeds'])}: "
           f"mean of means reweights samples by up to {w['max_abs']:.2%}"]
    for pair, d in iv.items():
        parts = []
        if "final_loss" in d:
            parts.append(f"final loss {_ci_text(d['final_loss'])}")
        if "test_acc" in d:
            parts.append(f"test accuracy {_ci_text(d['test_acc'], 100, ' pp')}")
        out.append(f"{pair.replace('-', ' - ')}: " + ", ".join(parts))
    sp = t["single_spread"]
    out.append(f"seed-to-seed spread of single: final loss sd {sp['final_loss']['sd']:.3g}, test accuracy sd "
               f"{sp['test_acc']['sd'] * 100:.3g} pp")
    g = t["first_steps_gap"]
    out.append(f"max |loss - single| over the first {FIRST_STEPS} steps (median over seeds): dp_mean "
               f"{g['dp_mean']:.3g} vs dp_sum {g['dp_sum']:.3g}")
    return "; ".join(out[:1]) + "\n  - " + "\n  - ".join(out[1:])


def c6(ev) -> Finding:
    f = probe_finding(ev, "C6", _c6_summary)
    training = c6_training(ev)
    groups = ev.claim_groups("C6")
    decisive = [t for t in training if t["uneven"]]
    decisive = [t for t in decisive if t["bn_eval"]] or decisive  # BN eval isolates the reduction
    f.evidence += [_c6_line(t) for t in training]
    f.data["training"] = training
    if not decisive:
        need = min((n for g in groups for n in ev.groups[g]["gpus"]
                    if uneven_split(int(ev.groups[g]["options"].get("global_batch", RunConfig.global_batch)), n)),
                   default=2)
        f.evidence.append(f"training runs on an uneven split: {ev.not_run(need, groups)}")
        return f
    t = decisive[0]
    loss = t["intervals"]["dp_mean-dp_sum"].get("final_loss", {"n": 0, "mean": math.nan})
    acc = t["intervals"]["dp_mean-dp_sum"].get("test_acc", {"n": 0, "mean": math.nan})
    measurable = _excludes_zero(loss) if loss["n"] else False
    seeds = t["single_spread"]["final_loss"]
    size = practical_size(loss, seeds["sd"]) if loss["n"] else practical_size({"n": 0}, math.nan)
    t["practical"] = size
    # confirmed: told apart from zero and not negligible against what changing the seed does
    # (with no seed-to-seed spread to weigh it against, its size in practice is unknown: nuance)
    verdict = CONFIRMED if measurable and size["negligible"] is False else NUANCE
    if f.verdict not in (CONFIRMED, NOT_RUN):
        verdict = f.verdict  # training cannot rescue a probe that saw no bias
    w = t["reweighting"]
    against = (f", {size['share']:+.2f}x [{size['share_lo']:+.2f}, {size['share_hi']:+.2f}] the seed-to-seed sd of "
               f"single's final loss ({seeds['sd']:.3g} over {seeds['n']} seeds)" if size["negligible"] is not None
               else ", no seed-to-seed spread to weigh it against")
    if not measurable:
        call = "no effect told apart from zero at this size"
    elif size["negligible"]:
        call = (f"measurable but negligible in practice: the whole interval within {NEGLIGIBLE:.2g}x of what "
                f"changing the seed does")
    elif size["negligible"] is None:
        call = "a measurable effect, its practical size not weighed"
    else:
        call = (f"a measurable effect, and not negligible: beyond {NEGLIGIBLE:.2g}x of what changing the seed does")
    text = (f"in training ({t['batch']} on {t['gpus']} GPUs, {'/'.join(map(str, w['chunks']))}: weights off by "
            f"{w['max_abs']:.2%}) dp_mean - dp_sum final loss {_ci_text(loss) if loss['n'] else 'n/a'}"
            f"{against if loss['n'] else ''}, test accuracy {_ci_text(acc, 100, ' pp') if acc['n'] else 'n/a'}: {call}")
    return _with_training(ev, f, verdict, text)


def _c6_summary(p: ProbeRecord) -> str:
    arith = p.values("c6.article_example")
    emu = p.values("c6.cpu.bn_eval.batch128_split3")
    text = (f"[0.3, 0.2, 0.8]: {arith.get('one device mean', {}).get('value')} on one device, "
            f"{arith.get('mean of per-device means', {}).get('value')} as mean of means, "
            f"{arith.get('sum / N', {}).get('value')} as sum/N")
    if emu:
        text += (f"; 128 on 3 (43/43/42) gradient off by {emu['grad_rel_diff_mean_of_means']:.2g} (mean of means) vs "
                 f"{emu['grad_rel_diff_sum_over_n']:.2g} (sum/N), CPU emulation")
    for o in p.with_prefix("c6.gpu."):
        if len(set(o.get("chunks", []))) > 1:
            text += (f"; DataParallel batch {o.get('batch')} on {o.get('gpus')} GPUs: "
                     f"{o.get('grad_rel_diff_dp_mean_vs_single'):.2g} vs {o.get('grad_rel_diff_dp_sum_vs_single'):.2g}")
    return text


# -- where DataParallel's time goes (the C7 probe's step breakdown) -------------------------

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


def _growth_text(g: dict[str, Any]) -> str:
    (ba, bb), (oa, ob) = g["batches"], g["overhead_ms"]
    if g["grows"]:
        return (f"DataParallel's time beyond a perfect split of one GPU's step grew from {oa:.1f} ms a step at batch "
                f"{_fmt_batch(ba)} to {ob:.1f} ms at {_fmt_batch(bb)}, beyond the steps' ranges: part of it grows with "
                f"the images a step (the data moved), which a larger batch does not spread")
    return (f"DataParallel's time beyond a perfect split of one GPU's step was {oa:.1f} ms a step at batch "
            f"{_fmt_batch(ba)} and {ob:.1f} ms at {_fmt_batch(bb)}: it does not grow with the batch beyond the steps' "
            f"ranges, so it is a cost per step, which a larger batch spreads over more images")


def _saving_text(c: dict[str, Any]) -> str:
    t = c["threads"]
    noise = {True: "beyond the step-to-step range of both", False: "within the step-to-step range",
             None: "no step-to-step range recorded"}[t["beyond_noise"]]
    return (f"persistent threads save {t['saving_ms']:.1f} ms a step ({noise}), {t['share']:.0%} of stock DP's "
            f"{t['overhead_ms']:.1f} ms beyond a perfect split of one GPU's step")


def _excess_text(c: dict[str, Any]) -> str:
    """'replicate +3.2 ms a step beyond one GPU's share of the same work (of 22.1 ms over all stages)'"""
    s = c["largest_excess_stage"]
    return (f"{s.replace('_', ' ')} {c['excess'][s]:+.1f} ms a step beyond one GPU's share of the same work "
            f"(all stages {sum(c['excess'].values()):+.1f} ms)")


def _cause_text(c: dict[str, Any]) -> str:
    head = (f"batch {c['batch']} on {c['gpus']} GPUs, cudnn.benchmark {c['benchmark']}: one GPU {c['single_ms']:.1f} ms "
            f"a step, stock DP {c['dp_ms']:.1f} ms ({c['dp_speedup']:.2f}x), DP on persistent replica threads "
            f"{c['dp_persistent_ms']:.1f} ms ({c['dp_persistent_speedup']:.2f}x); {_saving_text(c)}")
    st = c["stages"]
    stage_text = "stock step by stage (ms): " + ", ".join(f"{k.replace('_', ' ')} {st[k]:.1f}" for k in STAGES if k in st)
    if c["single_stages"]:
        stage_text += "; one GPU's: " + ", ".join(f"{k} {c['single_stages'][k]:.1f}" for k in SINGLE_STAGES
                                                   if k in c["single_stages"])
    if c["threads_are_the_cost"]:
        return (f"{head}: the cost is starting new replica threads every step (each new thread sets up its "
                f"cuDNN/cuBLAS state again), not scatter, replication or gather; {stage_text}")
    if c["largest_excess_stage"] is None:
        return f"{head}; no breakdown of one GPU's step recorded, no stage named; {stage_text}"
    return f"{head}; largest excess: {_excess_text(c)}; {stage_text}"


def _cause_summary(c: dict[str, Any]) -> str:
    """C8's cause in a few words, at the breakdown's batch."""
    if c["threads_are_the_cost"]:
        what = "fresh replica threads every step"
    elif c["largest_excess_stage"] is None:
        what = "not named (no breakdown of one GPU's step)"
    else:
        what = "largest excess over one GPU's share: " + _excess_text(c)
    return (f"cause: {what} (DP on persistent threads {c['dp_persistent_speedup']:.2f}x one GPU at batch "
            f"{c['batch']}, stock {c['dp_speedup']:.2f}x)")


# -- C7: cudnn.benchmark under DataParallel -----------------------------------------------

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


def c7(ev) -> Finding:
    f = probe_finding(ev, "C7", _c7_summary)
    training = c7_training(ev)
    f.evidence += [
        f"training {t['variant']} on {t['gpus']} GPU(s): step p50 {t['p50_on_ms']:.1f} ms with benchmark on "
        f"({t['on_group']}), {t['p50_off_ms']:.1f} ms off ({t['off_group']}): {t['ratio']:.2f}x "
        f"(over {t['repeats']} repeats {t['ratio_lo']:.2f}-{t['ratio_hi']:.2f}x)" for t in training]
    f.data["training"] = training
    cause_on, cause_off = dp_step_cause(ev, "on"), dp_step_cause(ev, "off")
    f.data["dp_step"] = {"on": cause_on, "off": cause_off}
    dp = [t for t in training if t["variant"] == "dp" and t["gpus"] > 1]
    groups = ev.claim_groups("C7")
    if not dp:
        f.evidence.append(f"training runs: {ev.not_run(_multi_gpu(ev, groups), groups)}")
        return f
    others_slow = any(t["ratio_lo"] > SLOWDOWN for t in training if t["variant"] != "dp")
    t = max(dp, key=lambda t: t["ratio"])
    if t["ratio_hi"] <= UNCHANGED:
        verdict = REFUTED
    elif t["ratio_lo"] > SLOWDOWN and not others_slow and f.verdict in (CONFIRMED, NOT_RUN):
        verdict = CONFIRMED
    else:
        verdict = NUANCE  # slower, but mildly, within the repeats' spread, not DP's alone, or the thread mechanism not shown
    text = (f"DP on {t['gpus']} GPUs: step p50 {t['p50_on_ms']:.1f} ms benchmark on vs {t['p50_off_ms']:.1f} ms off "
            f"({t['ratio']:.1f}x)")
    if cause_on:
        text += (f"; on persistent replica threads {cause_on['dp_persistent_ms']:.1f} ms with benchmark on "
                 f"(stock {cause_on['dp_ms']:.1f} ms)")
        if cause_on["threads_are_the_cost"]:
            f.advice = (f"Leave torch.backends.cudnn.benchmark off under DataParallel: it autotunes again in every "
                        f"step's new replica threads ({cause_on['dp_ms']:.0f} ms a step here against "
                        f"{cause_on['dp_persistent_ms']:.0f} ms when the same threads are reused). Or use DDP, whose "
                        f"one process per GPU keeps its thread and its autotuning cache.")
    return _with_training(ev, f, verdict, text)


def _c7_summary(p: ProbeRecord) -> str:
    r = p.values("c7.conv.slowdown")

    def ratio(side: str) -> str:   # older records hold the point ratio alone
        lo, hi = r.get(f"benchmark_{side}_low"), r.get(f"benchmark_{side}_high")
        return f"{r.get(f'benchmark_{side}')}x" + (f" ({lo}-{hi}x)" if lo is not None and hi is not None else "")

    level = f", intervals at >= {100 * r['level']:.0f}% confidence" if r.get("level") else ""
    return (f"3x3 conv in a new thread per step vs the same thread: {ratio('on')} slower with "
            f"benchmark on, {ratio('off')} off{level}")


# -- C8: speed-up over one GPU against the global batch ------------------------------------

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
        out.append({"series": series, "variant": variant, "gpus": gpus, "crossings": found,
                    "batches": [p["global_batch"] for p in curve], "speedups": [p["speedup"] for p in curve],
                    "statuses": [p["status"] for p in curve],
                    "level": min((p["level"] for p in curve if p["level"] is not None), default=None),
                    "all_faster": all(p["faster"] for p in curve), "all_slower": all(p["slower"] for p in curve)})
    return out


def _level_text(level: float | None) -> str:
    return f"confidence at least {level:.0%}" if level is not None else "no interval"


def _status_text(c: dict[str, Any]) -> str:
    """'slower at 128-512, within noise at 2,048, faster at 8,192': runs of batches by status."""
    runs: list[tuple[str, list[int]]] = []
    for b, st in zip(c["batches"], c["statuses"]):
        if runs and runs[-1][0] == st:
            runs[-1][1].append(b)
        else:
            runs.append((st, [b]))
    return ", ".join(f"{st} at {_fmt_batch(bs[0])}" + (f"-{_fmt_batch(bs[-1])}" if len(bs) > 1 else "")
                     for st, bs in runs)


def _bracket(x: dict[str, Any]) -> str:
    a, b = x["between"]
    return f"between {_fmt_batch(a)} and {_fmt_batch(b)} (about {_about(x['batch'])} interpolated between medians)"


def _curve_text(c: dict[str, Any]) -> str:
    lo, hi = c["batches"][0], c["batches"][-1]
    span = (f"{c['speedups'][0]:.2f}x at {_fmt_batch(lo)} to {c['speedups'][-1]:.2f}x at {_fmt_batch(hi)}; each "
            f"point called from its range over repeats, {_level_text(c['level'])}")
    who = f"{c['variant'].upper()} on {c['gpus']} GPUs, {c['series']}"
    ups = [x for x in c["crossings"] if x["direction"] == "faster above"]
    if c["all_slower"]:
        return (f"{who}: slower than one GPU at every batch from {_fmt_batch(lo)} to {_fmt_batch(hi)}, beyond the "
                f"repeats' range ({span})")
    if c["all_faster"]:
        return (f"{who}: faster than one GPU at every batch from {_fmt_batch(lo)} to {_fmt_batch(hi)}, beyond the "
                f"repeats' range ({span})")
    where = _status_text(c)
    if ups and len(c["crossings"]) == 1:
        a, b = ups[0]["between"]
        return (f"{who}: last measured slower at {_fmt_batch(a)} and first measured faster at {_fmt_batch(b)} images "
                f"a step on this machine, so the crossover lies {_bracket(ups[0])}; by batch: {where} ({span})")
    if c["crossings"]:
        brackets = ", ".join(f"{_bracket(x)}, {x['direction']}" for x in c["crossings"])
        return f"{who}: crosses one GPU's speed {brackets}; by batch: {where} ({span})"
    return f"{who}: no crossover told apart from the repeats' noise; by batch: {where} ({span})"


def _point_line(p: dict[str, Any]) -> str:
    epoch = (f"; an epoch of this run's {p['train_size']:,} training images {p['train_size'] / p['images_per_s']:.1f} s "
             f"vs {p['train_size'] / p['single_images_per_s']:.1f} s" if p["train_size"] else "")
    return (f"{p['group']}: {p['variant']} on {p['gpus']} GPU(s), batch {_fmt_batch(p['global_batch'])}, "
            f"{p['series']}: {p['images_per_s']:.0f} images/s vs one GPU {p['single_images_per_s']:.0f}: "
            f"{p['speedup']:.2f}x, {p['status']} (range over {p['repeats']} repeats each "
            f"{p['speedup_lo']:.2f}-{p['speedup_hi']:.2f}x, {_level_text(p['level'])}), efficiency "
            f"{p['efficiency']:.0%}{epoch}")


def c8(ev) -> Finding:
    groups = ev.claim_groups("C8")
    points = c8_points(ev)
    dp = [p for p in points if p["variant"] == "dp" and p["gpus"] > 1]
    if not dp:
        return _not_run(ev, groups)
    curves = crossovers(points)
    if all(p["faster"] for p in dp):
        verdict = CONFIRMED
    elif all(p["slower"] for p in dp):
        verdict = REFUTED
    else:
        verdict = NUANCE   # faster at some batches, slower at others (or not told apart)
    dp_curves = [c for c in curves if c["variant"] == "dp" and c["gpus"] > 1]
    alone = [p for p in dp if not any(c["series"] == p["series"] and c["gpus"] == p["gpus"] for c in dp_curves)]
    parts = [_curve_text(c) for c in dp_curves]
    parts += [f"DP on {p['gpus']} GPUs, {p['series']} ({p['group']}, batch {p['global_batch']}): {p['speedup']:.2f}x, "
              f"{p['status']} (repeats {p['speedup_lo']:.2f}-{p['speedup_hi']:.2f}x, {_level_text(p['level'])})"
              for p in alone]
    ddp = [p for p in points if p["variant"] == "ddp" and p["gpus"] > 1]
    if ddp:
        parts.append(f"DDP {min(p['speedup'] for p in ddp):.2f}x-{max(p['speedup'] for p in ddp):.2f}x")
    breakdowns = dp_step_breakdowns(ev, "off")
    cause = breakdowns[0] if breakdowns else None
    growth = overhead_growth(breakdowns)
    if cause:
        parts.append(_cause_summary(cause))
    if growth:
        parts.append(_growth_text(growth))
    lines = [_point_line(p) for p in points]
    lines += [f"crossover: {_curve_text(c)}" for c in curves if c["variant"] == "ddp" or c["gpus"] == 1]
    lines += ["where a DataParallel step's time goes (C7 probe): " + _cause_text(b) for b in breakdowns]
    dtypes = _replica_dtypes(ev)
    note = _bf16_text(dtypes) if any(p["series"].startswith("bf16") for p in dp) else None
    if note:
        lines.append(note)
        parts.append(note)
    measured_on = [ev.measured_on_runs()] + ([ev.measured_on_probe("C7")] if cause or dtypes else [])
    return Finding(verdict=verdict, summary="; ".join(parts), evidence=lines,
                   data={"rows": points, "curves": curves, "dp_step": cause, "dp_step_batches": breakdowns,
                         "overhead_growth": growth, "replica_autocast_dtype": dtypes}, runs_used=True,
                   advice=_c8_advice(dp_curves, cause, growth, dtypes), measured_on=measured_on)


BF16 = "torch.bfloat16"


def _replica_dtypes(ev) -> dict[str, str]:
    """The C7 probe's dtypes a replica computed in under the caller's autocast(bfloat16): stock
    DataParallel (its new threads start with autocast's default dtype), and dpbench's dp variant
    as the training runs build it; {} where not measured."""
    p: ProbeRecord | None = ev.probes.get("C7")
    return p.values("c7.dp_step.replica_autocast_dtype") if p else {}


def _bf16_text(dtypes: dict[str, str]) -> str | None:
    """What the bf16 points ran in: a caveat only where dpbench's own replicas were not bf16."""
    stock, ours = dtypes.get("stock"), dtypes.get("dpbench_dp")
    if ours and ours != BF16:
        return (f"dpbench's DataParallel replicas computed in {ours} when autocast asked for {BF16} (C7 probe): "
                f"its bf16 points ran in {ours}")
    if stock and stock != BF16:
        ran = f"computed in {ours}" if ours else "were not measured in this record"
        return (f"stock nn.DataParallel's replica threads compute in {stock} when the caller's autocast asks for {BF16} "
                f"(C7 probe); dpbench's dp runs wrap each replica in autocast({BF16}) of its own "
                f"(variants.Autocast) and {ran}")
    return None


def _c8_advice(curves: list[dict], cause: dict | None, growth: dict | None, dtypes: dict[str, str]) -> str:
    """Where DataParallel paid off here; what its cost was, as far as the step breakdown measured
    it; DDP."""
    parts = []
    for c in curves:
        ups = [x for x in c["crossings"] if x["direction"] == "faster above"]
        if ups:
            a, b = ups[-1]["between"]
            # "only from B" holds when no smaller batch was faster too
            only = not any(st == "faster" and bt < a for bt, st in zip(c["batches"], c["statuses"]))
            parts.append(f"with {c['series']} DataParallel on {c['gpus']} GPUs paid off {'only ' if only else ''}from "
                         f"{_fmt_batch(b)} images a step of the batches measured (slower at {_fmt_batch(a)}; the "
                         f"crossover about {_about(ups[-1]['batch'])}, interpolated)")
        elif c["all_slower"]:
            parts.append(f"with {c['series']} DataParallel on {c['gpus']} GPUs never paid off up to "
                         f"{_fmt_batch(c['batches'][-1])} images a step")
    text = ("Measure before scaling out: on this machine " + "; ".join(parts) + ". ") if parts else \
        "Measure before scaling out. "
    if cause and cause["threads_are_the_cost"]:
        text += (f"Most of DataParallel's cost per step here is its new replica threads (on persistent threads it ran "
                 f"at {cause['dp_persistent_speedup']:.2f}x one GPU at batch {cause['batch']}, stock at "
                 f"{cause['dp_speedup']:.2f}x). ")
    elif cause and cause["largest_excess_stage"]:
        stage = cause["largest_excess_stage"]
        text += (f"Of DataParallel's time beyond one GPU's share of the same work, the largest part here is "
                 f"{stage.replace('_', ' ')} ({cause['excess'][stage]:+.1f} ms a step at batch {cause['batch']}). ")
    if growth:
        (ba, bb), (oa, ob) = growth["batches"], growth["overhead_ms"]
        measured = f"{oa:.1f} ms a step at batch {_fmt_batch(ba)}, {ob:.1f} ms at {_fmt_batch(bb)}"
        text += (f"Its time beyond a perfect split grew with the batch ({measured}): the data moved weighs in, so a "
                 f"larger batch pays off less than against a cost per step. " if growth["grows"] else
                 f"Its time beyond a perfect split did not grow with the batch ({measured}): a cost per step, not the "
                 f"data moved, sets the crossover. ")
    stock = dtypes.get("stock")
    if stock and stock != BF16:
        text += (f"Under stock nn.DataParallel enter autocast inside the module's forward: its replica threads computed "
                 f"in {stock} here when the caller's autocast asked for {BF16}. ")
    return text + "Use DDP (one process per GPU) for multi-GPU training, and feed data fast enough for one GPU first."
