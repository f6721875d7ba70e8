"""Rehearsed ranks' records (claims.c9.rehearsal's JSON lines, or runs with the option rehearse)
as tables: the launches' tars read and combined into one set (the newest launch's record of a
case wins), then per variant, rank count and model size, each memory component per rank measured
beside the memory model (memory_model.comparison), and each collective counted beside the
traffic model. Numbers only (torch-free).
"""
from __future__ import annotations

import json
import re
import tarfile
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any, Iterable, Mapping, Sequence

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


SOURCE = "source_launch"   # the combined record's launch (a record's own "launch" is its torchrun's shape)
SEARCH_FROM = "search_from"  # budget -> the launch whose search a combined record carries


def read_launch(path: Path | str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One launch's tar: rank 0's records (records.jsonl as rehearse.py packs them, or the raw work
    folder's cases-<N>.jsonl) and its not_fitting.json (budgets N ranks could not rehearse)."""
    records: list[dict[str, Any]] = []
    not_fitting: list[dict[str, Any]] = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            f = tar.extractfile(member) if member.isfile() else None
            if f is None:
                continue
            if name == "records.jsonl" or re.fullmatch(r"cases-\d+\.jsonl", name):
                records += [json.loads(x) for x in f.read().decode().splitlines() if x.strip()]
            elif name == "not_fitting.json":
                not_fitting += json.loads(f.read())
    return records, not_fitting


def size_prefix(rec: Mapping[str, Any]) -> str:
    """The case's size name ('12m' of '12m-fsdp-keep'): one name per model across launches."""
    return str(rec.get("case") or rec.get("run_id") or "").split("-")[0]


def case_key(rec: Mapping[str, Any]) -> tuple:
    """(size, variant label, N, launched): what two launches both measured when they agree."""
    return (str(rec.get("size")), variant_label(rec), int(rec.get("gpus") or 0), bool(rec.get("launched")))


def combine(launches: Sequence[tuple[str, Iterable[Mapping[str, Any]]]]) -> list[dict[str, Any]]:
    """The records of every launch (oldest first, each named), one per case: where two launches
    hold the same (size, variant, N) the later one's record wins, whatever its status (a failed
    case stays a row with its reason). Each record names its launch (SOURCE); a case the ranks never
    reached (older launches wrote no model for it) takes its size and parameter count from a
    record of the same size name in any launch, and its resharding from its case name. A budget
    the winning record did not search (N ranks of it did not fit that launch's GPU), or whose
    search its launch's time cut short, keeps the search of the newest earlier ok record of the
    case that searched it to its end, its launch in SEARCH_FROM."""
    named = [{**r, SOURCE: label} for label, recs in launches for r in recs]
    sizes = {size_prefix(r): (r["size"], r.get("parameters")) for r in named if r.get("size") and r.get("parameters")}
    kept: dict[tuple, dict[str, Any]] = {}
    for r in named:
        if not r.get("size") and size_prefix(r) in sizes:
            r["size"], r["parameters"] = sizes[size_prefix(r)]
        elif not r.get("parameters") and size_prefix(r) in sizes:
            r["parameters"] = sizes[size_prefix(r)][1]
        if not r.get("config") and str(r.get("case") or "").endswith("-keep"):   # its case name says how
            r["config"] = {"reshard_after_forward": False}
        older = kept.get(case_key(r))
        if older is not None and r.get("status") == "ok" and older.get("status") == "ok":
            newer = r.get("search") or {}
            carried = {b: v for b, v in (older.get("search") or {}).items()
                       if b not in newer or (newer[b].get("cut_short") and not v.get("cut_short"))}
            if carried:   # a search a smaller GPU could not run, or one cut short, undoes no finished one
                r = {**r, "search": {**newer, **carried},
                     SEARCH_FROM: {**(r.get(SEARCH_FROM) or {}),
                                   **{b: (older.get(SEARCH_FROM) or {}).get(b, older[SOURCE]) for b in carried}}}
        kept[case_key(r)] = r   # later launches overwrite: the newest wins
    return list(kept.values())


_FAILURE = re.compile(r"\[\d+\]:\s*\n\s*time\s*:\s*(\S+)\s*\n\s*host[^\n]*\n\s*rank\s*:\s*(\d+)[^\n]*\n"
                      r"\s*exitcode\s*:\s*(-?\d+)[^\n]*\n[^\n]*\n\s*traceback\s*:\s*([^\n]*)")


def first_failure(log: str) -> str | None:
    """The ranks that failed first in a torchrun log's failure report (the others were stopped
    because of them), and how: "ranks 2, 7: exit code -9, Signal 9 (SIGKILL)"; None where the
    log has no report."""
    found = [(t, int(r), c, re.sub(r"\s*received by PID \d+", "", how).strip())
             for t, r, c, how in _FAILURE.findall(log)]
    if not found:
        return None
    first = min(t for t, *_ in found)
    said: dict[tuple[str, str], list[int]] = {}
    for t, rank, code, how in found:
        if t == first:
            said.setdefault((code, how), []).append(rank)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, sorted(rs)))}: exit code {code}, {how}"
                     for (code, how), rs in said.items())


