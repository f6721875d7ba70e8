"""A tag never reaches a shell: it is letters, digits and `._+-`, at most 100 characters,
refused in one line before anything runs; and every argument of every rule's command is
quoted, so a results_dir with a space or a `;` stays one argument."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import jsonschema
import pytest
from fakes import copy_workflow, run_snakemake

from dpbench.plan import pipeline
from dpbench.plan.config import schema

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           OMP_NUM_THREADS="1")
BAD = ["a;b", "q'x", "x" * 300, "a b", "a/b", "$(touch pwned)", "a`id`", "semi;touch x", "..", ".hidden"]
GOOD = ["quick", "torch-2.14.1+cu130", "upgrade-torch-2.13.0", "A_1.2-3", "x" * 100]


@pytest.mark.parametrize("tag", BAD)
def test_a_tag_outside_the_rule_is_refused_by_the_check_and_the_schema(tag):
    assert pipeline.tag_problem(tag) is not None
    assert "\n" not in pipeline.tag_problem(tag)
    validator = jsonschema.Draft202012Validator(schema()["properties"]["tag"])
    assert not validator.is_valid(tag)


@pytest.mark.parametrize("tag", GOOD)
def test_names_within_the_rule_pass(tag):
    assert pipeline.tag_problem(tag) is None
    assert jsonschema.Draft202012Validator(schema()["properties"]["tag"]).is_valid(tag)


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("tags"))


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".snakemake" not in p.parts}


@pytest.mark.parametrize("tag", ["a;b", "q'x", "x" * 300])
def test_a_bad_tag_stops_a_real_run_in_one_line_before_anything_is_written(workflow, tag):
    before = _files(workflow)
    proc = run_snakemake(workflow, "--config", "experiment=smoke", f"tag={tag}", cores=1, env=ENV, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [l for l in text.splitlines() if l.startswith("config key tag:")]
    assert len(lines) == 1, text[-3000:]
    assert "._+-" in lines[0]
    assert "Traceback" not in text.split("config key tag:")[0]
    assert _files(workflow) == before, sorted(_files(workflow) - before)   # not one file, anywhere


@pytest.mark.parametrize("key", ["baseline", "paired"])
def test_a_bad_tag_to_compare_is_refused(workflow, key):
    proc = run_snakemake(workflow, "compare", "--config", f"{key}=a;b", cores=1, env=ENV, timeout=300)
    assert proc.returncode != 0
    assert f"config key {key}:" in proc.stdout + proc.stderr


def test_every_rule_argument_stays_one_argument_in_a_results_dir_with_shell_characters(workflow):
    odd = "my results;echo x'y"
    proc = run_snakemake(workflow, "-n", "-p", "--config", "experiment=smoke", "tag=q", f"results_dir={odd}",
                         cores=1, env=ENV, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    commands = [l.split("Shell command:", 1)[1] for l in text.splitlines()
                if "Shell command:" in l and " -m dpbench." in l]
    assert commands, text[-3000:]
    seen = set()
    for cmd in commands:
        words = shlex.split(cmd)
        module = words[words.index("-m") + 1]
        seen.add(module)
        for flag in ("--out", "--log", "--results-dir"):
            if flag in words:
                value = words[words.index(flag) + 1]
                assert value.startswith(odd), (flag, value, cmd)
        if module == "dpbench.run.launch":
            assert words[words.index("--out") + 1] == f"{odd}/q/runs/" + Path(words[words.index("--out") + 1]).name
        if module == "dpbench.analysis.collect":
            printed = words[words.index("--print") + 1:words.index(">")] if ">" in words else words[words.index("--print") + 1:]
            assert printed and all(p.startswith(f"{odd}/q/runs/") for p in printed)
    assert {"dpbench.run.launch", "dpbench.analysis.collect"} <= seen
