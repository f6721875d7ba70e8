"""C9's evidence as numbers: the largest_batch rows (one per workload size, variant, GPUs and
precision, from the C9 probe's record), where FSDP2 first beats DDP along the size, and the verdict.

A crossover is the smallest swept size at which FSDP2's value exceeds DDP's at the same GPUs and
precision: its largest batch (a size DDP cannot train at all counts as 0), and its samples/s at
that batch. Only runs on two or more GPUs can show it (one rank shards nothing); on fewer the
verdict carries what the closed forms predict (c9.predicted) and says that nothing was measured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE
from dpbench.claims.c9.predicted import prediction
from dpbench.claims.records import ProbeRecord
from dpbench.results import LARGEST_BATCH_COLUMNS

ROW_PREFIX = "c9.largest_batch."
CONDITIONS_ID = "c9.conditions"   # the interconnect the searches ran over
SHARDED, BASELINE = "fsdp", "ddp"
QUANTITIES = ("largest_batch", "samples_per_s_at_largest")
CAP_GIB = 12.0   # the probe's default cap per GPU; the prediction's where no row says one


def row_id(row: dict[str, Any]) -> str:
    """The stable observation id of one row of the search."""
    rf = "" if row["variant"] not in ("fsdp", "hsdp") else (".reshard" if row["reshard_after_forward"] else ".keep")
    return f"{ROW_PREFIX}{row['workload']}.{row['variant']}{rf}.g{row['gpus']}.{row['precision']}"


def table_rows(probe: ProbeRecord | None) -> list[dict[str, Any]]:
    """largest_batch.csv's rows (results.LARGEST_BATCH_COLUMNS) from the C9 probe's record."""
    if probe is None:
        return []
    return [{c: o.get(c) for c in LARGEST_BATCH_COLUMNS} for o in probe.with_prefix(ROW_PREFIX)]


def ledger_rows(ev) -> list[dict[str, Any]]:
    """The rows the ledger writes as largest_batch.csv (registry: Claim.tables)."""
    return table_rows(ev.probes.get("C9"))


def _value(row: dict[str, Any] | None, quantity: str) -> float:
    """A value to compare; a search that found no batch (or no throughput) counts as 0."""
    v = None if row is None else row.get(quantity)
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


@dataclass(frozen=True)
class Crossover:
    """Along the swept sizes at one (GPUs, precision): FSDP2's and DDP's values and the smallest
    size where FSDP2's exceeds DDP's (None: not within the sweep)."""
    gpus: int
    precision: str
    quantity: str
    parameters: list[int]
    sharded: list[float]
    baseline: list[float]
    first_exceeds: int | None
    reshard_after_forward: bool = True


@dataclass(frozen=True)
class C9Verdict:
    verdict: str
    crossovers: list[Crossover] = field(default_factory=list)
    one_rank: list[dict[str, Any]] = field(default_factory=list)   # rows at gpus 1 (the variants' own cost)
    predicted: dict[str, Any] | None = None                         # closed forms, where not measured
    cap_gib: float = CAP_GIB


def crossovers(rows: list[dict[str, Any]]) -> list[Crossover]:
    """Every (GPUs >= 2, precision, FSDP2 resharding) series with both variants, each quantity."""
    out = []
    series = sorted({(int(r["gpus"]), str(r["precision"]), bool(r["reshard_after_forward"]))
                     for r in rows if r["variant"] == SHARDED and int(r["gpus"]) >= 2})
    for gpus, precision, reshard in series:
        def at(variant: str, p: int) -> dict[str, Any] | None:
            return next((r for r in rows if r["variant"] == variant and int(r["gpus"]) == gpus
                         and r["precision"] == precision and int(r["parameters"]) == p
                         and (variant != SHARDED or bool(r["reshard_after_forward"]) == reshard)), None)
        sizes = sorted({int(r["parameters"]) for r in rows if r["variant"] == SHARDED and int(r["gpus"]) == gpus
                        and r["precision"] == precision and at(BASELINE, int(r["parameters"])) is not None})
        if not sizes:
            continue
        for q in QUANTITIES:
            s = [_value(at(SHARDED, p), q) for p in sizes]
            b = [_value(at(BASELINE, p), q) for p in sizes]
            first = next((p for p, x, y in zip(sizes, s, b) if x > y), None)
            out.append(Crossover(gpus, precision, q, sizes, s, b, first, reshard))
    return out


def verdict_from(rows: list[dict[str, Any]]) -> C9Verdict:
    """Sharding pays (confirmed) where FSDP2's largest batch and its throughput there both exceed
    DDP's at some swept size; needs nuance where only the batch does, or neither within the sweep;
    not measured without two GPUs (then the closed forms' prediction at the swept sizes)."""
    one = [r for r in rows if int(r["gpus"]) == 1]
    caps = {float(r["cap_gib"]) for r in rows if r.get("cap_gib") is not None}
    cap = max(caps) if caps else CAP_GIB
    found = crossovers(rows)
    if not found:
        sizes = sorted({int(r["parameters"]) for r in rows if r.get("parameters")})
        return C9Verdict(NOT_RUN, [], one, prediction(sizes, cap), cap)
    batch = any(c.first_exceeds is not None for c in found if c.quantity == "largest_batch")
    speed = any(c.first_exceeds is not None for c in found if c.quantity == "samples_per_s_at_largest")
    return C9Verdict(CONFIRMED if batch and speed else NUANCE, found, one, None, cap)
