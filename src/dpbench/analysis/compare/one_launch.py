"""The environments of one paired launch compared within it (an upgrade check in one launch).

A paired launch (experiment key `environments`) made every run once per environment, the
environments interleaved per cell and repeat (ABBA). Split by the runs' `environment`, each side
reads as a result set of its own whose cells and run ids are the launch's without the
environment, so that status, memory, warnings, loss curves and accuracy compare exactly as two
sets do. Throughput is judged by the within-launch test (analysis.compare.paired): its noise is
the spread inside this launch, and no shift between launches enters.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpbench import results as R
from dpbench.analysis.cells import cell_fields, cell_key
from dpbench.analysis.collect import provenance_summary
from dpbench.analysis.compare import assemble
from dpbench.analysis.compare.loading import InputError, key_cells, keyed, load_set
from dpbench.analysis.compare.paired import EQUIVALENCE, paired_throughput
from dpbench.analysis.compare.provenance import compare_provenance, compare_sets
from dpbench.analysis.compare.thresholds import Thresholds

SEVERITY = {"slower": "regression"}   # "faster", "no change", "noise unknown": info


def environments(rs: dict) -> list[str]:
    """The environments of a loaded set, in the order the plan named them (first: the base)."""
    doc = rs.get("plan") or {}
    named = list(doc.get("environments") or {})
    found = {str(rec.config.get("environment")) for rec in rs["records"].values() if rec.config.get("environment")}
    return [n for n in named if n in found] + sorted(found - set(named))


def _without(label: str, name: str) -> str:
    """An options label without its `environment=<name>` item."""
    return ",".join(item for item in label.split(",") if item and item != f"environment={name}")


def _plain_id(run_id: str, name: str) -> str:
    """A run id without its environment part (`ddp-g2-envbase-r0` -> `ddp-g2-r0`); a cell id
    too (`ddp-g2-envbase` -> `ddp-g2`)."""
    part = R.run_id("x", 1, 0, {"environment": name})[len("x-g1-"):-len("-r0")]
    return f"{run_id}-".replace(f"-{part}-", "-", 1)[:-1]


def side(rs: dict, name: str) -> dict:
    """The runs of environment `name` as a result set of their own: the launch's cells and run
    ids without the environment, provenance from these runs' records."""
    mine = {rid: rec for rid, rec in rs["records"].items() if rec.config.get("environment") == name}
    tables = {}
    for table, frame in rs["tables"].items():
        frame = frame[frame["run_id"].isin(mine)].copy()
        frame["options"] = frame["options"].map(lambda label: _without(label, name))
        frame["run_id"] = frame["run_id"].map(lambda rid: _plain_id(rid, name))
        if "cell_id" in frame:
            frame["cell_id"] = frame["cell_id"].map(lambda cid: _plain_id(cid, name))
        tables[table] = frame
    records = {}
    for rid, rec in mine.items():
        config = {k: v for k, v in rec.config.items() if k != "environment"}
        config["options"] = {k: v for k, v in (config.get("options") or {}).items() if k != "environment"}
        records[_plain_id(rid, name)] = dataclasses.replace(
            rec, run_id=_plain_id(rid, name), config=config,
            options={k: v for k, v in rec.options.items() if k != "environment"})
    readable = [{"provenance": rec.raw.get("provenance"), "status": rec.status} for rec in mine.values()]
    provenance = (provenance_summary(readable, name) if any(isinstance(r["provenance"], dict) for r in readable)
                  else rs["provenance"])
    plain = {"tables": tables, "provenance": provenance, "records": records}
    keyed(plain, rs["by_id"])   # the launch's cells without the environment
    return plain


def samples(rs: dict, base: str, cand: str) -> pd.DataFrame:
    """One row per ok run of the two sides: its cell (variant, gpus, options without the
    environment), environment, position in the launch and samples/s (the paired test's input)."""
    order = {rid: i for i, rid in enumerate((rs.get("plan") or {}).get("run_order") or [])}
    rows = []
    ok = rs["tables"]["ok_summary"]
    for rec_row in ok.to_dict("records"):
        env = rs["records"][rec_row["run_id"]].config.get("environment") if rec_row["run_id"] in rs["records"] else None
        if env not in (base, cand) or pd.isna(rec_row["rate"]):
            continue
        variant, gpus, options = cell_key(rec_row)
        rows.append({"cell": (variant, gpus, _without(options, env)), "environment": env,
                     "order": order.get(rec_row["run_id"], len(order) + len(rows)),
                     "samples_per_s": float(rec_row["rate"])})   # in the workload's unit
    return pd.DataFrame(rows, columns=["cell", "environment", "order", "samples_per_s"])


