"""C1's ledger section in words: each cell, each sweep and where the gathered outputs start to
dominate, what DDP's ranks hold against DP's device 0, the probe's batch search and memory
snapshot, and advice that follows what was measured.
"""
from __future__ import annotations

import math
from typing import Any

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.c1.verdict import PARAM_BYTES, decide, from_runs, gathered_cost_onset
from dpbench.claims.findings import probe_finding, runs_not_run
from dpbench.claims.records import Finding, ProbeRecord


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


def _rank_text(r: dict[str, Any]) -> str:
    at = f"{r['num_classes']:,} outputs" if r["num_classes"] is not None else r["group"]
    beyond = "within noise" if r["call"] == "within noise" else f"{r['call']} beyond noise"
    return f"at {at} {r['diff_mib']:+.0f} MiB, {beyond} ({r['noise_mib']:.0f} MiB)"


def c1_max_batch(p: ProbeRecord) -> str:
    """'largest global batch within 8 GiB per GPU: 10 outputs: dp 5,000, dp_sum ...; 32,768 outputs: ...'"""
    cells: dict[str, list[str]] = {}
    caps = set()
    found: dict[str, dict[str, int]] = {}
    for o in p.with_prefix("c1.max_batch."):
        _, _, variant, width = o.id.split(".")
        label = f"{int(width.removeprefix('out')):,} outputs"
        name = "single (1 GPU)" if variant == "single" else variant
        cells.setdefault(label, []).append(f"{name} {o.get('global_batch'):,}")
        caps.add(f"{o.get('cap_gib'):g} GiB")
        found.setdefault(variant, {})[width.removeprefix("out")] = o.get("global_batch")
    attribution = c1_attribution_text(p)
    if not cells:
        return attribution or "no batch search finished"
    first, clean = gathered_cost_onset(found)
    onset = ("" if first is None else
             f"; the loss on the gathered outputs costs batch against dp_sum from {int(first):,} outputs"
             + (", not below" if clean else "; below it at some widths, not at others"))
    return (f"largest global batch within {'/'.join(sorted(caps))} allocated per GPU: "
            + "; ".join(f"{label}: {', '.join(parts)}" for label, parts in cells.items()) + onset
            + (f"; {attribution}" if attribution else ""))


ATTRIBUTED = 3   # categories named per device in the summary (the evidence lists them all)


def c1_attribution_text(p: ProbeRecord) -> str:
    """'device 0's peak by what allocated it (memory snapshot), dp at batch 2,048: 32,768 outputs:
    device 0 6,100 MiB (gathered outputs 256, loss 512, ...) vs device 1 ...' for the DataParallel
    variants; '' where no snapshot was taken."""
    parts = []
    for variant in ("dp", "dp_sum"):
        rows = p.with_prefix(f"c1.attribution.{variant}.")
        widths = sorted({o.id.split(".")[3] for o in rows}, key=lambda w: int(w.removeprefix("out")))
        for width in widths[-1:]:   # the widest output: where the article's reason would show
            devs = sorted((o for o in rows if o.id.split(".")[3] == width), key=lambda o: o.id)
            text = " vs ".join(
                f"device {o.id.split('.')[4].removeprefix('dev')} {o.get('peak_mib'):,.0f} MiB ("
                + ", ".join(f"{c} {m:,.0f}" for c, m in sorted((o.get("by_category") or {}).items(),
                                                key=lambda cm: -cm[1])[:ATTRIBUTED])
                + ")" for o in devs)
            parts.append(f"{variant}, {int(width.removeprefix('out')):,} outputs: {text}")
    return ("each device's peak by what allocated it (memory snapshot, biggest first): " + "; ".join(parts)
            if parts else "")


def _c1_from_runs(ev) -> Finding:
    runs = from_runs(ev)
    if runs is None:
        return runs_not_run(ev, ev.claim_groups("C1"))
    verdict, cells, dp = runs.verdict, runs.cells, runs.dp
    heads = {CONFIRMED: "the article is right ",
             NUANCE: "device 0 is heavier beyond noise, but the gathered outputs do not (cleanly) explain it: ",
             REFUTED: "device 0 holds no more than the others beyond noise: "}
    # "right" leads only the sweeps where it is; the others say what they showed
    texts = [(heads[CONFIRMED] if verdict == CONFIRMED and first else "") + _sweep_text(s, first)
             for s, (first, _) in zip(runs.sweeps, runs.onsets)]
    if runs.unsized:
        texts.append(f"{runs.unsized} dp cell(s) without a run config: not placed on the output-size sweep")
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
    ranks = runs.ddp_vs_dp
    if ranks:
        parts.append("each DDP rank against DP's device 0 (allocated less resident data): "
                     + "; ".join(_rank_text(r) for r in ranks))
    lines = [_c1_line(c) for c in cells]
    lines += [f"{r['group']}: each DDP rank peaks at {r['ddp_rank_mib']:.0f} MiB allocated (the ranks' mean), DP's "
              f"device 0 at {r['dp_dev0_mib']:.0f} MiB and its other devices at {r['dp_others_mib']:.0f} MiB: "
              f"{_rank_text(r)}" for r in ranks]
    return Finding(verdict=verdict, summary="; ".join(parts), evidence=lines,
                   data={"cells": cells, "conditions": runs.conditions(), "ddp_vs_dp": ranks}, runs_used=True,
                   advice=_c1_advice(verdict, runs.sweeps, runs.onsets), measured_on=[ev.measured_on_runs()])


def _with_max_batch(ev, f: Finding) -> Finding:
    """C1's runs measure memory at fixed batches; the probe (dpbench.claims.c1.probe) what
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
        f.summary, f.not_run = p.summary, None
    else:
        f.summary = f"{f.summary}; {p.summary}"
    f.verdict = decide(f.verdict, p.verdict)
    return f


def finding(ev) -> Finding:
    return _with_max_batch(ev, _c1_from_runs(ev))
