"""C9's evidence as numbers: the largest_batch rows (one per workload size, variant, GPUs,
precision and memory budget, from the C9 probe's record), where each sharded variant first beats
DDP along the size, and the verdict.

A crossover is the smallest swept size at which a sharded variant's value exceeds DDP's at the
same GPUs, precision and budget: its largest batch (a size where no batch fits counts as 0; a
row that was not searched is left out; where DDP's row gives the batch its search saw fail, the
sharded batch must reach it: a bisection stops within its resolution of the true largest), and, measured on real GPUs only, its samples/s at that
batch. Rehearsed rows (N ranks sharing one GPU) measure the batch, never the speed. Beside each
measured crossover, the memory model's (the rows' predicted_largest_batch compared the same way).
Only runs on two or more ranks can show one (one rank shards nothing); with none the verdict
carries what the closed forms predict at the rows' own budgets (c9.predicted) and says that
nothing was measured. No budget is assumed: every number comes from the rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE
from dpbench.claims.c9.predicted import BUDGET_GIB, prediction
from dpbench.claims.records import ProbeRecord
from dpbench.results import LARGEST_BATCH_COLUMNS

ROW_PREFIX = "c9.largest_batch."
CONDITIONS_ID = "c9.conditions"   # the interconnect the searches ran over
SHARDED, BASELINE = "fsdp", "ddp"
SHARDED_VARIANTS = ("zero1", "fsdp", "hsdp")
QUANTITIES = ("largest_batch", "samples_per_s_at_largest")
NO_FIT = ("out of memory", "outofmemoryerror", "not even batch", "exceeds the budget")   # a search that found 0


def row_id(row: dict[str, Any]) -> str:
    """The stable observation id of one row of the search."""
    rf = "" if row["variant"] not in ("fsdp", "hsdp") else (".reshard" if row["reshard_after_forward"] else ".keep")
    budget = f".{row['budget']}" if row.get("budget") else (f".cap{row['cap_gib']:g}" if row.get("rehearsed") else "")
    rh = ".rehearsed" if row.get("rehearsed") else ""
    return f"{ROW_PREFIX}{row['workload']}.{row['variant']}{rf}.g{row['gpus']}.{row['precision']}{budget}{rh}"


def table_rows(probe: ProbeRecord | None) -> list[dict[str, Any]]:
    """largest_batch.csv's rows (results.LARGEST_BATCH_COLUMNS) from the C9 probe's record."""
    if probe is None:
        return []
    return [{c: o.get(c) for c in LARGEST_BATCH_COLUMNS} for o in probe.with_prefix(ROW_PREFIX)]


def ledger_rows(ev) -> list[dict[str, Any]]:
    """The rows the ledger writes as largest_batch.csv (registry: Claim.tables)."""
    return table_rows(ev.probes.get("C9"))


def _value(row: dict[str, Any] | None, quantity: str) -> float | None:
    """A value to compare: a search that found no batch counts as 0; a row not searched (skipped,
    or a failure other than running out of memory) is None, and so is a missing row."""
    if row is None:
        return None
    v = row.get(quantity)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        if quantity == "largest_batch" and not any(w in str(row.get("reason") or "").lower() for w in NO_FIT):
            return None
        return 0.0
    return float(v)


def _predicted(row: dict[str, Any] | None) -> float | None:
    v = None if row is None else row.get("predicted_largest_batch")
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def beyond_bracket(baseline: dict[str, Any] | None, value: float, quantity: str) -> bool:
    """Whether a largest batch exceeds DDP's for certain: at least the batch DDP's own search
    saw fail (a bisection stops within its resolution of the true largest, so a found batch a
    little above DDP's found one may lie below DDP's true one). Throughput: no bracket."""
    fail = None if baseline is None or quantity != "largest_batch" else baseline.get("smallest_failing")
    return fail is None or (isinstance(fail, float) and math.isnan(fail)) or value >= float(fail)


def label(variant: str, reshard: bool) -> str:
    """zero1, hsdp, 'fsdp' (resharding after forward) or 'fsdp, no resharding'."""
    if variant == "fsdp":
        return "fsdp" if reshard else "fsdp, no resharding"
    return variant if variant != "hsdp" or reshard else "hsdp, no resharding"


@dataclass(frozen=True)
class Crossover:
    """Along the swept sizes at one (variant, GPUs, precision, budget): the sharded variant's and
    DDP's values and the smallest size where the sharded one exceeds DDP's (None: not within
    the sweep); for the largest batch also the memory model's values and its crossover."""
    gpus: int
    precision: str
    quantity: str
    parameters: list[int]
    sharded: list[float]
    baseline: list[float]
    first_exceeds: int | None
    reshard_after_forward: bool = True
    variant: str = SHARDED
    cap_gib: float | None = None
    budget: str = ""
    rehearsed: bool = False
    predicted_sharded: list[float | None] = field(default_factory=list)
    predicted_baseline: list[float | None] = field(default_factory=list)
    predicted_first_exceeds: int | None = None

    @property
    def name(self) -> str:
        return label(self.variant, self.reshard_after_forward)


