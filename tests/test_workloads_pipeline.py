"""Workloads through the pipeline (issue 25, part 2): the `workload` run option at planning
(torch-free, checked by the registry, a short stable run-id part), built by the engine (the
default's numerics unchanged, other workloads on seeded synthetic global batches that single and
ddp split alike), and the records and summary that carry it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpbench import results
from dpbench.plan import pipeline
from dpbench.plan.config import RunConfig

REPO = Path(__file__).resolve().parents[1]
LM = {"name": "transformer-lm", "args": {"width": 16, "layers": 1, "heads": 2, "seq_len": 8, "vocab": 64}}


def plan_of(matrix: list[dict], gpus: int = 2, **top) -> dict:
    config = {"experiment": "wl", "matrix": matrix, "variants": ["single", "ddp"], "gpus": [1, 2],
              "repeats": 1, "gpus_available": gpus, **top}
    return pipeline.make_plan(pipeline.load_experiment(config, REPO)).runs


# -- step 1: the option at planning -----------------------------------------------------------

def test_the_default_workload_adds_nothing_to_options_or_run_ids():
    runs = plan_of([{"name": "main"}, {"name": "big", "options": {"global_batch": 1024}}])
    assert sorted(runs) == ["ddp-g1-global_batch1024-r0", "ddp-g1-r0", "ddp-g2-global_batch1024-r0",
                            "ddp-g2-r0", "single-g1-global_batch1024-r0", "single-g1-r0"]
    assert all(rc.workload == "resnet18-cifar10" for rc in runs.values())
    assert runs["ddp-g1-r0"].options == {}


def test_a_swept_workload_gets_a_short_stable_run_id_part():
    runs = plan_of([{"name": "lm", "options": {"workload": LM}},
                    {"name": "tv", "options": {"workload": "torchvision"}}])
    lm = [rid for rid in runs if "transformer-lm" in rid]
    assert len(lm) == 3 and all(re.fullmatch(r"(single|ddp)-g\d-wtransformer-lm-[0-9a-f]{8}-r0", r) for r in lm)
    assert "single-g1-wtorchvision-r0" in runs   # a name without args: just the name
    assert runs[lm[0]].workload == LM and runs[lm[0]].options == {"workload": LM}
    # stable: the same spelling for the same workload, another for other args
    again = results.run_id("single", 1, 0, {"workload": json.loads(json.dumps(LM))})
    assert again in runs
    other = dict(LM, args=dict(LM["args"], width=32))
    assert results.run_id("single", 1, 0, {"workload": other}) not in runs
    label = results.options_label({"workload": LM, "global_batch": 8})
    assert re.fullmatch(r"global_batch=8,workload=transformer-lm-[0-9a-f]{8}", label)
    assert results.parse_run_id(lm[0]).variant in ("single", "ddp")


def test_a_factory_is_spelled_by_module_and_function():
    assert results.workload_label("mypkg.models:build").startswith("models_build-")
    assert results.workload_label({"factory": "path/to/net.py:make"}).startswith("net_make-")


@pytest.mark.parametrize("workload, words", [
    ("no-such-workload", ["no workload named 'no-such-workload'", "transformer-lm"]),
    ({"name": "transformer-lm", "factory": "a:b"}, ["exactly one of name or factory"]),
    ({"name": "transformer-lm", "argz": {}}, ["unknown key", "argz"]),
    ("justamodule:", ["pkg.module:function"]),
])
def test_a_bad_workload_is_named_at_planning(workload, words):
    with pytest.raises(pipeline.ConfigError) as err:
        plan_of([{"name": "g", "options": {"workload": workload}}])
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_workload_of_the_wrong_type_is_refused_by_the_schema():
    with pytest.raises(pipeline.ConfigError, match="workload"):
        plan_of([{"name": "g", "options": {"workload": 3}}])


def test_planning_a_users_factory_does_not_import_it_or_torch(tmp_path):
    factory = tmp_path / "boom.py"
    factory.write_text("raise SystemExit('imported at planning')\n")
    code = f"""
import sys
from dpbench.plan import pipeline
cfg = pipeline.load_experiment({{"experiment": "wl", "gpus_available": 1, "repeats": 1,
    "matrix": [{{"name": "u", "options": {{"workload": "{factory}:build"}}}}]}}, {str(REPO)!r})
runs = pipeline.make_plan(cfg).runs
assert "torch" not in sys.modules, "torch imported"
print(sorted(runs)[0])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ddp-g1-wboom_build-")


def test_the_workloads_experiment_plans():
    runs = pipeline.make_plan(pipeline.load_experiment({"experiment": "workloads", "gpus_available": 4}, REPO)).runs
    workloads = {json.dumps(rc.workload, sort_keys=True) for rc in runs.values()}
    assert len(workloads) == 5


def test_a_run_config_checks_its_workload():
    with pytest.raises(ValueError, match="no workload named"):
        RunConfig.from_dict({"workload": "nope"})
