"""Turn the finished runs' records into the tidy tables (one row per observation), once.

runs.csv holds a row a run, with the identities its plan gave it (plan.json's, joined by run id);
cells.csv a row a cell (by the plan's cell_id): its medians, ratios and intervals, in the
workload's unit. Every later reader takes a cell's statistics from there, never re-derives them.

    python -m dpbench.analysis.collect --results-dir results --tag TAG --plan results/TAG/plan.json
    python -m dpbench.analysis.collect --runs-dir some/folder --print      # a quick table of any runs
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from statistics import fmean

import pandas as pd

from dpbench import results
from dpbench.analysis import cell_table, memory_model, tables as T, traffic_model
from dpbench.plan.matrix import read_identities
from dpbench.plan.rerun import rerun_command
from dpbench.results.errors import error_text


def _ident(rec: dict) -> dict:
    return {"run_id": rec["run_id"], "variant": rec["variant"], "gpus": rec["gpus"],
            "options": results.options_label(rec.get("options")), "repeat": rec["repeat"]}


def model_mib(row: dict) -> float:
    """Allocated memory without the dataset held on the device: what the model and optimizer cost."""
    data = row.get("data_mib")
    return row["allocated_mib"] - (0.0 if data is None or math.isnan(data) else data)


def device0_excess_ratio(memory: list[dict]) -> float | None:
    """Device 0's model memory over the mean of the other devices' (None with one device)."""
    if len(memory) < 2:
        return None
    by_device = sorted(memory, key=lambda r: r["device"])
    others = fmean(model_mib(r) for r in by_device[1:])
    return model_mib(by_device[0]) / others if others > 0 else None


def planning(rec: dict) -> dict:
    """How the run was planned and seeded (the reader's upgrade() fills these in older
    records), and its setup (the plan's setup id, which the record copies)."""
    return {"scaling": rec["scaling"], "per_gpu_batch": rec["per_gpu_batch"], "seed": rec["seed"],
            "deterministic": rec["deterministic"], "setup": rec["setup_id"]}


def rehearsed(rec: dict) -> bool:
    """Whether the run's ranks shared one GPU (the run option rehearse): its memory is per rank,
    its speed nobody's."""
    return bool((rec.get("config") or {}).get("rehearse"))


def summary_row(rec: dict) -> dict:
    cfg, tp, mem = rec["config"], rec["throughput"], rec["memory"]
    acc = rec["accuracy"][-1]["test_acc"] if rec["accuracy"] else None
    # A rehearsed run's step times are N ranks taking turns on one GPU over gloo: never a speed
    # (the record keeps them; no table, figure or summary reads them as one).
    tp = {**tp, "images_per_s": None, "step_ms_p50": None, "step_ms_p95": None} if rehearsed(rec) else tp
    return {**_ident(rec), "status": rec["status"], "reason": rec["reason"], "rehearsed": rehearsed(rec),
            "images_per_s": tp["images_per_s"], "step_ms_p50": tp["step_ms_p50"],
            "step_ms_p95": tp["step_ms_p95"],
            "peak_mem_mib": max((r["allocated_mib"] for r in mem), default=None),
            "mem_dev0_over_mean_others": device0_excess_ratio(mem),
            "n_warnings": sum(w["count"] for w in rec["warnings"]),
            "final_loss": rec["final_loss"], "test_acc": acc, "wall_s": rec["wall_s"],
            "timed_steps": tp["timed_steps"], "global_batch": cfg["global_batch"],
            "precision": cfg["precision"], "feed": cfg["feed"], "dataset": cfg["dataset"],
            "device_type": rec["device_type"], **planning(rec), "workload": results.workload_name(rec),
            **rate_fields(rec)}


def rate_fields(rec: dict) -> dict:
    """Throughput in the workload's own unit: tokens/s for a token workload, images/s for an
    image one (a record before workloads trained images), and the step's regime."""
    tp, unit = rec["throughput"], rec.get("sample_unit") or "images"
    rate = tp.get("tokens_per_s") if unit == "tokens" else tp.get("samples_per_s", tp.get("images_per_s"))
    return {"sample_unit": unit, "samples_per_s": tp.get("samples_per_s"), "tokens_per_s": tp.get("tokens_per_s"),
            "rate": rate, "rate_unit": f"{unit}/s", "host_step_ms": tp.get("host_step_ms"), "bound": tp.get("bound")}


# What a run's steps.csv must hold for its curve to be read (the writer writes all of STEP_COLUMNS).
REQUIRED_STEP_COLUMNS = ("epoch", "step", "loss_global")


def read_steps(rdir: Path, rec: dict) -> list[dict]:
    """A run's steps.csv as rows ([] where the run wrote none). A file the writer cannot have
    left (cut short, a row with too few or too many fields, fewer or more rows than the record's
    steps) raises ValueError saying what is wrong."""
    path = rdir / results.STEPS
    if not path.exists():
        return []
    text = path.read_text()
    if not text.endswith("\n"):   # the writer ends every line, the last one too
        raise ValueError("cut short: its last line is incomplete" if text else "empty")
    lines = list(csv.reader(text.splitlines()))
    header, body = lines[0], lines[1:]
    missing = [c for c in REQUIRED_STEP_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"its header has no column {missing[0]!r}")
    for i, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"line {i} has {len(row)} fields, the header {len(header)}")
    expected = rec.get("steps")
    if isinstance(expected, int) and not isinstance(expected, bool) and expected and len(body) != expected:
        raise ValueError(f"{len(body)} rows where the record counts {expected} steps")
    return [dict(zip(header, row)) for row in body]


