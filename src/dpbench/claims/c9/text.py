"""C9's ledger section in words: each row of the largest-batch search, where FSDP2 first beats
DDP along the model size (largest batch, then throughput there) with its conditions, and on
fewer than two GPUs what the closed forms predict, saying that the crossover was not measured.
"""
from __future__ import annotations

from typing import Any

from dpbench.claims import NOT_RUN, needs_text
from dpbench.claims.c9.verdict import CONDITIONS_ID, C9Verdict, Crossover, table_rows, verdict_from
from dpbench.claims.records import Finding

WHAT = {"largest_batch": "largest batch", "samples_per_s_at_largest": "throughput at its largest batch"}


def params(p: float) -> str:
    """12,000,000 -> '12M', 1,070,000,000 -> '1.07B'."""
    return f"{p / 1e9:.3g}B" if p >= 1e9 else f"{p / 1e6:.3g}M"


def row_line(r: dict[str, Any]) -> str:
    head = f"{r['variant']} on {r['gpus']} GPU(s), {r['workload']} ({params(r['parameters'])} parameters), {r['precision']}"
    if not r.get("largest_batch"):
        return f"{head}: no batch found ({r.get('reason') or 'none fits'})"
    speed = r.get("samples_per_s_at_largest")
    return (f"{head}: largest batch {r['largest_batch']:,} per GPU within {r['cap_gib']:g} GiB"
            + (f", {speed:,.1f} samples/s there" if speed else f" ({r.get('reason')})"))


def crossover_line(c: Crossover, interconnect: str) -> str:
    where = (f"FSDP2 ({'resharding' if c.reshard_after_forward else 'not resharding'} after forward) against "
             f"DDP on {c.gpus} GPUs ({interconnect}), {c.precision}")
    pairs = ", ".join(f"{params(p)}: {s:,.4g} vs {b:,.4g}" for p, s, b in zip(c.parameters, c.sharded, c.baseline))
    if c.first_exceeds is None:
        return (f"{where}: its {WHAT[c.quantity]} exceeds DDP's at no swept size up to "
                f"{params(c.parameters[-1])} ({pairs})")
    return f"{where}: its {WHAT[c.quantity]} first exceeds DDP's at {params(c.first_exceeds)} parameters ({pairs})"


def predicted_text(pred: dict[str, Any]) -> str:
    sizes = "; ".join(f"{params(s['parameters'])}: DDP {s['ddp_state_gib']:.2f} GiB, FSDP2 {s['fsdp_state_gib']:.2f} GiB"
                      for s in pred["sizes"])
    per_size = f" of {sizes}" if sizes else ""
    return (f"the memory model predicts, on {pred['ranks']} GPUs in fp32 with SGD and momentum, parameters, gradients "
            f"and optimizer state per GPU{per_size}: DDP's alone fill "
            f"{pred['cap_gib']:g} GiB from about {params(pred['ddp_limit'])} parameters, FSDP2's from about "
            f"{params(pred['fsdp_limit'])}, so FSDP2's largest batch should exceed DDP's wherever that state is not "
            f"outweighed by activations; the crossover itself was not measured")


def summary(v: C9Verdict, interconnect: str) -> str:
    first = {c.quantity: c for c in v.crossovers if c.first_exceeds is not None}
    parts = [f"{WHAT[q]}: FSDP2 first exceeds DDP at {params(c.first_exceeds)} parameters on {c.gpus} GPUs "
             f"({interconnect}, {c.precision})" for q, c in first.items()]
    if not parts:
        top = max(max(c.parameters) for c in v.crossovers)
        return f"FSDP2 exceeded DDP in neither largest batch nor throughput at any swept size up to {params(top)}"
    return "; ".join(parts) + f" (within {v.cap_gib:g} GiB per GPU)"


def finding(ev) -> Finding:
    probe = ev.probes.get("C9")
    rows = table_rows(probe)
    v = verdict_from(rows)
    inter = (probe.values(CONDITIONS_ID).get("interconnect") if probe else None) or "interconnect unknown"
    evidence = [row_line(r) for r in rows]
    measured_on = [ev.measured_on_probe("C9")] if probe else []
    data = {"rows": rows, "verdict": v.verdict, "crossovers": [c.__dict__ for c in v.crossovers],
            "predicted": v.predicted, "interconnect": inter}
    if v.verdict != NOT_RUN:
        evidence += [crossover_line(c, inter) for c in v.crossovers]
        return Finding(verdict=v.verdict, summary=summary(v, inter), evidence=evidence, data=data,
                       measured_on=measured_on)
    gpus = probe.ran_on.get("gpus_visible", 0) if probe else ev.gpus_found()
    why = (probe.not_run if probe and probe.not_run else None) or (
        "no probe record claims/C9.json (python -m dpbench.claims.probe C9)" if probe is None
        else "the crossover " + needs_text(2, gpus))
    said = predicted_text(v.predicted) if v.predicted else "the crossover was not measured"
    one = "; ".join(row_line(r) for r in v.one_rank if r.get("largest_batch"))
    return Finding(verdict=NOT_RUN, summary=f"{NOT_RUN}: {why}; {said}" + (f"; on one GPU: {one}" if one else ""),
                   evidence=[said[0].upper() + said[1:]] + evidence, data=data, measured_on=measured_on, not_run=f"{NOT_RUN}: {why}")
