"""C9's largest_batch rows from rehearsed ranks (claims.c9.rehearsal's records: one per variant,
rank count and model size, each with its searches per budget), with the memory model's largest
batch beside each: what the state and the gathered units leave of the budget, over one sample's
activations, both measured on DDP's one-rank trials at that size (the peak is a straight line
in the batch: its slope is the activations of a sample, its intercept less the modelled state
the allocator's overhead). Torch-free.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from dpbench.analysis.memory_model import MIB, predicted_bytes, setting_of
from dpbench.claims.c9.predicted import predicted_largest_batch


def line(trials: list[Mapping[str, Any]]) -> tuple[float, float] | None:
    """(intercept, slope) in MiB of the measured trials' peaks against the batch (least squares)."""
    pts = [(t["batch"], t["peak_mib"]) for t in trials if t.get("how") == "measured" and t.get("peak_mib") is not None]
    if len({b for b, _ in pts}) < 2:
        return None
    n = len(pts)
    mx, my = sum(b for b, _ in pts) / n, sum(p for _, p in pts) / n
    slope = sum((b - mx) * (p - my) for b, p in pts) / sum((b - mx) ** 2 for b, _ in pts)
    return my - slope * mx, slope


def one_rank_fit(records: list[Mapping[str, Any]]) -> dict[str, tuple[float, float]]:
    """size -> (overhead MiB, activations MiB per sample) from DDP's one-rank trials there."""
    out = {}
    for r in records:
        if r.get("variant") == "ddp" and int(r.get("gpus") or 0) == 1 and r.get("search_trials"):
            fit, s = line(r["search_trials"]), setting_of(r)
            if fit and s is not None:
                state = float(predicted_bytes(s)["state"] or 0) / MIB
                out[str(r["size"])] = (fit[0] - state, fit[1])
    return out


def c9_rows(records: Iterable[Mapping[str, Any]], budgets: Mapping[str, float]) -> list[dict[str, Any]]:
    """One largest_batch row (results.LARGEST_BATCH_COLUMNS) per record and budget."""
    recs = list(records)
    fits = one_rank_fit(recs)
    rows = []
    for r in recs:
        if not r.get("size"):   # a case the ranks never reached, as older rehearsals wrote it: no model to name
            continue
        cfg = r.get("config") or {}
        size = str(r.get("size"))
        width, layers = (int(x) for x in size.split("x"))
        s = setting_of(r)
        for name, gib in budgets.items():
            found = (r.get("search") or {}).get(name)
            reason = str(r.get("reason") or r.get("search_skipped") or "")
            largest = None
            if found is not None:
                largest = found["largest"] or None
                if not largest:
                    reason = f"not even batch 1 fits (peak {found['trials'][0][2]} MiB at batch 1)" \
                        if found.get("trials") else "not even batch 1 fits"
            elif r.get("status") == "ok":
                reason = reason or "not searched"
            pred = None
            if s is not None and size in fits:
                overhead, per_sample = fits[size]
                pred = predicted_largest_batch(s, gib, per_sample, overhead)
            rows.append({"workload": f"transformer-lm-{width}x{layers}", "parameters": r.get("parameters"),
                         "variant": r["variant"], "gpus": int(r["gpus"]),
                         "reshard_after_forward": bool(cfg.get("reshard_after_forward", True))
                         if r["variant"] in ("fsdp", "hsdp") else False,
                         "precision": str(cfg.get("precision", "fp32")), "largest_batch": largest,
                         "samples_per_s_at_largest": None, "cap_gib": gib, "reason": reason, "budget": name,
                         "rehearsed": True, "predicted_largest_batch": pred,
                         "smallest_failing": (found or {}).get("smallest_failing")})
    return rows
