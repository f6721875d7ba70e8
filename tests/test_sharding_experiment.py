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


def test_the_cpu_plan_shrinks_every_transformer_and_keeps_to_two_ranks():
    runs = plan("sharding", gpus_available=0).runs.values()
    args = {json.dumps(rc.workload.get("args"), sort_keys=True) for rc in runs if isinstance(rc.workload, dict)}
    assert args == {json.dumps({"heads": 4, "layers": 2, "seq_len": 32, "vocab": 256, "width": 64}, sort_keys=True)}
    assert all(rc.max_steps == 5 and rc.max_cpu_ranks == 2 for rc in runs)
    p = plan("sharding", gpus_available=0)
    skipped = {rc.variant for rc in p.runs.values() if p.skipped(rc)}
    assert skipped == {"ddp", "zero1", "fsdp", "hsdp"}      # their 4-rank runs
    assert not [rc for rc in p.runs.values() if rc.gpus <= 2 and p.skipped(rc)]


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