def throughput_test(frame: pd.DataFrame, base: str, cand: str, alpha: float, delta: float | None = None) -> Any:
    """The one call of the within-launch throughput test (analysis.compare.paired)."""
    return paired_throughput(frame, base, cand, alpha=alpha, delta=EQUIVALENCE if delta is None else delta)


def planned_order(rs: dict, base: str, cand: str) -> str:
    """The order the plan gave the first cell's runs, as letters (A: base, B: cand), e.g. ABBAAB."""
    order = (rs.get("plan") or {}).get("run_order") or []
    recs = [rs["records"][rid] for rid in order if rid in rs["records"]]
    cell = lambda rec: (rec.variant, rec.gpus, sorted((k, str(v)) for k, v in rec.options.items() if k != "environment"))
    first = [rec.config.get("environment") for rec in recs if cell(rec) == cell(recs[0])] if recs else []
    return "".join({base: "A", cand: "B"}.get(e, "?") for e in first)


def paired_throughput_rows(frame: pd.DataFrame, base: str, cand: str, th: Thresholds) -> tuple[list[dict], dict]:
    """The throughput rows of the report (one per cell, with its medians beside the test's
    change and verdict) and the whole launch's row with the test's design."""
    verdict = throughput_test(frame, base, cand, th.alpha, th.equivalence)
    rows = []
    for r in verdict.cells:
        mine = frame[frame["cell"] == r.cell]
        med = mine.groupby("environment")["samples_per_s"].median()
        # the centre the test's change is made of (ratio of geometric means - 1): its sign agrees
        geo = mine[mine["samples_per_s"] > 0].groupby("environment")["samples_per_s"].agg(
            lambda v: float(np.exp(np.log(v.to_numpy(float)).mean())))
        rows.append({**cell_fields(r.cell), "n_baseline": r.n_base, "n_candidate": r.n_cand,
                     "median_baseline": float(med.get(base, float("nan"))),
                     "median_candidate": float(med.get(cand, float("nan"))),
                     "geomean_baseline": float(geo.get(base, float("nan"))),
                     "geomean_candidate": float(geo.get(cand, float("nan"))),
                     "change": r.change, "smallest_detectable": r.smallest_detectable,
                     "p_holm": r.p_holm, "verdict": r.verdict, "severity": SEVERITY.get(r.verdict, "info"),
                     "tost_p": r.tost_p, "within": r.within, "equivalence": verdict.delta})
    launch = dataclasses.asdict(verdict.launch)
    launch["severity"] = SEVERITY.get(launch["verdict"], "info")   # every cell slower together
    return rows, {"design": verdict.design, "notes": list(verdict.notes), "launch": launch,
                  "equivalence": verdict.delta}


def load_paired(results_dir: Path | str, tag: str) -> dict:
    """A paired launch as compare reads it: the loaded set and its plan.json."""
    rs = load_set(results_dir, tag, "paired launch")
    plan_path = R.ResultSet(results_dir, tag).plan_path
    try:
        rs["plan"] = json.loads(plan_path.read_text()) if plan_path.exists() else {}
    except (OSError, ValueError) as exc:
        raise InputError(f"{plan_path} is not readable JSON ({exc})") from None
    return rs


def compare_paired(results_dir: Path | str, tag: str, base: str | None = None, cand: str | None = None,
                   th: Thresholds | None = None) -> dict[str, Any]:
    """The report of environment `cand` against `base` within the paired launch `tag` (default:
    the plan's first two environments); InputError when the set is no paired launch."""
    th = th or Thresholds()
    rs = load_paired(results_dir, tag)
    named = environments(rs)
    base, cand = base or (named[0] if named else None), cand or (named[1] if len(named) > 1 else None)
    if base is None or cand is None or base == cand or not {base, cand} <= set(named):
        raise InputError(f"result set {tag!r} is no paired launch of {base or 'base'!r} and {cand or 'cand'!r} "
                         f"(its runs' environments: {', '.join(named) or 'none'}); make one with "
                         f"--config experiment=upgrade base=/venv-a/bin/python cand=/venv-b/bin/python")
    a, b = side(rs, base), side(rs, cand)
    key_cells(a, b)
    sets = compare_sets(results_dir, tag, tag, a, b)
    sets.update(same_set=False, same_because=None)   # one folder, two sides: not one set twice
    rows, paired = paired_throughput_rows(samples(rs, base, cand), base, cand, th)
    return assemble(base, cand, a, b, th, sets, compare_provenance(a, b), rows, None,
                    paired={"tag": tag, "order": planned_order(rs, base, cand), **paired})


__all__ = ["compare_paired", "environments", "paired_throughput_rows", "samples", "side",
           "throughput_test"]
