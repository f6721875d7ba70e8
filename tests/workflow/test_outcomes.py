"""The console says what happened: a pipeline's last dpbench lines count its ok, failed and
skipped runs with the commonest reasons, and `fail_on_failed_runs=true` makes a failed run
fail the pipeline (a non-zero exit), through a real tiny Snakemake pipeline on the CPU."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from fakes import copy_workflow, run_snakemake

from dpbench.plan import pipeline
from dpbench.run.hooks import FAULT_ENV

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           OMP_NUM_THREADS="1")
ENV.pop("DPBENCH_FAULT", None)
TAIL = 4000
TINY = {"repeats": 1, "max_ranks": 1,
        "train": {"dataset": "synthetic", "synthetic_size": 48, "synthetic_test_size": 16, "global_batch": 12,
                  "epochs": 1, "max_steps": 2, "warmup_steps": 1, "workers": 0, "log_every": 1000}}


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("outcomes"))


def pipeline_run(wd: Path, tag: str, fault: bool, **extra):
    """smoke's single and dp on 1 GPU on the CPU plan: single trains (or fails, with the fault
    injected at its first step), dp is skipped (no CUDA)."""
    (wd / f"{tag}.yaml").write_text(yaml.safe_dump(dict(
        experiment="smoke", tag=tag, repeats=1, variants=["single", "dp"], gpus=[1], cpu_plan=TINY, **extra)))
    env = dict(ENV, DPBENCH_FAULT="0:1") if fault else ENV
    proc = run_snakemake(wd, f"results/{tag}/summary.md", "--configfile", f"{tag}.yaml", cores=1, env=env)
    return proc, proc.stdout + proc.stderr


def _last_dpbench_lines(text: str) -> list[str]:
    lines = text.splitlines()
    last = max(i for i, l in enumerate(lines) if l.startswith("dpbench: ") and " runs in " in l)
    return [l for l in lines[last:] if l.startswith("dpbench:")]


@pytest.mark.slow
def test_the_last_lines_count_the_runs_and_name_the_commonest_reasons(workflow):
    proc, text = pipeline_run(workflow, "outcome-failed", fault=True)
    assert proc.returncode == 0, text[-TAIL:]   # a failed run is a result, by default
    lines = _last_dpbench_lines(text)
    head = lines[0]
    assert re.search(r"\b0 ok\b", head) and re.search(r"\b1 failed\b", head) and re.search(r"\b1 skipped\b", head), lines
    assert any(l.startswith("dpbench:   failed (1):") and FAULT_ENV in l for l in lines), lines
    assert any(l.startswith("dpbench:   skipped (1):") for l in lines), lines
    assert any("summary.md" in l for l in lines)


@pytest.mark.slow
def test_fail_on_failed_runs_makes_the_pipeline_fail(workflow):
    proc, text = pipeline_run(workflow, "outcome-strict", fault=True, fail_on_failed_runs=True)
    assert proc.returncode != 0, text[-TAIL:]
    assert "fail_on_failed_runs" in text
    assert (workflow / "results" / "outcome-strict" / "summary.md").exists()   # the results are all there


@pytest.mark.slow
def test_a_pipeline_whose_runs_pass_exits_0_with_fail_on_failed_runs(workflow):
    proc, text = pipeline_run(workflow, "outcome-ok", fault=False, fail_on_failed_runs=True)
    assert proc.returncode == 0, text[-TAIL:]
    assert re.search(r"\b1 ok\b", _last_dpbench_lines(text)[0])


def test_the_option_is_in_the_schema_and_validated(tmp_path):
    cfg = pipeline.load_experiment({"experiment": "smoke", "fail_on_failed_runs": "true"}, REPO)
    assert cfg["fail_on_failed_runs"] is True
    assert pipeline.load_experiment({"experiment": "smoke"}, REPO)["fail_on_failed_runs"] is False
    with pytest.raises(pipeline.ConfigError):
        pipeline.load_experiment({"experiment": "smoke", "fail_on_failed_runs": "maybe"}, REPO)


@pytest.mark.parametrize("variants, says, not_says", [
    (["single"], "single on 1 process", "ddp"),
    (["single", "ddp", "zero1"], "zero1 on 1 and 2 gloo processes", "dp_mean"),
])
def test_the_cpu_banner_says_what_the_plan_trains(variants, says, not_says):
    cfg = pipeline.load_experiment({"experiment": "smoke", "variants": variants, "gpus": [1, 2]}, REPO)
    plan = pipeline.make_plan(cfg)
    if not plan.cpu:
        pytest.skip("a CUDA device is visible: no CPU plan")
    second = plan.banner().splitlines()[1]
    assert says in second and not_says not in second.split(";")[0], second
