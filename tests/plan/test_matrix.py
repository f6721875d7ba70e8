"""dpbench.plan.matrix: the identities the plan decides, and the launcher's record copying them."""
from __future__ import annotations

import json
from pathlib import Path

from dpbench import results
from dpbench.plan import pipeline
from dpbench.plan.matrix import read_identities
from dpbench.run.launch import main as launch_main

REPO = Path(__file__).resolve().parents[2]


def _plan(**over):
    config = {**pipeline.load_experiment({"experiment": "mixed"}, REPO), "gpus_available": 2, **over}
    return pipeline.make_plan(config)


def test_plan_json_holds_every_runs_identity_as_decided_once():
    plan = _plan()
    doc = json.loads(plan.plan_json())
    assert set(doc["identities"]) == set(doc["runs"])
    assert read_identities(doc) == plan.identities
    groups = {rid: g["name"] for g in reversed(doc["groups"]) for rid in g["runs"]}   # the first wins
    for rid, ident in plan.identities.items():
        rc = plan.runs[rid]
        assert ident.run_id == rid and ident.group == groups[rid]
        assert ident.cell_id == results.cell_id(rc.variant, rc.gpus, rc.options)
        assert ident.setup_id == results.setup_id(rc.to_dict())
    cells = {}
    for rid, ident in plan.identities.items():
        cells.setdefault(ident.cell_id, set()).add(plan.runs[rid].repeat)
    assert all(len(repeats) > 1 for repeats in cells.values())   # repeats share a cell


def test_the_record_copies_the_identity_it_was_launched_with(tmp_path):
    plan = _plan()
    rid = next(r for r, rc in plan.runs.items() if rc.variant == "dp")   # skipped on a machine without CUDA
    given = results.Identity(rid, "a-cell", "a-setup", "a-group")   # not what its settings give: copied
    out = tmp_path / rid
    assert launch_main(["--config", plan.run_json(rid), "--identity", json.dumps(given.to_dict()),
                        "--out", str(out), "--planned-gpus", "0"]) == 0
    rec = results.read_metrics(out)
    assert rec["status"] == results.STATUS_SKIPPED
    assert results.Identity.from_dict(rec) == given
