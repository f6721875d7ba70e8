"""advise.error over the committed references: every cell predicted, the probe's own cells kept
out of the summary, a rehearsal folder given on the command line read like the default ones, and
without DeepSpeed or accelerate it says "not installed"."""
from __future__ import annotations

from pathlib import Path

from dpbench.advise import error, others

REF = Path(__file__).resolve().parents[2] / "results" / "reference"
REHEARSAL = REF / "h200-rehearsal-525c3e7"


def test_every_measured_cell_of_a_rehearsal_is_predicted_and_the_probe_is_kept_out():
    rows = error.cells([REHEARSAL], error.cached_estimates())
    records = error.rehearsal_records(REHEARSAL)
    profiled = [c for c in rows if c["quantity"] == "allocated" and "estimate_key" in c]
    assert len(profiled) == len([r for r in records if r.get("memory_components")])
    budgets = sum(len(r.get("search") or {}) for r in records)
    assert len([c for c in rows if c["quantity"] == "largest_batch"]) == budgets
    assert all(c["predicted"] is not None for c in rows)
    probe = [c for c in rows if c["probe"]]
    assert probe and {c["setup"] for c in probe} == {"ddp"} and {c["gpus"] for c in probe} == {1}
    s = {r["quantity"]: r for r in error.summary(rows)}
    assert s["allocated"]["cells"] == len([c for c in rows if c["quantity"] == "allocated" and not c["probe"]])


def test_the_tool_reads_a_rehearsal_folder_given_and_works_without_the_others(monkeypatch, capsys):
    monkeypatch.setattr(others, "_installed", lambda module: False)
    monkeypatch.setattr(others, "version", lambda package: others.NOT_INSTALLED)
    assert error.main([str(REHEARSAL)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert header.count(others.NOT_INSTALLED) == 2
    rows = error.cells([REHEARSAL])
    assert all(c.get("deepspeed_mib") is None and c.get("accelerate_mib") is None for c in rows)
    assert error.main([str(REF / "no-such-folder")]) == 2


def test_c1s_resnet18_batches_are_predicted_from_the_sharding_benchs_resnet18():
    rows = error.cells([REF / name for name in error.REFERENCES], error.cached_estimates())
    c1 = [c for c in rows if c["source"] == "h200-c1-probe-550c3a7"]
    assert {(c["setup"], c["measured"]) for c in c1} == {("single", 1728), ("ddp", 1728)}   # ddp: 3456 / 2
    assert all(c["quantity"] == "largest_batch" and c["predicted"] > 0 for c in c1)
