"""C9's largest_batch rows from rehearsed ranks (claims.c9.rehearsal's records: one per variant,
rank count and model size, each with its searches per budget), with the memory model's largest
batch beside each: what the rank holds at its peak besides activations (the state, less the
gradients where the peak is the backward's, plus the units held unsharded) leaves of the
budget, over one sample's activations, both measured on DDP's one-rank trials at that size (the
peak is a straight line in the batch: its slope is the activations of a sample; its intercept,
less what the model says DDP holds at its peak, the allocator's overhead); the budgets N ranks
could not rehearse say why; DDP where its N ranks did not fit but one rank held not even
batch 1 (ddp_from_one_rank); C9's finding (the ledger's words) from those rows. Torch-free.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from dpbench.analysis.memory_model import MIB, backward_after_zero_grad, setting_of
from dpbench.analysis.rehearsal import short_reason
from dpbench.claims.c9 import text
from dpbench.claims.c9.predicted import BUDGET_GIB, peak_state_bytes, predicted_largest_batch
from dpbench.claims.c9.verdict import CONDITIONS_ID, Crossover, row_id, verdict_from
from dpbench.claims.records import Finding, ProbeRecord, obs
from dpbench.plan import variants

INTERCONNECT = "one GPU, rehearsed ranks over gloo"
DDP_FROM_ONE_RANK = "from_one_rank"   # a DDP row carried from its one-rank search (ddp_from_one_rank)
NOT_EVEN_ONE = "not even batch 1 fits"   # how a row whose search found no batch begins its reason
CUT_SHORT = "search cut short"           # how a row whose search ran out of time begins it


def line(trials: list[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(intercept, slope) in MiB of the measured trials' peaks against the batch (least squares)."""
    pts = [(t["batch"], t["peak_mib"]) for t in trials if t.get("how") == "measured" and t.get("peak_mib") is not None]
    if len({b for b, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(b for b, _ in pts) / n, sum(p for _, p in pts) / n
    slope = sum((b - mx) * (p - my) for b, p in pts) / sum((b - mx) ** 2 for b, _ in pts)
    return my - slope * mx, slope


def backward_peaks(rec: Mapping[str, Any]) -> bool:
    """Whether every rank's profiled step peaked in its backward, after zero_grad freed the
    gradients (memory_model.backward_after_zero_grad)."""
    rows = rec.get("memory_components") or []
    return bool(rows) and all(backward_after_zero_grad(m) for m in rows)


def one_rank_fit(records: list[Mapping[str, Any]]) -> dict[str, tuple[float, float, bool]]:
    """size -> (overhead MiB, activations MiB per sample, whether the peak is the backward's) from
    DDP's one-rank trials there and its profiled step."""
    out = {}
    for r in records:
        if r.get("variant") == "ddp" and int(r.get("gpus") or 0) == 1 and r.get("search_trials"):
            fit, s = line(r["search_trials"]), setting_of(r)
            if fit and s is not None:
                backward = backward_peaks(r)
                out[str(r["size"])] = (fit[0] - peak_state_bytes(s, backward) / MIB, fit[1], backward)
    return out


def c9_rows(records: Iterable[Mapping[str, Any]], budgets: Mapping[str, float]) -> list[dict[str, Any]]:
    """One largest_batch row (results.LARGEST_BATCH_COLUMNS) per record and budget."""
    recs = list(records)
    fits = one_rank_fit(recs)
    rows = []
    for r in recs:
        if not r.get("size") or not r.get("parameters"):   # a case the ranks never reached, as older
            continue                                       # rehearsals wrote it: no model to name
        cfg = r.get("config") or {}
        size = str(r.get("size"))
        width, layers = (int(x) for x in size.split("x"))
        s = setting_of(r)
        for name, gib in budgets.items():
            found = (r.get("search") or {}).get(name)
            reason = short_reason(r.get("reason") or r.get("search_skipped"))
            largest = None
            if found is not None and found.get("cut_short"):   # a lower bound is not C9's largest
                reason = (f"{CUT_SHORT} by the launch's time budget (batch {found['largest']} fits so far)"
                          if found["largest"] else f"{CUT_SHORT} by the launch's time budget")
            elif found is not None:
                largest = found["largest"] or None
                if not largest:
                    reason = f"{NOT_EVEN_ONE} (peak {found['trials'][0][2]:,.0f} MiB at batch 1)" \
                        if found.get("trials") else NOT_EVEN_ONE
            elif r.get("status") == "ok":
                reason = reason or "not searched"
            pred = None
            if s is not None and size in fits:
                overhead, per_sample, backward = fits[size]
                pred = predicted_largest_batch(s, gib, per_sample, overhead, backward)
            rows.append({"workload": f"transformer-lm-{width}x{layers}", "parameters": r.get("parameters"),
                         "variant": r["variant"], "gpus": int(r["gpus"]),
                         "reshard_after_forward": bool(cfg.get("reshard_after_forward", True))
                         if r["variant"] in ("fsdp", "hsdp") else False,
                         "precision": str(cfg.get("precision", "fp32")), "largest_batch": largest,
                         "samples_per_s_at_largest": None, "cap_gib": gib, "reason": reason, "budget": name,
                         "rehearsed": True, "predicted_largest_batch": pred,
                         "smallest_failing": (found or {}).get("smallest_failing")})
    return rows


def searched(row: Mapping[str, Any]) -> bool:
    """Whether a row's search ran at its budget (a largest batch, none at all, or a lower bound)."""
    return row["largest_batch"] is not None or str(row.get("reason") or "").startswith((NOT_EVEN_ONE, CUT_SHORT))


def found(row: Mapping[str, Any]) -> bool:
    """Whether a row's search ran to its end: a largest batch, or not even batch 1."""
    return row["largest_batch"] is not None or str(row.get("reason") or "").startswith(NOT_EVEN_ONE)


def mark_not_fitting(rows: list[dict[str, Any]], not_fitting: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of budgets N ranks cannot rehearse on one GPU (not_fitting.json) say so, with the
    sum; a row whose search ran there (on a larger GPU) keeps what it found."""
    for nf in not_fitting:
        for r in rows:
            if r["gpus"] == nf["ranks"] and r["budget"] == nf["budget"] and not searched(r):
                r["reason"] = nf["reason"]
    return rows


def ddp_from_one_rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DDP's row at N ranks where a sharded variant's search ran to its end but DDP's did not
    (its N ranks do not fit the GPU) and its one-rank search found not even batch 1 within the
    budget: 0 at N too, the one-rank row's reason carried with its N. DDP keeps the whole model,
    its gradients and its optimizer state on every rank, so a rank's memory at a batch does not
    depend on N (rehearsal_ddp_by_n shows the peaks); a batch that fits is not carried, for it
    may differ by a few across launches."""
    def key(r: Mapping[str, Any]) -> tuple:
        return (r["workload"], r["precision"], r["budget"])

    one = {key(r): r for r in rows if r["variant"] == "ddp" and r["gpus"] == 1
           and r["largest_batch"] is None and str(r.get("reason") or "").startswith(NOT_EVEN_ONE)}
    done = {(key(r), r["gpus"]) for r in rows if r["variant"] == "ddp" and searched(r)}
    carried = sorted({(key(r), r["gpus"]) for r in rows if r["variant"] != "ddp" and r["gpus"] >= 2 and found(r)}
                     - done, key=lambda kg: (kg[0], kg[1]))
    carried = [(k, gpus) for k, gpus in carried if k in one]
    replaced = set(carried)   # a DDP row at such an N says only that its ranks did not fit
    out = [r for r in rows if not (r["variant"] == "ddp" and (key(r), r["gpus"]) in replaced)]
    return out + [{**one[k], "gpus": gpus, "smallest_failing": 1, DDP_FROM_ONE_RANK: True,
                   "reason": f"{one[k]['reason']} on one rank; DDP divides nothing, so not at N = {gpus}"}
                  for k, gpus in carried]


def largest_batch_rows(cases: Iterable[Mapping[str, Any]],
                       not_fitting: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """C9's rows of rehearsed cases at the named budgets (c9.predicted.BUDGETS), the budgets N
    ranks could not rehearse saying why."""
    return ddp_from_one_rank(mark_not_fitting(c9_rows(cases, BUDGET_GIB), not_fitting))


UNDIVIDED = ("parameters", "gradients")   # what the backward's end holds at once, before the step


def undivided_floor_mib(records: Iterable[Mapping[str, Any]], variant: str, size: str) -> float | None:
    """The least a rank of `variant` holds at this model size on any N, where the variant
    divides neither its parameters nor its gradients (DDP, ZeRO-1: variants.spec's shards):
    both, as the backward's end holds them before the step, as a record of it measured them at
    any N (they do not depend on N there). None for a variant that shards either, or no record."""
    if any(kind in variants.spec(variant).shards for kind in UNDIVIDED):
        return None
    for r in records:
        if r.get("variant") == variant and str(r.get("size")) == size:
            for m in r.get("memory_components") or []:
                if all(isinstance(m.get(f"{k}_mib"), (int, float)) for k in UNDIVIDED):
                    return sum(m[f"{k}_mib"] for k in UNDIVIDED)
    return None


def open_cells(crossovers: Iterable[Crossover], records: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per rehearsed crossover (budget, N, sharded variant), the swept model sizes it lacks
    (its own row or DDP's has no searched value there) that could still move where it first
    exceeds DDP: every one below a crossover found, every one where none was. A size where the
    variant's undivided floor passes the budget fits no batch (so it cannot exceed DDP there):
    it is closed, with that floor. Each: budget, cap_gib, gpus, label, parameters, size, floor_mib
    (None: open)."""
    sizes = {int(r["parameters"]): str(r["size"]) for r in records if r.get("size") and r.get("parameters")}
    out = []
    for c in crossovers:
        if not c.rehearsed or c.quantity != "largest_batch":
            continue
        for p in sorted(set(sizes) - set(c.parameters)):
            if c.first_exceeds is not None and p > c.first_exceeds:
                continue   # the first size where it exceeds is already below this one
            floor = undivided_floor_mib(records, c.variant, sizes[p])
            closed = floor is not None and c.cap_gib is not None and floor > c.cap_gib * 1024
            out.append({"budget": c.budget, "cap_gib": c.cap_gib, "gpus": c.gpus, "label": c.name, "parameters": p,
                        "size": sizes[p], "floor_mib": floor if closed else None})
    return out


def probe_record(rows: list[dict[str, Any]]) -> ProbeRecord:
    """The rows as C9's probe record (the ledger's input), rehearsed on one GPU."""
    observations = [obs(CONDITIONS_ID, "where", interconnect=INTERCONNECT)]
    observations += [obs(row_id(r), "a row", **r) for r in rows]
    ran_on = {"device_type": "cuda", "gpus_visible": 1}
    return ProbeRecord("C9", "C9", ran_on, observations, verdict_from(rows).verdict, "")


class _Evidence:
    """What claims.c9.text.finding reads of the ledger's evidence: the one probe record."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.probes = {"C9": probe_record(rows)}

    def measured_on_probe(self, claim: str) -> str:
        return "rehearsal"

    def gpus_found(self) -> int:
        return 1


def finding(rows: list[dict[str, Any]]) -> Finding:
    """C9 as the ledger words it from these largest_batch rows."""
    return text.finding(_Evidence(rows))