@dataclass(frozen=True)
class C9Verdict:
    verdict: str
    crossovers: list[Crossover] = field(default_factory=list)
    one_rank: list[dict[str, Any]] = field(default_factory=list)   # rows at gpus 1 (the variants' own cost)
    predicted: list[dict[str, Any]] | None = None                   # closed forms per budget, where not measured
    cap_gib: float | None = None                                    # the largest budget of the rows
    rehearsed: bool = False                                         # every crossover from rehearsed ranks
    budgets: dict[str, float] = field(default_factory=dict)         # name -> GiB, as the rows say


def _cap(row: dict[str, Any]) -> float | None:
    c = row.get("cap_gib")
    return None if c is None or (isinstance(c, float) and math.isnan(c)) else float(c)


def crossovers(rows: list[dict[str, Any]]) -> list[Crossover]:
    """Every (sharded variant, resharding, GPUs >= 2, precision, budget) series with DDP beside
    it, each quantity (the throughput only where not rehearsed)."""
    out = []
    series = sorted({(str(r["variant"]), bool(r["reshard_after_forward"]), int(r["gpus"]), str(r["precision"]),
                      _cap(r) or 0.0, str(r.get("budget") or ""), bool(r.get("rehearsed")))
                     for r in rows if r["variant"] in SHARDED_VARIANTS and int(r["gpus"]) >= 2})
    for variant, reshard, gpus, precision, cap, budget, rehearsed in series:
        def at(v: str, p: int) -> dict[str, Any] | None:
            return next((r for r in rows if r["variant"] == v and int(r["gpus"]) == gpus
                         and r["precision"] == precision and int(r["parameters"]) == p
                         and (_cap(r) or 0.0) == cap and str(r.get("budget") or "") == budget
                         and bool(r.get("rehearsed")) == rehearsed
                         and (v not in ("fsdp", "hsdp") or bool(r["reshard_after_forward"]) == reshard)), None)
        for q in QUANTITIES if not rehearsed else QUANTITIES[:1]:
            sizes = sorted({int(r["parameters"]) for r in rows if r["variant"] == variant}
                           & {int(r["parameters"]) for r in rows if r["variant"] == BASELINE})
            pts = [(p, _value(at(variant, p), q), _value(at(BASELINE, p), q)) for p in sizes]
            pts = [(p, s, b) for p, s, b in pts if s is not None and b is not None]
            if not pts:
                continue
            ps = [p for p, _, _ in pts]
            first = next((p for p, s, b in pts if s > b and beyond_bracket(at(BASELINE, p), s, q)), None)
            pred_s = [_predicted(at(variant, p)) for p in ps] if q == "largest_batch" else []
            pred_b = [_predicted(at(BASELINE, p)) for p in ps] if q == "largest_batch" else []
            pred_first = next((p for p, s, b in zip(ps, pred_s, pred_b) if s is not None and b is not None and s > b),
                              None)
            out.append(Crossover(gpus, precision, q, ps, [s for _, s, _ in pts], [b for _, _, b in pts], first,
                                 reshard, variant, cap or None, budget, rehearsed, pred_s, pred_b, pred_first))
    return out


def verdict_from(rows: list[dict[str, Any]]) -> C9Verdict:
    """Sharding pays (confirmed) where a sharded variant's largest batch and its throughput there
    both exceed DDP's at some swept size on real GPUs; needs nuance where only the batch does
    (on rehearsed ranks the throughput is never measured: it needs real GPUs), or neither within
    the sweep; not measured without two ranks (then the closed forms' prediction at the rows'
    budgets)."""
    one = [r for r in rows if int(r["gpus"]) == 1]
    caps = sorted({c for r in rows if (c := _cap(r)) is not None})
    budgets = {str(r.get("budget") or f"{_cap(r):g} GiB"): _cap(r) for r in rows if _cap(r) is not None}
    found = crossovers(rows)
    if not found:   # the closed forms at the rows' budgets, else at the named devices' (c9.predicted.BUDGETS)
        sizes = sorted({int(r["parameters"]) for r in rows if r.get("parameters")})
        pred = [dict(prediction(sizes, gib), budget=name) for name, gib in (budgets or BUDGET_GIB).items()]
        return C9Verdict(NOT_RUN, [], one, pred, caps[-1] if caps else None, budgets=budgets)
    batch = any(c.first_exceeds is not None for c in found if c.quantity == "largest_batch")
    speed = any(c.first_exceeds is not None for c in found if c.quantity == "samples_per_s_at_largest")
    rehearsed = all(c.rehearsed for c in found)
    return C9Verdict(CONFIRMED if batch and speed else NUANCE, found, one, None, caps[-1] if caps else None,
                     rehearsed, budgets)
