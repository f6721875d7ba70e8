"""experiments/sharding.yaml (and every other experiment) validates and plans without torch; the
sharded variants' options make cells of their own."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from fakes import REPO, copy_workflow, run_snakemake

from dpbench import results
from dpbench.plan import pipeline

EXPERIMENTS = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml") if p.stem != "schema")


def plan(experiment: str, **given):
    return pipeline.make_plan(pipeline.load_experiment({"experiment": experiment, **given}, REPO))


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("gpus_available", [4, 0], ids=["gpu", "cpu"])
def test_every_experiment_plans_without_torch(experiment, gpus_available):
    code = f"""
import sys
from dpbench.plan import pipeline
cfg = pipeline.load_experiment({{"experiment": {experiment!r}, "gpus_available": {gpus_available}}}, {str(REPO)!r})
print(len(pipeline.make_plan(cfg).runs))
assert "torch" not in sys.modules, "torch imported"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 0


def test_the_two_gpu_part_is_the_runs_its_estimate_counts():
    runs = plan("sharding", gpus_available=2, gpus=[2], variants=["ddp", "zero1", "fsdp"]).runs
    by_variant: dict[str, int] = {}
    for rc in runs.values():
        by_variant[rc.variant] = by_variant.get(rc.variant, 0) + 1
    assert by_variant == {"ddp": 5, "zero1": 5, "fsdp": 9, "hsdp": 2}
    assert {rc.gpus for rc in runs.values() if rc.variant != "hsdp"} == {2}
    assert all(rc.gpus == 4 and rc.hsdp_shard_size == 2 for rc in runs.values() if rc.variant == "hsdp")
    sizes = {json.dumps(rc.workload, sort_keys=True) for rc in runs.values()}
    assert len(sizes) == 5                                   # four transformer sizes and ResNet18


def test_the_one_gpu_part_is_the_runs_its_estimate_counts():
    runs = plan("sharding", gpus_available=1, gpus=[1]).runs.values()
    assert len([rc for rc in runs if rc.gpus == 1]) == 24


def test_fsdp_with_and_without_resharding_are_two_cells():
    runs = plan("sharding", gpus_available=2).runs.values()
    lm = [rc for rc in runs if rc.variant == "fsdp" and rc.gpus == 2 and rc.global_batch == 32]
    assert sorted(rc.reshard_after_forward for rc in lm) == [False, True]
    cells = {(rc.variant, rc.gpus, results.options_label(rc.options)) for rc in lm}
    assert len(cells) == 2


def test_the_cpu_plan_shrinks_every_transformer_and_keeps_each_groups_identity():
    p = plan("sharding", gpus_available=0)
    runs = p.runs.values()
    args = {json.dumps(rc.workload.get("args"), sort_keys=True) for rc in runs if isinstance(rc.workload, dict)}
    assert args == {json.dumps({"heads": 4, "layers": 2, "seq_len": 32, "vocab": 256, "width": 64}, sort_keys=True)}
    # each LM size keeps its batch and step budget: four sizes, four cells per variant and GPU count
    lm = {(rc.global_batch, rc.max_steps, rc.warmup_steps) for rc in runs if rc.workload != "resnet18-cifar10"
          and rc.workload.get("name") == "transformer-lm" and rc.variant == "ddp" and rc.gpus == 2}
    assert lm == {(64, 5, 2), (32, 5, 2), (16, 12, 4), (8, 12, 4)}
    assert {g: len(rids) for g, rids in p.group_runs.items()} == {
        "resnet18_cifar10": 10, "lm_12m": 10, "lm_12m_keep": 3, "lm_124m": 10, "lm_124m_keep": 3,
        "lm_124m_hsdp": 1, "lm_1b": 10, "lm_1b_keep": 3, "lm_1b_hsdp": 1, "lm_2b": 10, "lm_2b_keep": 3}
    assert len(p.runs) == 64                              # no two groups share a run
    resnet = [rc for rc in runs if rc.workload == {"name": "resnet18-cifar10"} or rc.workload == "resnet18-cifar10"]
    assert resnet and {rc.global_batch for rc in resnet} == {32}   # 512 is beyond keep_up_to: the CPU's
    # every variant trains, on up to 4 gloo ranks: hsdp on 4 with shard groups of 2
    assert not [rid for rid, rc in p.runs.items() if p.skipped(rc)]
    hsdp = [rc for rc in runs if rc.variant == "hsdp"]
    assert len(hsdp) == 2 and all(rc.gpus == 4 <= rc.max_cpu_ranks and rc.hsdp_shard_size == 2 for rc in hsdp)


@pytest.mark.slow
def test_snakemake_plans_the_sharding_experiment(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    proc = run_snakemake(wd, "-n", "--config", "experiment=sharding", "tag=sh", "gpus=[2]",
                         "variants=[ddp,zero1,fsdp]", "gpus_available=2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, re.M))
    assert int(jobs["train"]) == 21 and int(jobs["sharding"]) == 1     # 19 runs + 2 skipped hsdp
    lint = run_snakemake(wd, "--lint", "--config", "experiment=sharding", "tag=sh", "gpus_available=2", timeout=300)
    assert lint.returncode == 0, lint.stdout + lint.stderr     # the sharding rule too


@pytest.mark.slow
def test_the_cpu_plans_hsdp_run_trains_on_4_gloo_ranks_and_its_traffic_agrees(tmp_path):
    """The CPU plan's hsdp run as the launcher runs it (4 gloo ranks, shard groups of 2), and the
    same model on 2 ranks, one replica: every collective counted agrees with its formula."""
    from dpbench.analysis import traffic_model
    p = plan("sharding", gpus_available=0)
    (rid,) = [r for r, rc in p.runs.items() if rc.variant == "hsdp" and rc.global_batch == 32]
    one_replica = dict(json.loads(p.run_json(rid)), gpus=2)
    for name, cfg in (("four", json.loads(p.run_json(rid))), ("one_replica", one_replica)):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg),
                               "--out", str(out), "--planned-gpus", "0"], capture_output=True, text=True, timeout=600)
        rec = json.loads((out / "metrics.json").read_text())
        assert rec["status"] == "ok", (rec["reason"], proc.stderr[-2000:])
        rows = traffic_model.comparison([{**r, "run_id": name} for r in traffic_model.collective_rows(rec)])
        assert {r["collective"] for r in rows} == {"all_gather", "reduce_scatter", "all_reduce"}
        assert not [r for r in rows if r["beyond_tolerance"]], rows
