"""Every command dpbench prints or documents works as printed for the set it names: a damaged
run's "rerun it" carries the set's own experiment and config (from its plan.json), and the
compare commands carry `--cores 1`, which Snakemake needs."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from fakes import copy_workflow, run_snakemake

from dpbench.analysis import collect
from dpbench.plan import pipeline

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           OMP_NUM_THREADS="1")
TAIL = 3000


@pytest.fixture(scope="module")
def planned_set(tmp_path_factory) -> Path:
    """A non-default set: the smoke experiment, its own tag, top-level and nested overrides;
    plan.json made by the pipeline's own plan rule (no training)."""
    wd = copy_workflow(tmp_path_factory.mktemp("hints"))
    run_snakemake(wd, "results/hint/plan.json", "--config", "experiment=smoke", "tag=hint", "repeats=1",
                  "gpus=[1,2]", "train={max_steps: 3, global_batch: 32}", cores=1, env=ENV, timeout=300,
                  check=True)
    return wd


def _as_run(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "snakemake"
    return words[1:]


def test_a_damaged_runs_rerun_hint_works_as_printed_for_a_non_default_set(planned_set, monkeypatch):
    monkeypatch.chdir(planned_set)
    rec = collect.damaged(Path("results/hint/runs/ddp-g2-r0/steps.csv"), ValueError("cut short"))
    command = rec["reason"].split("rerun it: ", 1)[1]
    args = _as_run(command)
    assert "--cores" in args
    proc = run_snakemake(planned_set, "-n", *args, cores=None, env=ENV, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{command}\n{text[-TAIL:]}"
    assert "results/hint/runs/ddp-g2-r0/metrics.json" in text
    assert re.search(r"^train\s+1$", proc.stdout, re.M), text[-TAIL:]   # that run, and only it, retrains
    assert "Nothing to be done" not in text


def test_the_hint_plans_the_same_runs_as_the_set(planned_set):
    import json
    doc = json.loads((planned_set / "results/hint/plan.json").read_text())
    args = pipeline.set_config_args(planned_set / "results/hint")
    assert args[0] == "--config"
    words = dict(w.split("=", 1) for w in args[1:])
    assert words["experiment"] == "smoke" and words["tag"] == "hint"
    # planned again from those words as Snakemake would read them (strings), the same runs
    import yaml
    given = {k: (yaml.load(v, Loader=yaml.BaseLoader) if v[:1] in "[{" else v) for k, v in words.items()}
    again = pipeline.make_plan(pipeline.load_experiment(given, planned_set), given)
    assert sorted(again.runs) == sorted(doc["runs"])
    assert {r: json.loads(json.dumps(again.runs[r].to_dict(), default=str)) for r in doc["runs"]} == doc["runs"]


def test_without_a_plan_the_hint_says_what_is_missing(tmp_path):
    text = pipeline.rerun_command(tmp_path / "results" / "gone", "x")
    assert "tag=gone" in text and "plan.json" in text


DOCUMENTED = [REPO / "README.md", REPO / "Snakefile", *sorted((REPO / "docs").glob("*.md"))]


def test_every_documented_compare_command_names_its_cores():
    bare = []
    for path in DOCUMENTED:
        for line in path.read_text().splitlines():
            if re.search(r"\bsnakemake\b(?:(?!--cores|-c\d|--profile)[^`|])*\bcompare\b(?:\s|$)", line) and \
                    "--cores" not in line and "--profile" not in line:
                bare.append(f"{path.name}: {line.strip()}")
    assert not bare, "\n".join(bare)


def test_the_compare_command_as_printed_runs(planned_set):
    """`snakemake --cores 1 compare --config paired=<tag>`, as the README, docs/compare.md, the
    Snakefile and the paired banner print it: Snakemake accepts it (dry run)."""
    proc = run_snakemake(planned_set, "-n", *shlex.split("--cores 1 compare --config paired=hint"),
                         cores=None, env=ENV, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-TAIL:]
    assert "cores have to be specified" not in text


def test_the_paired_banner_prints_cores():
    source = (REPO / "src/dpbench/plan/matrix.py").read_text()
    assert "snakemake --cores 1 compare --config paired=" in source


def test_a_changed_config_plans_the_runs_and_the_tables_too(planned_set):
    """plan.json rewritten (another config) must not leave collect and the runs out of the DAG."""
    proc = run_snakemake(planned_set, "-n", "results/hint/summary.csv", "--config", "experiment=smoke", "tag=hint",
                         "repeats=1", "gpus=[1,2]", "train={max_steps: 4, global_batch: 32}", cores=1, env=ENV,
                         timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-TAIL:]
    for rule in ("plan", "train", "collect"):
        assert re.search(rf"^{rule}\s+\d+$", proc.stdout, re.M), text[-TAIL:]
