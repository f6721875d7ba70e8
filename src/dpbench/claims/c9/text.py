"""C9's ledger section in words: each row of the largest-batch search, where each sharded variant
first beats DDP along the model size (largest batch, then throughput there) with its
conditions (ranks, budget and the devices it stands for, precision, rehearsed or real GPUs,
interconnect) and the memory model's crossover beside it; on fewer than two ranks what the
closed forms predict, saying that the crossover was not measured. Every number is the rows'.
"""
from __future__ import annotations

from typing import Any

from dpbench.claims import NOT_RUN, needs_text
from dpbench.claims.c9.verdict import CONDITIONS_ID, C9Verdict, Crossover, table_rows, verdict_from
from dpbench.claims.records import Finding

WHAT = {"largest_batch": "largest batch", "samples_per_s_at_largest": "throughput at its largest batch"}
REHEARSED = ("rehearsed: the N ranks shared one GPU over gloo, each its own process and allocator, "
             "so the batch is what one rank fits on a GPU of its own (less NCCL's buffers)")
SPEED_NEEDS_GPUS = ("the throughput half of the claim (samples/s at that batch) needs real GPUs: "
                    "rehearsed ranks take turns on one GPU, so their speed is nobody's")


def params(p: float) -> str:
    """12,000,000 -> '12M', 1,070,000,000 -> '1.07B'."""
    return f"{p / 1e9:.3g}B" if p >= 1e9 else f"{p / 1e6:.3g}M"


def params_value(name: str) -> float:
    """'1.07B' -> 1.07e9, '12M' -> 1.2e7: params' text back as a number, to order sizes by."""
    return float(name[:-1]) * {"M": 1e6, "B": 1e9}[name[-1]]


def budget_text(cap: float | None, budget: str | None) -> str:
    cap_text = f"{cap:g} GiB per rank" if cap is not None else "no budget"
    return f"{cap_text} ({budget})" if budget else cap_text


def row_line(r: dict[str, Any]) -> str:
    where = f"{r['gpus']} rehearsed rank(s)" if r.get("rehearsed") else f"{r['gpus']} GPU(s)"
    head = f"{r['variant']} on {where}, {r['workload']} ({params(r['parameters'])} parameters), {r['precision']}"
    if r["variant"] in ("fsdp", "hsdp") and not r.get("reshard_after_forward"):
        head += ", no resharding"
    within = budget_text(r.get("cap_gib"), r.get("budget"))
    pred = r.get("predicted_largest_batch")
    model = f"; the memory model: {pred:,.0f}" if pred is not None and pred == pred else ""
    if not r.get("largest_batch"):
        return f"{head}: no batch found within {within} ({r.get('reason') or 'none fits'}){model}"
    speed = r.get("samples_per_s_at_largest")
    return (f"{head}: largest batch {r['largest_batch']:,} per rank within {within}{model}"
            + (f", {speed:,.1f} samples/s there" if speed else (f" ({r['reason']})" if r.get("reason") else "")))


def crossover_line(c: Crossover, interconnect: str) -> str:
    where = (f"{c.name} against DDP on {c.gpus} {'rehearsed ranks' if c.rehearsed else 'GPUs (' + interconnect + ')'}, "
             f"{c.precision}, within {budget_text(c.cap_gib, c.budget)}")
    pairs = ", ".join(f"{params(p)}: {s:,.4g} vs {b:,.4g}" for p, s, b in zip(c.parameters, c.sharded, c.baseline))
    model = ""
    if c.quantity == "largest_batch" and any(v is not None for v in c.predicted_sharded):
        model = ("; the memory model: " + (f"first at {params(c.predicted_first_exceeds)}"
                                             if c.predicted_first_exceeds else "at no swept size"))
    if c.first_exceeds is None:
        return (f"{where}: its {WHAT[c.quantity]} exceeds DDP's at no swept size up to "
                f"{params(c.parameters[-1])} ({pairs}){model}")
    return f"{where}: its {WHAT[c.quantity]} first exceeds DDP's at {params(c.first_exceeds)} parameters ({pairs}){model}"


