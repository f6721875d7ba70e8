"""A rehearsal case that did not run to its end is a record that still names its model, so that
the tables drawn from a launch whose ranks lost step are drawn (seen on one H200 at N = 8: the
cases after the first were written without a size, and the tables' reader stopped on them)."""
from __future__ import annotations

from dpbench.claims.c9 import rehearsed
from dpbench.claims.c9.rehearsal import failed_case

CASE = {"name": "42m-ddp", "variant": "ddp", "options": {}, "args": {"width": 512, "layers": 8, "heads": 8},
        "batch": 4, "budgets": {"16GB": 14.0}}


def test_a_case_never_reached_names_its_model_and_why():
    rec = failed_case(CASE, 8, "not run: the ranks lost step in case 235m-ddp (RuntimeError)")
    assert (rec["run_id"], rec["status"], rec["size"], rec["gpus"]) == ("42m-ddp-g8", "failed", "512x8", 8)
    assert rec["parameters"] > 40_000_000
    rows = rehearsed.c9_rows([rec], {"16GB": 14.0})
    assert [(r["variant"], r["gpus"], r["budget"], r["largest_batch"]) for r in rows] == [("ddp", 8, "16GB", None)]


def test_older_records_without_a_size_are_left_out_of_the_rows():
    old = {"run_id": "12m-ddp-g8", "case": "12m-ddp", "variant": "ddp", "gpus": 8, "status": "failed",
           "reason": "not run: the ranks lost step"}
    assert rehearsed.c9_rows([old, failed_case(CASE, 8, "x")], {"16GB": 14.0})[0]["gpus"] == 8
    assert len(rehearsed.c9_rows([old], {"16GB": 14.0})) == 0
