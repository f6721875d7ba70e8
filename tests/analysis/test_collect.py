"""dpbench.analysis.collect: runs.csv and cells.csv, joined with plan.json, written once."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from statistics import median

from dpbench import results
from dpbench.analysis import collect

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CPU_SET = "cpu_check-aa1-torch-2.13.0+cpu"


def _set(tmp_path) -> results.ResultSet:
    shutil.copytree(FIXTURES / "cpu" / CPU_SET, tmp_path / CPU_SET)
    return results.ResultSet(tmp_path, CPU_SET)


def test_runs_and_cells_are_keyed_by_the_cell_id(tmp_path):
    rs = _set(tmp_path)
    collect.collect(rs.root, rs.tag)
    runs, cells = rs.table("runs"), rs.table("cells")
    records = {rec["run_id"]: rec for rec, _ in rs.runs()}
    assert set(runs["run_id"]) == set(records)
    for row in runs.to_dict("records"):   # older records: the ids upgrade derives, no group
        assert (row["cell_id"], row["setup"], row["group"]) == (
            records[row["run_id"]]["cell_id"], records[row["run_id"]]["setup_id"], "")
    assert list(cells["cell_id"]) == list(dict.fromkeys(cells["cell_id"]))    # one row a cell
    ok = runs[runs["status"] == results.STATUS_OK]
    assert set(cells["cell_id"]) == set(ok["cell_id"])
    for cell in cells.to_dict("records"):
        mine = ok[ok["cell_id"] == cell["cell_id"]]
        assert cell["n_ok"] == len(mine)
        assert cell["rate"] == median(mine["rate"]) and cell["rate_unit"] == mine["rate_unit"].iloc[0]


def test_the_plans_identities_are_what_the_rows_take(tmp_path):
    rs = _set(tmp_path)
    ids = {rec["run_id"]: results.identity_of(rec["run_id"], rec["config"], "the-group") for rec, _ in rs.runs()}
    plan = {"groups": [], "runs": {}, "identities": {rid: i.to_dict() for rid, i in ids.items()}}
    rs.plan_path.write_text(json.dumps(plan))
    collect.collect(rs.root, rs.tag, plan=rs.plan_path)
    assert set(rs.table("runs")["group"]) == {"the-group"}


def test_a_set_collected_before_runs_and_cells_reads_as_a_new_one(tmp_path):
    reference = Path(__file__).resolve().parents[2] / "results" / "reference" / CPU_SET
    shutil.copytree(reference, tmp_path / CPU_SET, ignore=shutil.ignore_patterns("figures", "logs", "runs"))
    assert not results.table_path(tmp_path, CPU_SET, "runs").exists()
    runs = results.read_table(tmp_path, CPU_SET, "runs")
    summary = results.read_table(tmp_path, CPU_SET, "summary")
    assert list(runs["run_id"]) == list(summary["run_id"]) and set(runs["group"]) == {""}
    assert all(rid == f"{cell}-r{repeat}" for rid, cell, repeat in zip(runs["run_id"], runs["cell_id"], runs["repeat"]))
    cells = collect.read_cells(tmp_path, CPU_SET)
    ok = runs[runs["status"] == results.STATUS_OK]
    assert set(cells["cell_id"]) == set(ok["cell_id"]) and cells["n_ok"].sum() == len(ok)
