"""C8's ledger section in words: each speed-up, each curve and its crossover, the cause the C7
probe's step breakdown names, and advice that follows where DataParallel paid off here.
"""
from __future__ import annotations

from typing import Any

from dpbench.claims.c7.text import cause_summary, cause_text, growth_text
from dpbench.claims.c8.verdict import BF16, from_runs
from dpbench.claims.findings import about, fmt_batch, runs_not_run
from dpbench.claims.records import Finding


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
    return ", ".join(f"{st} at {fmt_batch(bs[0])}" + (f"-{fmt_batch(bs[-1])}" if len(bs) > 1 else "")
                     for st, bs in runs)


def _bracket(x: dict[str, Any]) -> str:
    a, b = x["between"]
    return f"between {fmt_batch(a)} and {fmt_batch(b)} (about {about(x['batch'])} interpolated between medians)"


def _curve_text(c: dict[str, Any]) -> str:
    lo, hi = c["batches"][0], c["batches"][-1]
    span = (f"{c['speedups'][0]:.2f}x at {fmt_batch(lo)} to {c['speedups'][-1]:.2f}x at {fmt_batch(hi)}; each "
            f"point called from its range over repeats, {_level_text(c['level'])}")
    who = f"{c['variant'].upper()} on {c['gpus']} GPUs, {c['series']}"
    ups = [x for x in c["crossings"] if x["direction"] == "faster above"]
    if c["all_slower"]:
        return (f"{who}: slower than one GPU at every batch from {fmt_batch(lo)} to {fmt_batch(hi)}, beyond the "
                f"repeats' range ({span})")
    if c["all_faster"]:
        return (f"{who}: faster than one GPU at every batch from {fmt_batch(lo)} to {fmt_batch(hi)}, beyond the "
                f"repeats' range ({span})")
    where = _status_text(c)
    if ups and len(c["crossings"]) == 1:
        a, b = ups[0]["between"]
        return (f"{who}: last measured slower at {fmt_batch(a)} and first measured faster at {fmt_batch(b)} images "
                f"a step on this machine, so the crossover lies {_bracket(ups[0])}; by batch: {where} ({span})")
    if c["crossings"]:
        brackets = ", ".join(f"{_bracket(x)}, {x['direction']}" for x in c["crossings"])
        return f"{who}: crosses one GPU's speed {brackets}; by batch: {where} ({span})"
    return f"{who}: no crossover told apart from the repeats' noise; by batch: {where} ({span})"


def _point_line(p: dict[str, Any]) -> str:
    epoch = (f"; an epoch of this run's {p['train_size']:,} training images {p['train_size'] / p['images_per_s']:.1f} s "
             f"vs {p['train_size'] / p['single_images_per_s']:.1f} s" if p["train_size"] else "")
    return (f"{p['group']}: {p['variant']} on {p['gpus']} GPU(s), batch {fmt_batch(p['global_batch'])}, "
            f"{p['series']}: {p['images_per_s']:.0f} images/s vs one GPU {p['single_images_per_s']:.0f}: "
            f"{p['speedup']:.2f}x, {p['status']} (range over {p['repeats']} repeats each "
            f"{p['speedup_lo']:.2f}-{p['speedup_hi']:.2f}x, {_level_text(p['level'])}), efficiency "
            f"{p['efficiency']:.0%}{epoch}")


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
        if c["paid_off_from"] is not None:
            a, b = ups[-1]["between"]
            only = c["paid_off_only_from"]
            parts.append(f"with {c['series']} DataParallel on {c['gpus']} GPUs paid off {'only ' if only else ''}from "
                         f"{fmt_batch(b)} images a step of the batches measured (slower at {fmt_batch(a)}; the "
                         f"crossover about {about(ups[-1]['batch'])}, interpolated)")
        elif c["all_slower"]:
            parts.append(f"with {c['series']} DataParallel on {c['gpus']} GPUs never paid off up to "
                         f"{fmt_batch(c['batches'][-1])} images a step")
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
        measured = f"{oa:.1f} ms a step at batch {fmt_batch(ba)}, {ob:.1f} ms at {fmt_batch(bb)}"
        text += (f"Its time beyond a perfect split grew with the batch ({measured}): the data moved weighs in, so a "
                 f"larger batch pays off less than against a cost per step. " if growth["grows"] else
                 f"Its time beyond a perfect split did not grow with the batch ({measured}): a cost per step, not the "
                 f"data moved, sets the crossover. ")
    stock = dtypes.get("stock")
    if stock and stock != BF16:
        text += (f"Under stock nn.DataParallel enter autocast inside the module's forward: its replica threads computed "
                 f"in {stock} here when the caller's autocast asked for {BF16}. ")
    return text + "Use DDP (one process per GPU) for multi-GPU training, and feed data fast enough for one GPU first."


def finding(ev) -> Finding:
    v = from_runs(ev)
    if v is None:
        return runs_not_run(ev, ev.claim_groups("C8"))
    points, curves, dp, dp_curves, cause, growth, dtypes = (v.points, v.curves, v.dp, v.dp_curves, v.cause,
                                                            v.growth, v.dtypes)
    alone = [p for p in dp if not any(c["series"] == p["series"] and c["gpus"] == p["gpus"] for c in dp_curves)]
    parts = [_curve_text(c) for c in dp_curves]
    parts += [f"DP on {p['gpus']} GPUs, {p['series']} ({p['group']}, batch {p['global_batch']}): {p['speedup']:.2f}x, "
              f"{p['status']} (repeats {p['speedup_lo']:.2f}-{p['speedup_hi']:.2f}x, {_level_text(p['level'])})"
              for p in alone]
    ddp = [p for p in points if p["variant"] == "ddp" and p["gpus"] > 1]
    if ddp:
        parts.append(f"DDP {min(p['speedup'] for p in ddp):.2f}x-{max(p['speedup'] for p in ddp):.2f}x")
    if cause:
        parts.append(cause_summary(cause))
    if growth:
        parts.append(growth_text(growth))
    lines = [_point_line(p) for p in points]
    lines += [f"crossover: {_curve_text(c)}" for c in curves if c["variant"] == "ddp" or c["gpus"] == 1]
    lines += ["where a DataParallel step's time goes (C7 probe): " + cause_text(b) for b in v.breakdowns]
    note = _bf16_text(dtypes) if any(p["series"].startswith("bf16") for p in dp) else None
    if note:
        lines.append(note)
        parts.append(note)
    measured_on = [ev.measured_on_runs()] + ([ev.measured_on_probe("C7")] if cause or dtypes else [])
    return Finding(verdict=v.verdict, summary="; ".join(parts), evidence=lines,
                   data={"rows": points, "curves": curves, "dp_step": cause, "dp_step_batches": v.breakdowns,
                         "overhead_growth": growth, "replica_autocast_dtype": dtypes}, runs_used=True,
                   advice=_c8_advice(dp_curves, cause, growth, dtypes), measured_on=measured_on)
