"""A paired launch planned: two environments' runs interleaved per cell and repeat (ABBA), their
ids and configs naming the environment, the python that makes each run, and every environment
checked before anything trains, with one line naming it and the way out."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from plan.test_planning import BLOCKER   # the torch blocker of the torch-free planning test

from dpbench.plan import environments as envs
from dpbench.plan import pipeline

REPO = Path(__file__).resolve().parents[2]


def fake_python(folder: Path, version: str) -> str:
    """An executable that answers the environment check as a python with torch `version` would."""
    path = folder / f"python-{version}"
    path.write_text(f"#!/bin/sh\necho {version}\n")
    path.chmod(0o755)
    return str(path)


def paired_plan(tmp_path: Path, **given):
    base, cand = fake_python(tmp_path, "2.13.0+cpu"), fake_python(tmp_path, "2.14.1+cpu")
    cfg = pipeline.load_experiment({"experiment": "upgrade", "base": base, "cand": cand,
                                    "gpus_available": 0, **given}, REPO)
    return pipeline.make_plan(cfg), base, cand


def test_a_paired_plan_interleaves_the_environments_abba_in_every_cell(tmp_path):
    plan, base, cand = paired_plan(tmp_path)
    order = list(plan.runs)
    cell = [rid for rid in order if rid.startswith("single-g1-")]
    assert cell == ["single-g1-envbase-r0", "single-g1-envcand-r0", "single-g1-envcand-r1",
                    "single-g1-envbase-r1", "single-g1-envbase-r2", "single-g1-envcand-r2"]
    # 3 cells (single, ddp on 1 and 2 gloo ranks) x 3 repeats x 2 environments
    assert len(order) == 18 and {plan.run(r).environment for r in order} == {"base", "cand"}
    # each cell's runs are contiguous in the launch, and each repeat pairs the two sides
    for rid in order:
        rc = plan.run(rid)
        assert rc.options == {"environment": rc.environment} and rc.to_dict()["environment"] == rc.environment
    # Snakemake starts the highest priority first: the plan's order
    priorities = [plan.priority_for(r) for r in order]
    assert priorities == sorted(priorities, reverse=True) and len(set(priorities)) == len(order)
    assert plan.python_for("ddp-g2-envcand-r1") == cand and plan.python_for("ddp-g2-envbase-r1") == base
    assert plan.tag == "upgrade-2.13.0+cpu-vs-2.14.1+cpu"
    doc = json.loads(plan.plan_json())
    assert doc["run_order"] == order and doc["environments"] == {"base": base, "cand": cand}
    assert doc["environment_versions"] == {"base": "2.13.0+cpu", "cand": "2.14.1+cpu"}
    fingerprint = pipeline.run_fingerprint(plan, "single-g1-envbase-r0", "torch=x")
    assert fingerprint.endswith("torch=2.13.0+cpu")


def test_an_unpaired_plan_keeps_its_run_ids_configs_and_scheduling():
    cfg = pipeline.load_experiment({"experiment": "upgrade", "gpus_available": 0}, REPO)
    plan = pipeline.make_plan(cfg)
    assert "single-g1-r0" in plan.runs and not plan.paired
    assert "environment" not in plan.run("single-g1-r0").to_dict()
    assert plan.priority_for("single-g1-r0") == 0 and plan.python_for("single-g1-r0") is None
    assert plan.tag.startswith("upgrade-torch-")


def test_three_environments_rotate_and_one_alone_is_refused(tmp_path):
    pys = {n: fake_python(tmp_path, f"2.1{i}.0") for i, n in enumerate(["a", "b", "c"])}
    cfg = pipeline.load_experiment({"experiment": "upgrade", "environments": pys, "gpus_available": 0,
                                    "variants": ["single"]}, REPO)
    assert [pipeline.make_plan(cfg).run(r).environment for r in list(pipeline.make_plan(cfg).runs)[:6]] == \
        ["a", "b", "c", "c", "b", "a"]
    with pytest.raises(pipeline.ConfigError, match="compares two or more"):
        pipeline.load_experiment({"experiment": "upgrade", "base": pys["a"]}, REPO)


def test_planning_a_paired_launch_imports_no_torch(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    base, cand = fake_python(tmp_path, "2.13.0"), fake_python(tmp_path, "2.14.1")
    code = ("from dpbench.plan import pipeline; import sys; "
            f"cfg = pipeline.load_experiment({{'experiment': 'upgrade', 'base': {base!r}, 'cand': {cand!r}, "
            f"'gpus_available': 1}}, {str(REPO)!r}); p = pipeline.make_plan(cfg); "
            "print(p.tag, len(p.runs), 'torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "src")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["upgrade-2.13.0-vs-2.14.1", "18", "False"]


# -- the environment check: one line naming the environment and the way out -----------------

def bare_venv(where: Path, fake_torch: bool = False) -> str:
    """A venv without pip or the system's packages (no torch, no yaml); with a stand-in torch
    package when asked (then torch imports, dpbench's requirements do not)."""
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(where)
    python = where / "bin" / "python"
    if fake_torch:
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        (Path(site) / "torch").mkdir(parents=True)
        (Path(site) / "torch" / "__init__.py").write_text("__version__ = '0.0-standin'\n")
    return str(python)


def check_line(name: str, python: str) -> envs.EnvironmentProblem:
    """The problem found with `python`: one line naming the environment, the python and the fix."""
    envs.torch_version_of.cache_clear()
    with pytest.raises(envs.EnvironmentProblem) as caught:
        envs.torch_version_of(name, python)
    problem, text = caught.value, str(caught.value)
    assert (problem.name, problem.python) == (name, python) and problem.problem in envs.PROBLEMS
    assert "\n" not in text and repr(name) in text and python in text and problem.fix in text
    return problem


def test_a_missing_python_is_named_with_the_way_out(tmp_path):
    assert check_line("cand", str(tmp_path / "nowhere" / "bin" / "python")).problem == "not_executable"


def test_a_python_without_torch_is_named_with_the_install_line(tmp_path):
    python = bare_venv(tmp_path / "v")
    problem = check_line("base", python)
    assert (problem.problem, problem.fix) == ("no_torch", f"{python} -m pip install torch")


def test_a_python_that_cannot_import_dpbench_is_named_with_the_install_line(tmp_path):
    python = bare_venv(tmp_path / "v", fake_torch=True)
    problem = check_line("cand", python)
    assert (problem.problem, problem.fix) == ("no_dpbench", f"{python} -m pip install -e {REPO}")


def test_the_plan_stops_on_a_bad_environment_before_anything_trains(tmp_path):
    with pytest.raises(pipeline.ConfigError, match=f"'cand'.*{re.escape(str(tmp_path / 'missing'))}"):
        pipeline.make_plan(pipeline.load_experiment(
            {"experiment": "upgrade", "base": fake_python(tmp_path, "2.14.1"),
             "cand": str(tmp_path / "missing"), "gpus_available": 0}, REPO))


def test_compare_takes_a_paired_launch_by_its_tag():
    cfg = pipeline.load_experiment({"paired": "upgrade-a-vs-b", "compare": {"fail_on_regression": True}}, REPO)
    args = pipeline.compare_args(cfg, "ignored").split()
    assert args[:4] == ["--results-dir", "results", "--paired", "upgrade-a-vs-b"]
    assert "--fail-on-regression" in args and "--baseline" not in args
