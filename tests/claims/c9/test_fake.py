"""Rehearsal on fake tensors (claims.c9.fake) against gloo ranks of the CPU (claims.c9.rehearsal's
cases, run.live_memory's tracker): rank 0's memory by phase, unit part and kind is the same, with
no memory behind it; what it cannot run is a record that says why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sharded_ranks import TINY_LM, rehearse_cases

REPO = Path(__file__).resolve().parents[3]
ARGS = TINY_LM["args"]
CASES = [{"name": "fsdp", "variant": "fsdp", "args": ARGS, "batch": 8},
         {"name": "fsdp-keep", "variant": "fsdp", "args": ARGS, "batch": 8, "options": {"reshard_after_forward": False}},
         {"name": "hsdp", "variant": "hsdp", "args": ARGS, "batch": 8, "options": {"hsdp_shard_size": 2}, "min_ranks": 4},
         {"name": "ddp", "variant": "ddp", "args": ARGS, "batch": 8}]
BYTE = 1 / 2 ** 20
STEP_SCRATCH = 64 / 1024   # MiB: the optimizer step's peak may differ by its scratch (16 KiB seen)


def fake_records(cases: list[dict], world: int, tmp: Path) -> dict[str, dict]:
    """dpbench.claims.c9.fake in a process of its own (a fake process group per case), by case name."""
    plan, out = tmp / f"plan-{world}.json", tmp / f"out-{world}.jsonl"
    plan.write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-m", "dpbench.claims.c9.fake", "--plan", str(plan), "--out", str(out),
                    "--ranks", str(world)], check=True, env=env, capture_output=True, timeout=300)
    return {r["case"]: r for r in map(json.loads, out.read_text().splitlines())}


def numbers(row: dict) -> dict[str, float]:
    """A row's device memory (MiB): the host's peaks a rank records (run.host_staging) are the
    process's, which fake tensors do not model."""
    return {k: v for k, v in row.items() if k.endswith("_mib") and not k.startswith("host_")
            and isinstance(v, (int, float))}


@pytest.mark.slow   # three gloo launches and three fake ones, ~30 s
@pytest.mark.parametrize("world", [1, 2, 4])
def test_fake_tensors_hold_what_gloo_ranks_hold(world, tmp_path):
    real, fake = rehearse_cases(CASES, world), fake_records(CASES, world, tmp_path)
    assert set(fake) == {c["name"] for c in CASES if world >= c.get("min_ranks", 1)}
    for name, rec in real.items():
        if rec["variant"] == "ddp":
            continue
        f = fake[name]
        assert rec["status"] == "ok" and f["status"] == "ok" and f["fake"] is True, (name, f.get("reason"))
        a, b = rec["memory_components"][0], f["memory_components"][0]
        assert set(numbers(a)) == set(numbers(b))
        # at times gloo's worker thread lets go of a collective's buffer after FSDP2 has (the
        # held_late of tests/run/test_components_tracked): a gloo rank then holds one unit more,
        # or part of one (seen once in CI: fsdp-keep's forward peak at N = 4, 0.032 MiB of a
        # 0.048 MiB unit), never less than fake tensors and never more than its largest unit
        late = [0.0, *(a["unit_mib"] if world > 1 else [])]
        for key, value in numbers(a).items():
            tolerance = STEP_SCRATCH if key == "step_peak_mib" else BYTE
            exact = any(value - b[key] == pytest.approx(u, abs=tolerance) for u in late)
            partly = world > 1 and -tolerance <= value - b[key] <= max(late) + tolerance
            assert exact or partly, (name, key, value, b[key])
        for phase in ("forward", "backward", "backward_start", "backward_late"):
            if b[f"{phase}_peak_mib"] == pytest.approx(a[f"{phase}_peak_mib"], abs=BYTE):
                assert b[f"{phase}_peak_by_kind_mib"] == pytest.approx(a[f"{phase}_peak_by_kind_mib"], abs=BYTE)
        parts = {k: v == pytest.approx(a["backward_unit_peaks_mib"][k], abs=BYTE)
                 for k, v in b["backward_unit_peaks_mib"].items()}
        assert set(parts) == set(a["backward_unit_peaks_mib"]) and sum(parts.values()) >= len(parts) - 1, name
        assert {c["collective"]: c["count"] for c in f["collectives"]} == \
            {c["collective"]: c["count"] for c in rec["collectives"]}
    ddp = fake["ddp"]
    assert (ddp["status"], ddp["fake"]) == ("skipped", True) and "reducer" in ddp["reason"]


def test_a_model_beyond_this_machine_runs_on_fake_tensors(tmp_path):
    """1.97B's units on 2 blocks at 8 ranks: nothing allocated, each rank's shards an eighth."""
    case = {"name": "wide", "variant": "fsdp", "args": {"width": 2560, "layers": 2, "heads": 40}, "batch": 1,
            "budgets": {"16GB": 14.0}}
    (rec,) = fake_records([case], 8, tmp_path).values()
    assert rec["status"] == "ok" and rec["search_skipped"]
    m = rec["memory_components"][0]
    assert m["parameters_mib"] == pytest.approx(rec["param_bytes"] / 8 / 2 ** 20, rel=1e-3)
    assert len(m["unit_mib"]) == 3 and m["backward_peak_mib"] > m["parameters_mib"] * 3