def summary(v: C9Verdict, interconnect: str) -> str:
    """Per sharded variant, ranks and budget, the first size where its largest batch (and, on real
    GPUs, its throughput) exceeds DDP's, with the model's beside it."""
    parts = []
    for c in v.crossovers:
        if c.first_exceeds is None:
            continue
        where = f"{c.gpus} rehearsed ranks" if c.rehearsed else f"{c.gpus} GPUs ({interconnect})"
        model = ""
        if c.quantity == "largest_batch" and any(x is not None for x in c.predicted_sharded):
            model = f", model {params(c.predicted_first_exceeds)}" if c.predicted_first_exceeds else ", model: none"
        parts.append(f"{WHAT[c.quantity]}: {c.name} first exceeds DDP at {params(c.first_exceeds)} parameters on "
                     f"{where}, {c.precision}, {budget_text(c.cap_gib, c.budget)}{model}")
    if not parts:
        top = max(max(c.parameters) for c in v.crossovers)
        names = sorted({c.name for c in v.crossovers})
        return (f"{', '.join(names)} exceeded DDP in neither largest batch nor throughput at any swept size up to "
                f"{params(top)}" + ("; " + SPEED_NEEDS_GPUS if v.rehearsed else ""))
    return "; ".join(parts) + ("; " + SPEED_NEEDS_GPUS if v.rehearsed else "")


def predicted_text(preds: list[dict[str, Any]]) -> str:
    """The closed forms' words: the state per GPU at the swept sizes, and per budget the size
    from which DDP's and FSDP2's state alone fill it."""
    first = preds[0]
    sizes = "; ".join(f"{params(s['parameters'])}: DDP {s['ddp_state_gib']:.2f} GiB, FSDP2 {s['fsdp_state_gib']:.2f} GiB"
                      for s in first["sizes"])
    per_size = f" of {sizes}" if sizes else ""
    fill = "; ".join(f"{budget_text(p['cap_gib'], p.get('budget'))}: DDP's from about {params(p['ddp_limit'])} "
                     f"parameters, FSDP2's from about {params(p['fsdp_limit'])}" for p in preds)
    return (f"the memory model predicts, on {first['ranks']} GPUs in fp32 with SGD and momentum, parameters, gradients "
            f"and optimizer state per GPU{per_size} (DDP {first['ddp_bytes_per_parameter']:g} bytes a parameter, "
            f"its gradient buckets included; FSDP2 {first['fsdp_bytes_per_parameter']:g}); that state alone fills "
            f"{fill}; so FSDP2's largest batch should exceed DDP's wherever that state is not outweighed by "
            f"activations; the crossover itself was not measured")


def conditions(v: C9Verdict, rows: list[dict[str, Any]]) -> str:
    """What the rows were measured under, from the rows."""
    ranks = sorted({int(r["gpus"]) for r in rows})
    precisions = sorted({str(r["precision"]) for r in rows})
    budgets = "; ".join(name if name == f"{gib:g} GiB" else f"{name}: {gib:g} GiB" for name, gib in v.budgets.items())
    how = REHEARSED if v.rehearsed else "on real GPUs"
    return (f"Conditions: {', '.join(map(str, ranks))} rank(s), {', '.join(precisions)}, per-rank budgets {budgets}; "
            f"{how}")


def finding(ev) -> Finding:
    probe = ev.probes.get("C9")
    rows = table_rows(probe)
    v = verdict_from(rows)
    inter = (probe.values(CONDITIONS_ID).get("interconnect") if probe else None) or "interconnect unknown"
    evidence = [row_line(r) for r in rows]
    measured_on = [ev.measured_on_probe("C9")] if probe else []
    data = {"rows": rows, "verdict": v.verdict, "crossovers": [dict(c.__dict__, name=c.name) for c in v.crossovers],
            "predicted": v.predicted, "interconnect": inter, "rehearsed": v.rehearsed, "budgets": v.budgets}
    if v.verdict != NOT_RUN:
        evidence = [conditions(v, rows)] + evidence + [crossover_line(c, inter) for c in v.crossovers]
        if v.rehearsed:
            evidence.append(SPEED_NEEDS_GPUS[0].upper() + SPEED_NEEDS_GPUS[1:])
        return Finding(verdict=v.verdict, summary=summary(v, inter), evidence=evidence, data=data,
                       measured_on=measured_on)
    gpus = probe.ran_on.get("gpus_visible", 0) if probe else ev.gpus_found()
    why = (probe.not_run if probe and probe.not_run else None) or (
        "no probe record claims/C9.json (python -m dpbench.claims.probe C9)" if probe is None
        else "the crossover " + needs_text(2, gpus) + " (or rehearsed ranks: tools/device/rehearse.sh)")
    said = predicted_text(v.predicted) if v.predicted else "the crossover was not measured"
    one = "; ".join(row_line(r) for r in v.one_rank if r.get("largest_batch"))
    return Finding(verdict=NOT_RUN, summary=f"{NOT_RUN}: {why}; {said}" + (f"; on one GPU: {one}" if one else ""),
                   evidence=[said[0].upper() + said[1:]] + evidence, data=data, measured_on=measured_on, not_run=f"{NOT_RUN}: {why}")
