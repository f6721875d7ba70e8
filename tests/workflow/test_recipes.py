"""The recipes under experiments/recipes/: overlays for any experiment's `train:` block, given with
--configfile. Each must validate, merge the way Snakemake merges it, and reach every run."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from fakes import copy_workflow, run_snakemake

from dpbench.plan import pipeline

ROOT = Path(__file__).resolve().parents[2]
FAST = ROOT / "experiments" / "recipes" / "fast.yaml"


def _with_fast(experiment: str | None = None, gpus: int = 2):
    """The config Snakemake hands the Snakefile for --configfile fast.yaml: config.yaml, the
    recipe merged over it, then --config."""
    config = pipeline.deep_merge(yaml.safe_load((ROOT / "config.yaml").read_text()),
                                 yaml.safe_load(FAST.read_text()))
    config = {**config, "gpus_available": gpus, **({"experiment": experiment} if experiment else {})}
    return pipeline.make_plan(pipeline.load_experiment(config, ROOT))


@pytest.mark.parametrize("experiment", [None, "smoke"])
def test_the_fast_recipe_validates_and_every_run_takes_it(experiment):
    recipe = yaml.safe_load(FAST.read_text())["train"]
    plan = _with_fast(experiment)
    assert plan.config["experiment"] == (experiment or "scaling")
    assert plan.runs and all(getattr(rc, k) == v for rc in plan.runs.values() for k, v in recipe.items())
    plain = pipeline.make_plan(pipeline.load_experiment({"experiment": experiment or "scaling",
                                                         "gpus_available": 2}, ROOT))
    assert set(plain.runs) == set(plan.runs)   # the same cells, only faster
    assert all(getattr(rc, k) != v for rc in plain.runs.values() for k, v in recipe.items())


def test_the_fast_recipe_on_the_cpu_keeps_its_options():
    recipe = yaml.safe_load(FAST.read_text())["train"]
    plan = _with_fast("smoke", gpus=0)
    assert all(getattr(rc, k) == v for rc in plan.runs.values() for k, v in recipe.items())


def test_snakemake_merges_the_fast_recipe_into_every_train_job(tmp_path):
    wd = copy_workflow(tmp_path / "wf")
    proc = run_snakemake(wd, "-n", "-p", "--configfile", "experiments/recipes/fast.yaml",
                         "--config", "gpus_available=2", check=True)
    configs = [json.loads(m) for m in re.findall(r"--config '(\{.*?\})' --identity", proc.stdout)]
    assert len(configs) == len(_with_fast().runs)
    assert all(c["precision"] == "bf16" and c["channels_last"] and c["static_graph"] for c in configs)
