"""C7's ledger section in words, and the words for a DataParallel step's breakdown that C8 uses
too: where the time went, what persistent threads saved, how the overhead grew with the batch.
"""
from __future__ import annotations

from typing import Any

from dpbench.claims.c7.verdict import from_training
from dpbench.claims.findings import fmt_batch, multi_gpu, probe_finding, with_training
from dpbench.claims.records import SINGLE_STAGES, STAGES, Finding, ProbeRecord


def growth_text(g: dict[str, Any]) -> str:
    (ba, bb), (oa, ob) = g["batches"], g["overhead_ms"]
    if g["grows"]:
        return (f"DataParallel's time beyond a perfect split of one GPU's step grew from {oa:.1f} ms a step at batch "
                f"{fmt_batch(ba)} to {ob:.1f} ms at {fmt_batch(bb)}, beyond the steps' ranges: part of it grows with "
                f"the images a step (the data moved), which a larger batch does not spread")
    return (f"DataParallel's time beyond a perfect split of one GPU's step was {oa:.1f} ms a step at batch "
            f"{fmt_batch(ba)} and {ob:.1f} ms at {fmt_batch(bb)}: it does not grow with the batch beyond the steps' "
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


def cause_text(c: dict[str, Any]) -> str:
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


def cause_summary(c: dict[str, Any]) -> str:
    """C8's cause in a few words, at the breakdown's batch."""
    if c["threads_are_the_cost"]:
        what = "fresh replica threads every step"
    elif c["largest_excess_stage"] is None:
        what = "not named (no breakdown of one GPU's step)"
    else:
        what = "largest excess over one GPU's share: " + _excess_text(c)
    return (f"cause: {what} (DP on persistent threads {c['dp_persistent_speedup']:.2f}x one GPU at batch "
            f"{c['batch']}, stock {c['dp_speedup']:.2f}x)")


def _c7_summary(p: ProbeRecord) -> str:
    r = p.values("c7.conv.slowdown")

    def ratio(side: str) -> str:   # older records hold the point ratio alone
        lo, hi = r.get(f"benchmark_{side}_low"), r.get(f"benchmark_{side}_high")
        return f"{r.get(f'benchmark_{side}')}x" + (f" ({lo}-{hi}x)" if lo is not None and hi is not None else "")

    if r.get("benchmark_on") is None or r.get("benchmark_off") is None:
        return "3x3 conv in a new thread per step vs the same thread: not recorded"
    level = f", intervals at >= {100 * r['level']:.0f}% confidence" if r.get("level") else ""
    return (f"3x3 conv in a new thread per step vs the same thread: {ratio('on')} slower with "
            f"benchmark on, {ratio('off')} off{level}")


def finding(ev) -> Finding:
    f = probe_finding(ev, "C7", _c7_summary)
    v = from_training(ev, f.verdict)
    f.evidence += [
        f"training {t['variant']} on {t['gpus']} GPU(s): step p50 {t['p50_on_ms']:.1f} ms with benchmark on "
        f"({t['on_group']}), {t['p50_off_ms']:.1f} ms off ({t['off_group']}): {t['ratio']:.2f}x "
        f"(over {t['repeats']} repeats {t['ratio_lo']:.2f}-{t['ratio_hi']:.2f}x)" for t in v.training]
    f.data["training"] = v.training
    f.data["dp_step"] = {"on": v.cause_on, "off": v.cause_off}
    t, cause_on = v.slowest, v.cause_on
    if t is None:
        groups = ev.claim_groups("C7")
        f.evidence.append(f"training runs: {ev.not_run(multi_gpu(ev, groups), groups)}")
        return f
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
    return with_training(ev, f, v.verdict, text)