def step_rows(rec: dict, rdir: Path) -> list[dict]:
    return [{**_ident(rec), **row} for row in read_steps(rdir, rec)]


def damaged(path: Path, error: Exception) -> dict:
    """The record of a run whose metrics.json (or steps.csv) cannot be read: a failed run that
    says which file and how to remake it, so the rest of the matrix is still collected."""
    rid = path.parent.name
    parts = results.parse_run_id(rid)
    target = path.parent / results.METRICS   # what the pipeline's train rule makes
    # the set's own experiment and config (plan.json): the command works as printed for this set
    command = rerun_command(path.parent.parent.parent, target, extra=("--forcerun", "train"))
    reason = f"{path}{results.DAMAGED_MARK}{error_text(error)}); rerun it: {command}"
    return {"run_id": rid, "variant": parts.variant if parts else "", "gpus": parts.gpus if parts else 0,
            "repeat": parts.repeat if parts else 0, "options": {}, "status": results.STATUS_FAILED,
            "reason": reason, "damaged": True}


def _readable(rec: dict | results.DamagedRecord, rdir: Path) -> dict:
    """The record, or a failed run naming the file where its metrics.json or steps.csv is damaged."""
    if isinstance(rec, results.DamagedRecord):
        return damaged(rec.path, rec.error)
    try:
        read_steps(rdir, rec)
    except (OSError, ValueError, UnicodeDecodeError, csv.Error) as exc:
        return damaged(rdir / results.STEPS, exc)
    return rec


def read_record(path: Path) -> dict:
    return _readable(results.read_run(path), Path(path).parent)


def find_runs(folder: Path) -> list[tuple[dict, Path]]:
    """(record, run folder) of every finished run in a folder of run folders, sorted by name; a
    damaged record (or steps.csv) comes as a failed run that names its file."""
    return [(_readable(rec, rdir), rdir) for rec, rdir in results.iter_runs(folder, damaged=True)]


