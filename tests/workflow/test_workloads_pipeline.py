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
from fakes import launched_run

from dpbench import results
from dpbench.plan import pipeline
from dpbench.plan.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
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
    with pytest.raises(ValueError, match="'nope'"):   # the workload asked for
        RunConfig.from_dict({"workload": "nope"})


# -- steps 2-4: the engine builds the workload ------------------------------------------------

TINY = {"synthetic_size": 14, "synthetic_test_size": 8, "global_batch": 7, "epochs": 1, "max_steps": 2,
        "warmup_steps": 0, "log_every": 1000, "eval_each_epoch": False, "lr": 0.05}
BROKEN = "the user's model cannot be built"   # the factory's own error, which a failed record carries
USER_MODEL = f'''
import torch
import torch.nn as nn
import torch.nn.functional as F
from dpbench.workloads.spec import WorkloadSpec

def build(width=6, classes=3, batch_first=True):
    model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, classes))
    def batch(generator, n):
        return torch.randn(n, width, generator=generator), torch.randint(0, classes, (n,), generator=generator)
    def loss(outputs, targets):
        return F.cross_entropy(outputs, targets, reduction="none")
    return WorkloadSpec(model=model, loss=loss, batch=batch, batch_first=batch_first)

def broken(**kw):
    raise ValueError("{BROKEN}")
'''


@pytest.fixture
def user_factory(tmp_path) -> Path:
    path = tmp_path / "mymodel.py"
    path.write_text(USER_MODEL)
    return path


def run(out: Path, **overrides) -> tuple[dict, list[float]]:
    return launched_run(out, dict(TINY, **overrides))


def workloads(user: Path) -> dict:
    return {"lm": LM,
            "torchvision": {"name": "torchvision", "args": {"model": "resnet18", "resolution": 16, "num_classes": 5}},
            "user": {"factory": f"{user}:build", "args": {"width": 5}}}


@pytest.mark.parametrize("which", ["lm", pytest.param("user", marks=pytest.mark.slow),
                                   pytest.param("torchvision", marks=pytest.mark.slow)])
def test_ddp_on_2_and_3_gloo_ranks_follows_singles_curve(which, user_factory, tmp_path):
    """Global batch 7 splits 4/3 and 3/3/1: the same global batches and the same global loss."""
    workload = workloads(user_factory)[which]
    extra = {"batchnorm": "eval"} if which == "torchvision" else {}
    single, s_curve = run(tmp_path / "single", variant="single", workload=workload, **extra)
    assert single["status"] == "ok", single["reason"]
    assert len(s_curve) == 2 and s_curve[0] != s_curve[1]   # it trained
    for ranks in (2, 3):
        ddp, d_curve = run(tmp_path / f"ddp{ranks}", variant="ddp", gpus=ranks, max_cpu_ranks=ranks,
                           workload=workload, **extra)
        assert ddp["status"] == "ok", ddp["reason"]
        assert d_curve == pytest.approx(s_curve, rel=1e-5, abs=1e-6)


def test_a_record_carries_the_workload_its_sizes_and_rates(user_factory, tmp_path):
    lm, _ = run(tmp_path / "lm", variant="single", workload=LM)
    assert lm["workload"]["name"] == "transformer-lm" and lm["workload"]["args"] == LM["args"]
    assert len(lm["workload"]["source_sha256"]) == 64
    assert lm["parameters"] > 0 and lm["param_bytes"] == 4 * lm["parameters"]
    assert lm["flops_per_sample"] > 0 and lm["sample_unit"] == "tokens"
    tp = lm["throughput"]
    assert tp["images_per_s"] is None and tp["tokens_per_s"] == pytest.approx(8 * tp["samples_per_s"])
    user, _ = run(tmp_path / "user", variant="single", workload=f"{user_factory}:build")
    assert user["workload"]["factory"] == f"{user_factory}:build" and user["sample_unit"] == "images"
    assert user["throughput"]["images_per_s"] == user["throughput"]["samples_per_s"] > 0
    assert user["accuracy"] == []   # synthetic-only: no test pass


def test_the_default_workloads_record_names_it_and_keeps_its_run_id(tmp_path):
    rec, _ = run(tmp_path / "d", variant="single", max_steps=1)
    assert rec["run_id"] == "single-g1-r0" and rec["options"] == {}
    assert rec["workload"]["name"] == "resnet18-cifar10" and rec["parameters"] == 11_173_962
    assert rec["throughput"]["images_per_s"] == rec["throughput"]["samples_per_s"]


def test_dataparallel_of_outputs_that_are_not_batch_first_is_skipped_with_the_reason(user_factory, tmp_path,
                                                                                      monkeypatch):
    from dpbench.run import engine
    monkeypatch.setattr(engine, "skip_reason", lambda *a: None)   # DataParallel's own skip comes first on a CPU
    workload = {"factory": f"{user_factory}:build", "args": {"batch_first": False}}
    cfg = RunConfig.from_dict(dict(TINY, variant="dp", gpus=1, workload=workload, device="cpu"))
    assert engine.unsupported(cfg, engine.build_workload(cfg)).startswith("nn.DataParallel gathers")
    ok = RunConfig.from_dict(dict(TINY, variant="single", workload=workload))
    assert engine.unsupported(ok, engine.build_workload(ok)) is None


