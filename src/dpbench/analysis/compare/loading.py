"""A result set as compare reads it: its tables (typed, checked), provenance and run records,
every row keyed by its cell (CELL). Every failure is an InputError whose message names the file
(and column)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpbench import results as R
from dpbench.analysis.cells import CELL_KEY, cell_key
from dpbench.results.errors import error_text, message_line

class InputError(Exception):
    """An input is missing or damaged; the message names the file (and column)."""


class MissingInput(InputError, FileNotFoundError):
    """An input result set (folder, table or provenance.json) is not there."""


# The column every table of a loaded set keys its cells by (key_cells): the cell_id its plan
# gave each run where every set compared carries one (runs.csv, collected with a plan.json that
# lists identities), else CELL_KEY's (variant, gpus, options label), the fallback for sets
# collected before (every committed reference made before it). CELL_KEY's fields stay what a
# report row shows of its cell either way: a loaded set's "cells" maps each CELL value to them.
CELL = "cell"

# The columns compare reads from each table; numeric ones must hold numbers (or nothing).
COLUMNS = {
    "summary": (["run_id", *CELL_KEY, "repeat", "status", "reason", "device_type"],
                ["gpus", "repeat", "images_per_s", "final_loss", "test_acc"]),
    "memory": (["run_id", *CELL_KEY, "device"], ["gpus", "device", "allocated_mib"]),
    "warnings": (["run_id", *CELL_KEY, "category", "message"], ["gpus", "count"]),
    "steps": (["run_id", *CELL_KEY, "repeat", "epoch", "step"], ["gpus", "repeat", "epoch", "step", "loss_global"]),
}


def _read_table(root: Path | str, tag: str, name: str):
    text, numeric = COLUMNS[name]
    try:
        return R.read_table(root, tag, name, require=text + numeric)
    except R.TableError as exc:
        raise InputError(str(exc)) from None


def _read_json(path: Path, what: str) -> dict:
    try:
        obj = R.read_json(path)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise InputError(f"{path} cannot be read ({message_line(exc)})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path} is not a JSON object ({what} expected)")
    return obj


def _records(root: Path | str, tag: str) -> dict[str, R.RunRecord]:
    """Per finished run, its record (RunRecord supplies the defaults of older records)."""
    out: dict[str, R.RunRecord] = {}
    folder = R.runs_dir(root, tag)
    if not folder.is_dir():
        return out
    for rdir in sorted(p for p in folder.iterdir() if p.is_dir()):
        path = rdir / R.METRICS
        if not path.exists():
            continue  # unfinished run: metrics.json is written last
        data = _read_json(path, "a run record")
        try:
            rec = R.RunRecord.from_json(data)
        except (ValueError, TypeError, AttributeError) as exc:   # e.g. a config that is no object
            raise InputError(f"{path} is not a readable run record ({error_text(exc)})") from None
        out[str(rec.run_id)] = rec
    return out


def load_set(root: Path | str, tag: str, role: str) -> dict[str, Any]:
    folder = R.tag_dir(root, tag)
    if not folder.is_dir():
        raise MissingInput(f"{role} result set {tag!r} not found: folder {folder} does not exist")
    prov_path = R.provenance_path(root, tag)
    paths = [R.table_path(root, tag, n) for n in COLUMNS] + [prov_path]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise MissingInput(f"{role} result set {tag!r} is incomplete, missing: {', '.join(missing)}")
    tables = {n: _read_table(root, tag, n) for n in COLUMNS}
    summary = tables["summary"]
    # a set collected before the workload's unit has no rate: its throughput was images/s
    rate = summary["rate"] if "rate" in summary.columns else pd.Series(float("nan"), index=summary.index)
    unit = summary["rate_unit"] if "rate_unit" in summary.columns else pd.Series(None, index=summary.index, dtype=object)
    older = rate.isna() & summary["images_per_s"].notna()
    summary = tables["summary"] = summary.assign(rate=rate.where(~older, summary["images_per_s"]),
                                                 rate_unit=unit.where(~older, "images/s"))
    if summary.empty:
        raise InputError(f"{R.table_path(root, tag, 'summary')} has a header but no runs")
    damaged = summary[(summary["status"] == R.STATUS_FAILED)
                      & summary["reason"].fillna("").astype(str).str.contains(R.DAMAGED_MARK, regex=False)]
    if len(damaged):   # not a failed run: a file collect could not read, so no verdict on it
        rid, reason = damaged.iloc[0]["run_id"], str(damaged.iloc[0]["reason"])
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise InputError(f"{role} result set {tag!r}: run {rid}{more} is damaged, not failed: "
                         f"{reason.split('; rerun it: ')[0]}; remake it and collect again"
                         + (f" ({reason.split('; rerun it: ')[1]})" if "; rerun it: " in reason else ""))
    # Memory, warnings and curves of runs that did not finish are partial: status reports those.
    ok_ids = set(summary.loc[summary["status"] == R.STATUS_OK, "run_id"])
    for name in ("memory", "warnings", "steps"):
        tables[name] = tables[name][tables[name]["run_id"].isin(ok_ids)]
    records = _records(root, tag)
    _label_by_records(tables, records)
    tables["ok_summary"] = tables["summary"][tables["summary"]["run_id"].isin(ok_ids)]
    ids = _cell_ids(root, tag, tables["summary"])
    if ids is not None:
        tables = {name: table.assign(cell_id=table["run_id"].map(ids)) for name, table in tables.items()}
    loaded = {"tables": tables, "provenance": _read_json(prov_path, "the result set's provenance"),
              "records": records}
    keyed(loaded, by_id=ids is not None)
    return loaded


def _cell_ids(root: Path | str, tag: str, summary: pd.DataFrame) -> dict[str, str] | None:
    """Run id -> the cell id its plan gave it, from runs.csv; None for a set collected before
    runs.csv, one whose plan.json lists no identities (its cell ids would be older records' run
    ids less the repeat, which before issue 36 did not name a workload set in `train`: not an
    identity to pair two sets by), or one whose runs.csv does not name every run of its summary
    (then no run of it is keyed by a cell id: one set, one way)."""
    plan = R.ResultSet(root, tag).plan_path
    if not R.table_path(root, tag, "runs").exists() or not plan.exists():
        return None
    if "identities" not in _read_json(plan, "the set's plan"):
        return None
    try:
        runs = R.read_table(root, tag, "runs", require=["run_id", "cell_id"])
    except R.TableError as exc:
        raise InputError(str(exc)) from None
    ids = {str(rid): str(cid) for rid, cid in zip(runs["run_id"], runs["cell_id"]) if cid}
    return ids if set(summary["run_id"].astype(str)) <= ids.keys() else None


def keyed(side: dict, by_id: bool) -> None:
    """Gives every table of a loaded set its CELL column (the cell_id column where `by_id`, else
    the CELL_KEY tuple), the set its "cells": CELL value -> (variant, gpus, options), and
    "by_id": which of the two it is keyed by."""
    side["by_id"] = by_id
    tables = side["tables"]
    for name, table in tables.items():
        fields = [(str(v), int(g), str(o)) for v, g, o in zip(table["variant"], table["gpus"], table["options"])]
        tables[name] = table.assign(**{CELL: list(table["cell_id"]) if by_id else fields})
    summary = tables["summary"]
    side["cells"] = {}
    for cell, row in zip(summary[CELL], summary[CELL_KEY].to_dict("records")):
        side["cells"].setdefault(cell, cell_key(row))


def key_cells(*sides: dict) -> None:
    """Keys the sets compared together one way: by the cell_id of their plans where every one
    is keyed by it (carries it, and was not keyed by CELL_KEY for another set already), else all
    by CELL_KEY; one map of what each cell shows, the first set's first."""
    by_id = all(side["by_id"] for side in sides)
    shown: dict = {}
    for side in sides:
        keyed(side, by_id)
        for cell, fields in side["cells"].items():
            shown.setdefault(cell, fields)
    for side in sides:
        side["cells"] = shown