def memory_component_rows(rec: dict) -> list[dict]:
    """The record's memory_components (none in older records), one row per device, with the
    state measured as the profiled step's forward began and the closed forms' predictions."""
    rows = rec.get("memory_components")
    if not isinstance(rows, list):
        return []
    data = {m["device"]: m.get("data_mib") for m in rec.get("memory") or []}
    out = []
    for m in rows:
        row = {**_ident(rec), "parameters": rec.get("parameters"), "data_mib": data.get(m["device"]),
               "rehearsed": rehearsed(rec),
               **{k: m.get(k) for k in results.MEMORY_COMPONENT_COLUMNS if k in m}}
        out.append({**row, "state_mib": memory_model.measured_state(row),
                    **memory_model.predicted_row(rec, row)})
    return out


def damaged_row(rec: dict) -> dict:
    return {**_ident(rec), "status": rec["status"], "reason": rec["reason"]}


def tables(runs: list[tuple[dict, Path]], identities: dict[str, results.Identity] | None = None
           ) -> dict[str, list[dict]]:
    """Every table's rows; `identities`: plan.json's (run id -> Identity), which the rows copy."""
    identities = identities or {}
    out: dict[str, list[dict]] = {name: [] for name in results.TABLES}
    for rec, rdir in runs:
        ident = _ident(rec)
        if rec.get("damaged"):
            out["summary"].append(damaged_row(rec))
            continue
        out["summary"].append(summary_row(rec))
        out["memory"] += [{**ident, **{k: m.get(k) for k in results.MEMORY_COLUMNS if k in m}}
                          for m in rec["memory"]]
        out["warnings"] += [{**ident, **w} for w in rec["warnings"]]
        out["accuracy"] += [{**ident, **a} for a in rec["accuracy"]]
        out["steps"] += step_rows(rec, rdir)
        out["memory_components"] += memory_component_rows(rec)
        out["collectives"] += [{**ident, **row} for row in traffic_model.collective_rows(rec)]
    out["runs"] = [{**row, **run_identity(rec, identities)} for row, (rec, _) in zip(out["summary"], runs)]
    out["cells"], out["medians"] = cell_rows(out["runs"])
    return out


def run_identity(rec: dict, identities: dict[str, results.Identity]) -> dict:
    """A run's cell_id and group: the plan's (plan.json), else the record's own copy (a damaged
    record's from its folder's name: identity_of)."""
    ident = identities.get(rec["run_id"]) or (
        results.identity_of(rec["run_id"], {}) if rec.get("damaged") else
        results.Identity(rec["run_id"], rec["cell_id"], rec["setup_id"], rec["group"]))
    return {"cell_id": ident.cell_id, "group": ident.group}


def cell_rows(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """One row per cell: its medians and ratios with their intervals (dpbench.analysis.cell_table does
    the statistics, once), keyed by the runs' cell_id; and the same in long form (medians.csv, the
    layout of the references, which the frozen fixtures check the statistics against)."""
    frame = T.with_run_defaults(results.SCHEMAS["runs"].typed(pd.DataFrame(runs, columns=results.RUN_COLUMNS)))
    cells = cell_table.cells(frame)
    if cells.empty:
        return [], []
    ids = frame.drop_duplicates(["variant", "gpus", "options"]).set_index(["variant", "gpus", "options"])["cell_id"]
    cells.insert(0, "cell_id", [ids[k] for k in zip(cells["variant"], cells["gpus"], cells["options"])])
    wide = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in cells.to_dict("records")]
    return wide, cell_table.cell_rows(cells)


def read_cells(results_dir: Path | str, tag: str) -> "pd.DataFrame":
    """cells.csv, typed and sorted; for a set collected before it existed, the same rows computed
    from its runs (as collect would write them), so an older set draws and reads as a new one."""
    if results.table_path(results_dir, tag, "cells").exists():
        return T.load_table(results_dir, tag, "cells")
    runs = results.read_table(results_dir, tag, "runs")
    cells = pd.DataFrame(cell_rows(runs.to_dict("records"))[0], columns=results.CELLS_COLUMNS)
    return T.sort(results.SCHEMAS["cells"].typed(cells))


