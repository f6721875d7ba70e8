"""`dpbench bisect` end to end on the CPU: eight environments that are launchers of this python
(shell scripts exec'ing it, as a paired launch's tests make them), the fifth and later carrying a
planted slowdown through PYTHONPATH (a sitecustomize that sleeps before every optimizer step, as
tools/device/planted_slowdown does on the GPU). The workload is a tiny model whose forward sleeps
a fixed time, so that a step is mostly a sleep and a 2-core CPU shared with other jobs times it
steadily; the plant adds half of it (+50%). Each step is a real paired launch (Snakemake, the
upgrade experiment's CPU plan, single only, 3 runs a side, 12 steps a run)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from fakes import copy_workflow

from dpbench import bisect_cli

STEP_MS, PLANT_MS = 40, 20

WORKLOAD = f'''
import os, time
import torch
import torch.nn as nn
import torch.nn.functional as F
from dpbench.workloads.spec import WorkloadSpec

class Sleepy(nn.Module):
    """A tiny MLP whose forward takes STEP_MS: the step is a sleep and a few small matmuls."""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    def forward(self, x):
        time.sleep({STEP_MS} / 1e3)
        return self.net(x)

def build():
    def batch(generator, n):
        return torch.randn(n, 8, generator=generator), torch.randint(0, 3, (n,), generator=generator)
    return WorkloadSpec(model=Sleepy(), loss=lambda o, t: F.cross_entropy(o, t, reduction="none"), batch=batch)
'''

PLANTED = '''
import os, time
_MS = float(os.environ.get("DPBENCH_TEST_PLANT_MS", "0") or 0)
if _MS > 0:
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(lambda opt, args, kwargs: time.sleep(_MS / 1e3))
'''


def launcher(path: Path, planted: Path | None = None, python: str = sys.executable) -> str:
    lines = ["#!/bin/sh"]
    if planted is not None:
        lines += [f'export PYTHONPATH="{planted}${{PYTHONPATH:+:$PYTHONPATH}}"', f"export DPBENCH_TEST_PLANT_MS={PLANT_MS}"]
    path.write_text("\n".join([*lines, f'exec {python} "$@"', ""]))
    path.chmod(0o755)
    return str(path)


def environments(tmp: Path, first_planted: int | None) -> list[str]:
    planted = tmp / "planted"
    planted.mkdir(exist_ok=True)
    (planted / "sitecustomize.py").write_text(PLANTED)
    return [launcher(tmp / f"py{i}", planted if first_planted is not None and i >= first_planted else None)
            for i in range(8)]


def bisect_args(wd: Path, tmp: Path, name: str, envs: list[str]) -> list[str]:
    (tmp / "sleepy.py").write_text(WORKLOAD)
    train = (f"train={{workload: '{tmp / 'sleepy.py'}:build', max_steps: 12, warmup_steps: 2, global_batch: 8, "
             "synthetic_size: 64}")
    return [*envs, "--name", name, "--variants", "single", "--gpus", "1", "--repeats", "3", "--margin", "0.25",
            "--workflow", str(wd), "--config", train, "--cores", "2"]


def report(wd: Path, name: str) -> dict:
    return json.loads((wd / "results" / "bisect" / name / "report.json").read_text())


@pytest.mark.slow
def test_bisect_names_the_fifth_environment_in_three_steps(tmp_path):
    wd = copy_workflow(tmp_path / "wd")
    envs = environments(tmp_path, first_planted=4)
    assert bisect_cli.main(bisect_args(wd, tmp_path, "planted", envs)) == 0
    doc = report(wd, "planted")
    assert doc["result"] == {"status": "found", "first_bad": 4, "last_good": 3, "open_range": None}
    assert [(s["base"], s["cand"], s["verdict"]) for s in doc["steps"]] == [(0, 3, "good"), (3, 5, "bad"), (3, 4, "bad")]
    (cell,) = doc["steps"][-1]["cells"]
    assert cell["cell"][:2] == ["single", 1] and cell["verdict"] == "slower" and cell["change"] < -0.2
    assert cell["smallest_detectable"] is not None and cell["smallest_detectable"] < 0.5
    # the same install on both sides: nothing in the provenance differs
    assert doc["provenance"] and not any(r["differs"] for r in doc["provenance"])
    # where the time went: the plant sleeps before the optimizer's step
    w = doc["where_the_time_went"]
    assert [r["environment"] for r in w["phases"]] == ["e3", "e4"]
    assert w["change_ms"]["optimizer"] > 0.5 * PLANT_MS
    # the optimizer's step (the plant's hook runs inside it) moved most of all operators
    assert "Optimizer.step" in w["kernels"][0]["name"] and w["kernels"][0]["delta_ms"] > 0.5 * PLANT_MS
    md = (wd / "results" / "bisect" / "planted" / "report.md").read_text()
    assert "e4" in md and "## Where the time went" in md


@pytest.mark.slow
def test_bisect_names_none_when_nothing_is_planted(tmp_path):
    wd = copy_workflow(tmp_path / "wd")
    assert bisect_cli.main(bisect_args(wd, tmp_path, "clean", environments(tmp_path, None))) == 0
    doc = report(wd, "clean")
    assert doc["result"]["status"] == "none" and doc["result"]["first_bad"] is None
    assert [(s["base"], s["cand"]) for s in doc["steps"]] == [(0, 3), (3, 5), (5, 6), (6, 7)]
    assert all(s["verdict"] == "good" for s in doc["steps"]) and "where_the_time_went" not in doc


def test_a_broken_environment_stops_with_one_line_and_exit_2(tmp_path, capsys):
    wd = copy_workflow(tmp_path / "wd")
    envs = environments(tmp_path, None)[:3]   # three: each check imports torch
    envs[2] = launcher(tmp_path / "nope", python=f"{sys.executable} -S")   # no site-packages: no torch
    code = bisect_cli.main(bisect_args(wd, tmp_path, "broken", envs))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'e2'" in err[0] and "no torch" in err[0]
    assert not (wd / "results" / "bisect" / "broken" / "report.json").exists()
    assert not any(p.name.startswith("bisect-") for p in (wd / "results").glob("*")) if (wd / "results").exists() else True


def test_too_few_environments_or_a_missing_python_exit_2(tmp_path, capsys):
    wd = copy_workflow(tmp_path / "wd")
    assert bisect_cli.main([sys.executable, "--workflow", str(wd)]) == 2
    missing = str(tmp_path / "no" / "python")
    assert bisect_cli.main([sys.executable, missing, "--workflow", str(wd)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "two or more" in err[0] and missing in err[1] and "'e1'" in err[1]


def test_bisect_is_a_subcommand():
    from dpbench import cli
    assert cli.COMMANDS["bisect"][0] == "dpbench.bisect_cli"
    assert os.access(sys.executable, os.X_OK)