def test_a_factory_that_fails_is_a_failed_record_with_its_one_line(user_factory, tmp_path):
    rec, _ = run(tmp_path / "f", variant="single", workload=f"{user_factory}:broken")
    assert rec["status"] == "failed"
    assert f"ValueError: {BROKEN}" in rec["reason"]   # the factory's error whole, with its type
    assert "\n" not in rec["reason"] and rec["workload"]["factory"].endswith(":broken")


def test_the_workload_feed_splits_the_global_batch_like_the_other_feeds():
    import torch

    from dpbench.run.data import WorkloadFeed, shard

    def make(generator, n):
        return torch.randn(n, 2, generator=generator), torch.arange(n)
    whole = [x for x, _, _ in WorkloadFeed(make, 14, 7, 3, torch.device("cpu")).epoch(0)]
    for world in (2, 3):
        parts = [list(WorkloadFeed(make, 14, 7, 3, torch.device("cpu"), world, r).epoch(0)) for r in range(world)]
        for step in range(2):
            assert torch.equal(torch.cat([p[step][0] for p in parts]), whole[step])
            assert [len(p[step][1]) for p in parts] == [len(range(7)[shard(7, world, r)]) for r in range(world)]
    assert not torch.equal(whole[0], whole[1])
    assert len(list(WorkloadFeed(make, 14, 7, 3, torch.device("cpu"), total=1).epoch(0))) == 1


def test_an_old_record_reads_as_the_default_workload():
    from dpbench.results.formats import upgrade
    old = {"format": 2, "run_id": "single-g1-r0", "config": {}, "throughput": {"images_per_s": 5.0}}
    new = upgrade(old)
    assert new["workload"] == {"name": "resnet18-cifar10", "args": {}, "source_sha256": None}
    assert new["throughput"]["samples_per_s"] == 5.0 and new["parameters"] is None


# -- the workloads experiment's CPU plan, end to end --------------------------------------------

@pytest.mark.slow
def test_the_workloads_experiments_cpu_plan_runs_end_to_end(tmp_path):
    """experiments/workloads.yaml without CUDA, through the real Snakemake: its workloads shrunk
    by cpu_plan.workload_args, every run ok or skipped with its reason, the summary by workload."""
    import pandas as pd
    from fakes import copy_workflow, run_snakemake

    wd = copy_workflow(tmp_path)
    # a bound on a hang, not a speed goal: the experiment's bf16 runs the CPU's autocast, which a
    # CPU without native bf16 (an AVX2-only EPYC: resnet18 at batch 32, 8 s a step against 1 s in
    # fp32) runs many times slower; there this plan took over 10 minutes
    proc = run_snakemake(wd, "--config", "experiment=workloads", "tag=wl", timeout=1800, check=True)
    assert "lm_124m.workload.args=" in proc.stderr   # the banner says what it shrank
    base = wd / "results" / "wl"
    summary = pd.read_csv(base / "summary.csv", keep_default_na=False)
    assert set(summary.status) <= {"ok", "skipped"}
    assert set(summary.workload) == {"resnet18-cifar10", "torchvision", "transformer-lm"}
    ok = summary[summary.status == "ok"]
    assert set(ok.variant) == {"single", "ddp"} and set(ok.workload) == set(summary.workload)
    skipped = summary[summary.status == "skipped"]
    assert (skipped.reason != "").all()
    assert skipped[skipped.variant.str.startswith("dp") & (skipped.variant != "ddp")].reason.str.contains("needs CUDA").all()
    plan = json.loads((base / "plan.json").read_text())
    replaced = plan["cpu_replaced"]
    assert replaced["lm_1b.workload.args"]["used"] == {"heads": 4, "layers": 2, "seq_len": 32, "vocab": 256, "width": 64}
    assert replaced["resnet50_224.workload.args"] == {"asked": {"resolution": 224}, "used": {"resolution": 32}}
    lm = [rc for rc in plan["runs"].values() if "transformer-lm" in json.dumps(rc.get("workload"))]
    assert lm and all(rc["workload"]["args"]["width"] == 64 for rc in lm)


def test_your_model_docs_experiment_plans_and_shrinks_on_the_cpu(tmp_path, monkeypatch):
    """docs/your-model.md's experiment, as a user copies it: it plans without importing the
    factory, and its CPU plan trains the workload at cpu_plan.workload_args's width. Its package
    must be on the path, as the guide's command puts it (planning refuses a factory not there)."""
    import yaml
    text = (REPO / "docs" / "your-model.md").read_text()
    config = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, re.S)[0])
    with pytest.raises(pipeline.ConfigError, match="mypkg.models"):
        pipeline.make_plan(dict(pipeline.load_experiment(config, REPO), gpus_available=0))
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('imported at planning')\n")
    (tmp_path / "mypkg" / "models.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    runs = pipeline.make_plan(dict(pipeline.load_experiment(config, REPO), gpus_available=0)).runs
    assert {rc.workload["args"]["width"] for rc in runs.values()} == {32}
    assert {rc.workload["factory"] for rc in runs.values()} == {"mypkg.models:build"}
    gpu = pipeline.make_plan(dict(pipeline.load_experiment(config, REPO), gpus_available=2)).runs
    assert {rc.workload["args"]["width"] for rc in gpu.values()} == {512}
