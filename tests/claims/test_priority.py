"""dpbench.claims.priority: which claims jobs a time-boxed device call runs first, and which
records a cut or a set from a smaller machine gives back."""
import os
import time
from pathlib import Path

import pytest

from dpbench import results
from dpbench.claims import priority
from dpbench.plan.matrix import read_plan

ROOT = Path(__file__).resolve().parents[2]


def _claims_plan():
    pytest.importorskip("snakemake", reason="the plan goes through snakemake's validator")
    from dpbench.plan.matrix import Plan
    from dpbench.plan.pipeline import load_experiment
    return Plan(load_experiment({"experiment": "claims"}, ROOT), 2)


def test_first_targets_are_c8s_fp32_sweep_c1s_extreme_widths_and_the_breakdown():
    plan = _claims_plan()
    first = priority.first_targets(plan)
    assert first[-1] == str(plan.results.probe_path("C7"))
    rids = {Path(p).parent.name for p in first[:-1]}
    labels = {results.options_label(plan.runs[r].options) for r in rids}
    groups = read_plan(plan.document())
    named = {g for g, spec in groups.items() if spec["label"] in labels}
    assert named == {"c8_fp32_b128", "c8_fp32_b512", "c8_fp32_b2048", "c8_fp32_b8192", "c1_out10", "c1_out32768"}
    assert len(rids) == 4 * 3 * 2 + 2 + 3 * 2   # c1_out10's dp and ddp are c8_fp32_b2048's own runs
    assert {plan.runs[r].num_classes for r in rids} == {10, 32768} and {plan.runs[r].precision for r in rids} == {"fp32"}


def test_a_cut_gives_back_the_runs_it_stopped_not_earlier_failures(tmp_path, capsys):
    cut = time.time() - 100
    for rid, status, age in [("ddp-g2-r0", results.STATUS_FAILED, 50), ("ddp-g2-r1", results.STATUS_FAILED, 200),
                             ("single-g1-r0", results.STATUS_OK, 50)]:
        path = tmp_path / rid / results.METRICS
        results.write_json(path, {"run_id": rid, "status": status})
        os.utime(path, (time.time() - age, time.time() - age))
    assert priority.main(["cut-off", str(tmp_path), str(cut)]) == 0
    assert capsys.readouterr().out == "cut off by the limit, trains again next call: ddp-g2-r0\n"
    assert sorted(p.parent.name for p in tmp_path.glob("*/metrics.json")) == ["ddp-g2-r1", "single-g1-r0"]



def test_a_set_made_on_fewer_gpus_gives_back_the_skips_this_machine_can_run(tmp_path):
    """Carried from a one-GPU machine, the claims set's 'needs 2 GPUs' records would count as done
    on two: they go; a run this machine skips too keeps its record, and so does every ok run."""
    from dpbench.plan.matrix import Plan
    two = _claims_plan()
    config = {**two.config, "results_dir": str(tmp_path)}
    two, one = Plan(config, 2), Plan(config, 1)
    ddp = next(rid for rid, rc in two.runs.items() if rc.variant == "ddp" and rc.gpus == 2)
    single = next(rid for rid, rc in two.runs.items() if rc.variant == "single")
    for rid, status in ((ddp, results.STATUS_SKIPPED), (single, results.STATUS_OK)):
        results.write_json(two.results.metrics_path(rid), {"run_id": rid, "status": status})
    assert priority.drop_stale_skips(one) == []                    # on one GPU the skip stands
    assert priority.drop_stale_skips(two) == [ddp]
    assert not two.results.metrics_path(ddp).exists() and two.results.metrics_path(single).exists()

@pytest.mark.slow
def test_the_device_script_prioritises_targets_snakemake_accepts(tmp_path):
    from fakes import copy_workflow, run_snakemake

    wd = copy_workflow(tmp_path)
    first = [str(Path(p).relative_to(ROOT)) if Path(p).is_absolute() else p for p in priority.first_targets(_claims_plan())]
    dry = run_snakemake(wd, "-n", "-p", "--prioritize", *first, "--config", "experiment=claims", "gpus_available=2",
                        timeout=300, check=True)
    probe_cmd = next(line for line in dry.stdout.splitlines() if "dpbench.claims.probe C7" in line)
    assert "--plan " in probe_cmd   # the probe measures at the planned groups' settings
    script = (ROOT / "tools/device/pipeline_run.sh").read_text()
    assert "< <(python3 -m dpbench.claims.priority first" in script
    assert "dpbench.claims.priority cut-off" in script and "dpbench.claims.priority stale" in script
