"""Rehearsed ranks' records (claims.c9.rehearsal's JSON lines, or runs with the option rehearse)
as tables: per variant, rank count and model size, each memory component per rank measured
beside the memory model (memory_model.comparison), and each collective counted beside the
traffic model. Numbers only (torch-free).
"""
from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any, Iterable, Mapping

from dpbench.analysis import memory_model, traffic_model
from dpbench.analysis.memory_model import is_number

MEMORY_COLUMNS = ["size", "variant", "gpus", "component", "measured_mib", "measured_max_mib", "predicted_mib",
                  "relative_difference", "beyond_tolerance"]
TRAFFIC_COLUMNS = ["size", "variant", "gpus", "collective", "count", "bytes", "predicted_bytes",
                   "relative_difference", "source"]


def variant_label(rec: Mapping[str, Any]) -> str:
    """ddp, zero1, fsdp, 'fsdp-keep' (no resharding after forward), hsdp."""
    cfg = rec.get("config") or {}
    v = str(rec.get("variant"))
    return v + "-keep" if v in ("fsdp", "hsdp") and cfg.get("reshard_after_forward") is False else v


def component_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The record's memory_components as collect writes them (one row per rank), with the
    state measured at the profiled forward's start and the closed forms' predictions."""
    rows = []
    for m in rec.get("memory_components") or []:
        # options: the size and per-rank batch, one key across N and across fsdp's ways (at one
        # rank nothing is gathered, so fsdp's one-rank row predicts fsdp-keep's and hsdp's activations)
        row = {"run_id": rec.get("run_id"), "variant": rec.get("variant"), "gpus": rec.get("gpus"),
               "options": f"{rec.get('size')}|b{(rec.get('options') or {}).get('per_gpu_batch')}",
               "device": m.get("device"), "parameters": rec.get("parameters"), **m}
        rows.append({**row, "state_mib": memory_model.measured_state(row), **memory_model.predicted_row(rec, row)})
    return rows


def memory_table(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (size, variant, N, component): the ranks' mean measured (and their max: ZeRO-1's
    partitions are uneven), the model's, the relative difference of the mean and the flag."""
    recs = [r for r in records if r.get("status") == "ok"]
    rows = [row for r in recs for row in component_rows(r)]
    size_of = {r.get("run_id"): (str(r.get("size")), variant_label(r)) for r in recs}
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for c in memory_model.comparison(rows):
        size, label = size_of[c["run_id"]]
        groups[(size, label, int(c["gpus"]), c["component"])].append(c)
    out = []
    for (size, label, gpus, component), cs in sorted(groups.items(), key=lambda kv: sort_key(kv[0])):
        measured, predicted = mean(c["measured_mib"] for c in cs), mean(c["predicted_mib"] for c in cs)
        rel = measured / predicted - 1.0 if predicted else (0.0 if measured == 0 else float("inf"))
        out.append({"size": size, "variant": label, "gpus": gpus, "component": component,
                    "measured_mib": measured, "measured_max_mib": max(c["measured_mib"] for c in cs),
                    "predicted_mib": predicted, "relative_difference": rel,
                    "beyond_tolerance": abs(rel) > memory_model.TOLERANCE})
    return out


VARIANT_ORDER = ("ddp", "zero1", "fsdp", "fsdp-keep", "hsdp", "hsdp-keep")
COMPONENT_ORDER = memory_model.COMPARED


def sort_key(key: tuple) -> tuple:
    size, label, gpus, *rest = key
    order = VARIANT_ORDER.index(label) if label in VARIANT_ORDER else len(VARIANT_ORDER)
    comp = COMPONENT_ORDER.index(rest[0]) if rest and rest[0] in COMPONENT_ORDER else len(COMPONENT_ORDER)
    return (size, order, gpus, comp, *rest)


def traffic_table(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (size, variant, N, collective): rank 0's counted collectives against the traffic
    model (rows the counter did not count, DDP's buckets, carry no difference)."""
    out = []
    for r in records:
        if r.get("status") != "ok":
            continue
        for row in traffic_model.collective_rows(r):
            p, b = row.get("predicted_bytes"), row.get("bytes")
            counted = row.get("source") != "buckets"
            rel = (b / p - 1.0 if p else (0.0 if b == 0 else float("inf"))) \
                if counted and is_number(p) and is_number(b) else None
            out.append({"size": str(r.get("size")), "variant": variant_label(r), "gpus": int(r["gpus"]),
                        "collective": row["collective"], "count": row["count"], "bytes": b, "predicted_bytes": p,
                        "relative_difference": rel, "source": row.get("source") or ""})
    return sorted(out, key=lambda x: sort_key((x["size"], x["variant"], x["gpus"], x["collective"])))