def provenance_summary(records: list[dict], tag: str) -> dict:
    """Each provenance key with the value shared by the ok runs, or the sorted distinct values."""
    readable = [r for r in records if isinstance(r.get("provenance"), dict)]
    ok = [r["provenance"] for r in readable if r["status"] == results.STATUS_OK] or \
         [r["provenance"] for r in readable]
    merged: dict = {"tag": tag, "n_runs": len(records)}
    for key in sorted({k for p in ok for k in p}):
        # A run that did not learn a key (a skipped run has no GPU facts: None) says nothing of it.
        values = {repr(p[key]): p[key] for p in ok if p.get(key) is not None}
        merged[key] = None if not values else next(iter(values.values())) if len(values) == 1 else \
            [values[k] for k in sorted(values)]
    return merged


def collect(results_dir: Path, tag: str, metrics_files: list[Path] | None = None,
            plan: Path | None = None) -> dict[str, Path]:
    """Tables of the given runs (the experiment's plan), or of every finished run of the tag;
    `plan`: its plan.json, whose identities the rows take."""
    if metrics_files is None:
        runs = find_runs(results.runs_dir(results_dir, tag))
    else:   # runs left over from an earlier matrix stay out of this one's tables
        runs = [(read_record(Path(f)), Path(f).parent) for f in sorted(map(str, metrics_files))]
    written = {}
    identities = read_identities(plan) if plan is not None and Path(plan).is_file() else {}
    for name, rows in tables(runs, identities).items():
        path = results.table_path(results_dir, tag, name)
        results.write_csv(path, results.TABLES[name], rows)
        written[name] = path
    results.write_json(results.provenance_path(results_dir, tag),
                       provenance_summary([rec for rec, _ in runs], tag))
    return written


def print_summary(runs: list[tuple[dict, Path]], file=sys.stdout) -> None:
    """A compact fixed-width table for logs and terminals."""
    cols = ["run_id", "status", "images_per_s", "step_ms_p50", "step_ms_p95", "peak_mem_mib",
            "n_warnings", "final_loss", "test_acc"]
    # The folder names the run: outside the pipeline two folders may hold the same run id.
    rows = [dict(damaged_row(rec) if rec.get("damaged") else summary_row(rec), run_id=rdir.name)
            for rec, rdir in runs]
    fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)), file=file)
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)), file=file)
    for rec, rdir in runs:
        mem = ", ".join(f"dev{m['device']} {m['allocated_mib']:.0f}/{m['reserved_mib']:.0f}/"
                        f"{m['nvml_used_mib'] or 0:.0f}" for m in rec.get("memory", []))
        if mem:
            print(f"  {rdir.name}: memory MiB allocated/reserved/nvml: {mem}", file=file)
    for rec, rdir in runs:
        if rec["status"] != results.STATUS_OK:
            print(f"  {rdir.name}: {rec['status']}: {rec['reason']}", file=file)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", type=Path, default=Path("results"))
    p.add_argument("--tag")
    p.add_argument("--runs-dir", type=Path, help="print a table of the runs in this folder")
    p.add_argument("--print", action="store_true", help="print the summary table")
    p.add_argument("--plan", type=Path, help="the set's plan.json: the runs' identities (default: the records')")
    p.add_argument("runs", nargs="*", type=Path, help="the runs' metrics.json (default: all of the tag's)")
    args = p.parse_args(argv)
    if args.runs_dir:
        print_summary(find_runs(args.runs_dir))
        return 0
    if not args.tag:
        p.error("--tag is required with --results-dir")
    try:
        collect(args.results_dir, args.tag, args.runs or None, args.plan)
        if args.print:
            print_summary([(read_record(f), f.parent) for f in args.runs] if args.runs
                          else find_runs(results.runs_dir(args.results_dir, args.tag)))
    except (results.RecordFormatError, results.NotWritable) as exc:   # a newer dpbench's record,
        p.exit(2, f"collect: {exc}\n")                                  # a read-only set: one line
    return 0


if __name__ == "__main__":
    sys.exit(main())