def shown(cell: Any, *sides: dict) -> tuple[str, int, str]:
    """A cell's (variant, gpus, options), as the first of these sets that has it shows it."""
    for side in sides:
        if cell in side["cells"]:
            return side["cells"][cell]
    raise KeyError(cell)


def in_order(cells: Any, *sides: dict) -> list:
    """Cells in the reports' order: by what they show (variant, gpus, options)."""
    return sorted(cells, key=lambda cell: shown(cell, *sides))


def _label_by_records(tables: dict, records: dict[str, R.RunRecord]) -> None:
    """Each run's options label as its record (read through upgrade()) gives it, where the tables
    say otherwise: a set collected before a `train` workload named its runs' cells would
    otherwise pair its model with another set's default one."""
    labels = {rid: R.options_label(rec.options) for rid, rec in records.items()}
    for name, table in tables.items():
        if table.empty or "options" not in table:
            continue
        fixed = table["run_id"].map(labels)
        stale = fixed.notna() & (fixed != table["options"])
        if stale.any():
            tables[name] = table.assign(options=table["options"].where(~stale, fixed))


def ok_values(summary, column: str) -> dict[Any, np.ndarray]:
    ok = summary[(summary["status"] == R.STATUS_OK) & summary[column].notna()]
    return {k: g[column].to_numpy(float) for k, g in ok.groupby(CELL)}