def launch_log(path: Path | str) -> str:
    """The ranks' log a launch's tar holds (launch-<N>.log), "" where it holds none."""
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if re.fullmatch(r"launch-\d+\.log", Path(member.name).name) and member.isfile():
                return tar.extractfile(member).read().decode(errors="replace")
    return ""


def combine_not_fitting(parts: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The launches' not_fitting entries, one per (N, budget) (the latest's words)."""
    out: dict[tuple, dict[str, Any]] = {}
    for part in parts:
        for nf in part:
            out[(int(nf["ranks"]), str(nf["budget"]))] = dict(nf)
    return [out[k] for k in sorted(out)]


def short_reason(reason: Any) -> str:
    """A failed case's reason on one line: its first line, paths and peer addresses left out."""
    first = str(reason or "").strip().splitlines()[0] if str(reason or "").strip() else ""
    first = re.sub(r"\[/[^\]]*/([^/\]]+)\]", r"[\1]", first)
    return re.sub(r"\s*\[\d+\.\d+\.\d+\.\d+\]:\d+", "", first)


def not_ok_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per case that did not run or failed: size, variant, N, status, reason, its launch."""
    out = [{"size": str(r.get("size")), "variant": variant_label(r), "gpus": int(r.get("gpus") or 0),
            "status": r.get("status"), "reason": short_reason(r.get("reason")), SOURCE: r.get(SOURCE, "")}
           for r in records if r.get("status") != "ok"]
    return sorted(out, key=lambda x: sort_key((x["size"], x["variant"], x["gpus"])))


def not_run_at(records: Iterable[Mapping[str, Any]], size: str) -> list[tuple[str, int]]:
    """(variant, N) of the size's cases that failed or did not run: what the memory figure marks."""
    return [(f["variant"], f["gpus"]) for f in not_ok_rows(records) if f["size"] == size]


def component_rows(rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The record's memory_components as collect writes them (one row per rank), with the
    state measured at the profiled forward's start and the closed forms' predictions."""
    rows = []
    for m in rec.get("memory_components") or []:
        # options: the size and per-rank batch, one key across N and across fsdp's ways (at one
        # rank nothing is gathered, so fsdp's one-rank row predicts fsdp-keep's and hsdp's activations)
        row = {"run_id": rec.get("run_id"), "variant": rec.get("variant"), "gpus": rec.get("gpus"),
               "options": f"{rec.get('size')}|b{(rec.get('options') or {}).get('per_gpu_batch')}",
               "device": m.get("device"), "parameters": rec.get("parameters"),
               "variant_label": variant_label(rec), **m}
        rows.append({**row, "state_mib": memory_model.measured_state(row), **memory_model.predicted_row(rec, row)})
    return rows


def memory_table(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (size, variant, N, component): the ranks' mean measured (and their max: ZeRO-1's
    partitions are uneven), the model's, the relative difference of the mean and the flag, and
    for the peaks the N their prediction came from (reference_gpus). A peak measured where no
    one-rank case predicts it is a row with predicted_mib and relative_difference None."""
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
                    "beyond_tolerance": abs(rel) > memory_model.TOLERANCE,
                    "reference_gpus": max((c["reference_gpus"] or 0 for c in cs), default=0) or None})
    unpredicted: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        size, label = size_of[row["run_id"]]
        for c in memory_model.COMPARED:
            key, measured = (size, label, int(row["gpus"]), c), row.get(memory_model.MEASURED_AS.get(c, f"{c}_mib"))
            if key not in groups and is_number(measured):
                unpredicted[key].append(measured)
    for (size, label, gpus, component), ms in unpredicted.items():
        out.append({"size": size, "variant": label, "gpus": gpus, "component": component, "measured_mib": mean(ms),
                    "measured_max_mib": max(ms), "predicted_mib": None, "relative_difference": None,
                    "beyond_tolerance": False, "reference_gpus": None})
    return sorted(out, key=lambda m: sort_key((m["size"], m["variant"], m["gpus"], m["component"])))


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
