"""Planning without running: the experiment config (coerced, validated, typos named first), the
plan (seeds, the CPU plan, the default experiment's two kinds of run), the result-set paths,
and `snakemake -n` without torch, seaborn or matplotlib."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import copy_workflow, run_snakemake

from dpbench import SHARDED_VARIANTS, VARIANTS, cli, results
from dpbench.plan import config, pipeline
from dpbench.plan.config import RunConfig
from dpbench.host.torch_facts import torch_version
from dpbench.plan.matrix import Plan, default_tag, environment_fingerprint

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "torchvision", "seaborn", "matplotlib")

REFUSED = "planning must not import"   # what the blocker's ImportError says
# Makes importing the heavy packages fail in every Python process that starts with it on its
# path, while their files stay findable (the tag is read from torch's version file).
BLOCKER = f"""
import importlib.abc, importlib.machinery, sys
HEAVY = {HEAVY!r}
class _Refuse(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"{REFUSED} {{spec.name}}")
    def exec_module(self, module):
        raise ImportError(f"{REFUSED} {{module.__name__}}")
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in HEAVY:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = _Refuse()
        return spec
sys.meta_path.insert(0, _Block())
"""


@pytest.fixture(scope="module")
def wd(tmp_path_factory) -> Path:
    """A copy of the workflow, never run: dry runs only."""
    return copy_workflow(tmp_path_factory.mktemp("plan"))


# -- torch-free planning --------------------------------------------------------------------

def test_a_dry_run_of_the_default_experiment_imports_no_torch_seaborn_or_matplotlib(wd, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(wd / "src")]))
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and f"{REFUSED} torch" in check.stderr   # the hook works
    start = time.perf_counter()
    proc = run_snakemake(wd, "-n", "--config", "gpus_available=2", env=env, timeout=300)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rule train" in proc.stdout and REFUSED not in proc.stdout + proc.stderr
    print(f"snakemake -n of the default experiment, torch blocked: {elapsed:.1f} s")


def test_the_default_tag_and_fingerprint_match_what_torch_says():
    import torch
    assert torch_version()["version"] == torch.__version__          # the local part (+cu130) too
    assert default_tag("scaling") == f"torch-{torch.__version__}"
    assert default_tag("smoke") == f"smoke-torch-{torch.__version__}"
    assert environment_fingerprint().startswith(
        f"torch={torch.__version__} git={torch.version.git_version} cuda={torch.version.cuda} gpus=")


def test_the_figure_names_are_the_ones_the_figures_modules_draw():
    from dpbench.claims import figures as claim_figures
    from dpbench.report.plots import DRAW
    assert tuple(DRAW) == results.FIGURE_NAMES
    assert tuple(claim_figures.DRAW) == results.CLAIM_FIGURE_KEYS


# -- one source for the run options ---------------------------------------------------------

def test_every_run_config_field_is_a_schema_option_and_back():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    options = set(config.train_schema())
    assert fields - set(config.plan_schema()) == options
    assert set(config.plan_schema()) <= fields


def test_run_config_checks_values_against_the_schema():
    with pytest.raises(ValueError, match=r"precision='fp8' is not allowed; use fp32 \| bf16"):
        RunConfig.from_dict({"precision": "fp8"})
    with pytest.raises(ValueError, match="workers=65 .* <= 64"):
        RunConfig.from_dict({"workers": 65})
    with pytest.raises(ValueError, match="lr=0 .* > 0"):
        RunConfig.from_dict({"lr": 0})
    with pytest.raises(ValueError, match="max_steps='3'"):
        RunConfig.from_dict({"max_steps": "3"})
    RunConfig.from_dict({"max_steps": None, "bucket_cap_mb": 12.5, "lr": 1})


def test_the_package_ships_the_schema_the_readme_names():
    assert (REPO / "src/dpbench/plan/schema.yaml").resolve() == (REPO / "experiments/schema.yaml").resolve()
    shipped = __import__("yaml").safe_load((REPO / "experiments/schema.yaml").read_text())
    shipped["definitions"]["variant"]["enum"] = list(config.variants())   # the registry's, filled in
    assert config.schema() == shipped


# -- command-line values, typos ---------------------------------------------------------------

def test_command_line_strings_become_the_schemas_types():
    given = {"repeats": 1, "gpus": ["1", "2"], "tag": "12", "exclusive_timing": "true",
             "train": {"max_steps": "3", "lr": "0.05", "channels_last": "false", "bucket_cap_mb": "null",
                       "dataset": "synthetic", "per_gpu_batch": "64"},
             "matrix": [{"name": "m", "gpus": ["2"], "options": {"epochs": "1"}}],
             "compare": {"threshold": "0.1"}}
    got = pipeline.coerce(given)
    assert got["gpus"] == [1, 2] and got["tag"] == "12" and got["exclusive_timing"] is True
    assert got["train"] == {"max_steps": 3, "lr": 0.05, "channels_last": False, "bucket_cap_mb": None,
                            "dataset": "synthetic", "per_gpu_batch": 64}
    assert got["matrix"] == [{"name": "m", "gpus": [2], "options": {"epochs": 1}}]
    assert got["compare"]["threshold"] == 0.1
    assert pipeline.coerce({"gpus": ["two"]}) == {"gpus": ["two"]}   # left for the validator to name


def test_load_experiment_accepts_command_line_lists_and_numbers():
    cfg = pipeline.load_experiment({"experiment": "smoke", "gpus": ["1", "2"], "repeats": 1, "tag": "quick",
                                    "train": {"max_steps": "3"}}, REPO)
    assert cfg["gpus"] == [1, 2] and cfg["train"]["max_steps"] == 3 and cfg["tag"] == "quick"


@pytest.mark.parametrize("over, first, hint", [
    ({"repets": 1}, "unknown config key 'repets' (top level); did you mean 'repeats'?", "experiments/schema.yaml"),
    ({"train": {"max_step": 3}}, "unknown config key 'max_step' (train); did you mean 'max_steps'?", "schema"),
    ({"gpus": ["0"]}, "config key gpus[0]: 0 is less than the minimum of 1", "gpus=[1,2]"),
    ({"train": {"max_steps": "three"}}, "config key train.max_steps: 'three' is not of type", "'train={max_steps: 3"),
])
def test_a_bad_key_or_value_is_named_first_in_two_lines(over, first, hint):
    with pytest.raises(pipeline.ConfigError) as err:
        pipeline.load_experiment({"experiment": "smoke", **over}, REPO)
    lines = str(err.value).splitlines()
    assert lines[0].startswith(first) and len(lines) <= 2 and hint in lines[-1], str(err.value)


def test_a_typo_through_snakemake_is_short(wd):
    proc = run_snakemake(wd, "-n", "--config", "experiment=smoke", "repets=1", timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "'repets'" in text and "'repeats'" in text   # the typo and the key meant
    assert len([line for line in text.splitlines() if line.strip()]) <= 10, text


def test_command_line_lists_and_numbers_work_through_snakemake(wd):
    proc = run_snakemake(wd, "-n", "--config", "experiment=smoke", "repeats=1", "gpus=[1,2]", "tag=quick",
                         "train={max_steps: 3}", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "results/quick/runs/ddp-g2-r0/metrics.json" in proc.stdout


# -- the plan ---------------------------------------------------------------------------------

def _plan(visible: int, **over) -> Plan:
    cfg = pipeline.load_experiment({"experiment": "smoke", **over}, REPO)
    return pipeline.make_plan(dict(cfg, gpus_available=visible))


def test_repeats_get_distinct_seeds_by_default_and_one_seed_when_fixed():
    plan = _plan(2, repeats=3, train={"seed": 7})
    assert [plan.runs[f"ddp-g2-r{r}"].seed for r in range(3)] == [7, 8, 9]
    assert plan.runs["single-g1-r1"].seed == plan.runs["dp-g2-r1"].seed == 8   # a repeat shares its seed
    fixed = _plan(2, repeats=3, seeds="fixed", train={"seed": 7})
    assert {rc.seed for rc in fixed.runs.values()} == {7}


def test_the_default_experiment_makes_fast_and_deterministic_runs():
    plan = pipeline.make_plan(dict(pipeline.load_experiment({}, REPO), gpus_available=2))
    fast = [rc for rc in plan.runs.values() if not rc.deterministic]
    det = [rc for rc in plan.runs.values() if rc.deterministic]
    # the sharded variants are experiments of their own (issue 26), not the default one's
    assert {rc.variant for rc in fast} == {rc.variant for rc in det} == set(VARIANTS) - set(SHARDED_VARIANTS)
    assert {rc.gpus for rc in det} == {1, 2} and {rc.repeat for rc in det} == {0, 1}
    assert "ddp-g2-deterministictrue-r1" in plan.runs and "ddp-g2-r2" in plan.runs
    assert all(rc.dataset == "cifar10" for rc in plan.runs.values())


def test_the_cpu_plan_says_what_it_replaced_and_runs_timed_jobs_one_at_a_time():
    plan = _plan(0)
    assert plan.cpu and {rc.dataset for rc in plan.runs.values()} == {"synthetic"}
    replaced = plan.cpu_replaced()
    assert (replaced["global_batch"], replaced["max_steps"]) == ((128, 32), (12, 5))
    assert "global_batch=128" in plan.banner()   # the banner says what it replaced
    assert all(rc.eval_samples == 256 for rc in plan.runs.values())
    assert plan.cpu_timing_for("single-g1-r0") == plan.cpu_timing_for("ddp-g2-r0") == 1
    assert plan.cpu_timing_for("dp-g2-r0") == 0                     # recorded as skipped at once
    assert _plan(2).cpu_timing_for("single-g1-r0") == 0             # GPU runs are not CPU-timed


def test_the_cpu_plan_honours_what_the_user_asked_for_by_name():
    plan = _plan(0, train={"dataset": "cifar10", "max_steps": "3"})
    assert {rc.dataset for rc in plan.runs.values()} == {"cifar10"}
    assert {rc.max_steps for rc in plan.runs.values()} == {3}
    assert {rc.eval_samples for rc in plan.runs.values()} == {256}
    assert "dataset" not in plan.cpu_replaced() and "max_steps" not in plan.cpu_replaced()


def test_the_cpu_plan_keeps_the_repeats_the_user_gave():
    assert {rc.repeat for rc in _plan(0).runs.values()} == {0}             # cpu_plan.repeats
    plan = _plan(0, repeats=2)
    assert {rc.repeat for rc in plan.runs.values()} == {0, 1} and plan.config["cpu_plan"]["repeats"] == 2
    assert {rc.repeat for rc in _plan(0, repeats=3, cpu_plan={"repeats": 2}).runs.values()} == {0, 1}


# -- one skip rule: the plan's resources, its banner and the launcher -----------------------

SKIP_CASES = [{}, {"train": {"device": "cuda"}}, {"train": {"device": "cpu"}},
              {"train": {"batchnorm": "sync"}, "variants": ["ddp"]},
              {"train": {"compile": "default"}}, {"gpus": [1, 2, 3]}]


@pytest.mark.parametrize("visible", [0, 1, 2])
@pytest.mark.parametrize("over", SKIP_CASES)
def test_the_plan_skips_what_the_launcher_skips(visible, over):
    from dpbench.run import launch
    plan = _plan(visible, **over)
    for rid, rc in plan.runs.items():
        skip = launch.skip_reason(rc, visible) is not None
        assert plan.skipped(rc) == skip, rid
        if skip:   # a skipped run holds nothing a scheduler could keep it waiting for
            assert (plan.gpus_for(rid), plan.threads_for(rid), plan.cpu_timing_for(rid)) == (0, 1, 0), rid
        assert plan.cpu_timing_for(rid) == int(visible == 0 and not skip), rid


def test_the_cpu_plan_times_no_run_that_it_skips():
    plan = _plan(0, train={"device": "cuda"})                        # nothing can run without CUDA
    assert {plan.cpu_timing_for(rid) for rid in plan.runs} == {0}
    assert all(plan.skipped(rc) for rc in plan.runs.values())
    sync = _plan(0, train={"batchnorm": "sync"}, variants=["ddp"])
    assert sync.cpu_timing_for("ddp-g2-r0") == 0


def skipped_runs(plan: Plan) -> list[tuple[str, int]]:
    return sorted((rc.variant, rc.gpus) for rc in plan.runs.values() if plan.skipped(rc))


DP_FAMILY = [(v, g) for v in ("dp", "dp_mean", "dp_sum") for g in (1, 2)]   # no compile: skipped


def test_the_banner_names_the_runs_the_rule_skips():
    one = _plan(1)
    assert {g for _, g in skipped_runs(one)} == {2} and "[2]" in one.banner()
    assert skipped_runs(_plan(2)) == []
    compiled = _plan(2, train={"compile": "default"})
    assert skipped_runs(compiled) == DP_FAMILY
    skipped = [rc for rc in compiled.runs.values() if compiled.skipped(rc)]
    assert compiled.skipped_summary(skipped) in compiled.banner()
    both = _plan(1, train={"compile": "default"})
    assert set(skipped_runs(both)) == {(v, g) for v, g in DP_FAMILY if g == 1} | {r for r in skipped_runs(one)}
    cpu = _plan(0)
    assert skipped_runs(cpu) == DP_FAMILY
    assert cpu.skipped_summary([rc for rc in cpu.runs.values() if cpu.skipped(rc)]) in cpu.banner()


def test_the_train_rule_passes_the_planned_gpus_to_the_launcher(wd):
    proc = run_snakemake(wd, "-n", "-p", "results/x/runs/ddp-g2-r0/metrics.json",
                         "--config", "experiment=smoke", "gpus_available=1", "tag=x", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "-m dpbench.run.launch" in proc.stdout and "--planned-gpus 1" in proc.stdout


def test_the_launcher_imports_the_engine_only_to_train_and_the_engine_never_the_launcher():
    import ast
    imported = {}
    for name in ("engine", "launch"):
        tree = ast.parse((REPO / "src" / "dpbench" / "run" / f"{name}.py").read_text())
        top = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
        anywhere = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported[name] = (top, anywhere)
    assert "dpbench.run.launch" not in imported["engine"][1]   # no circle
    assert "dpbench.run.engine" not in imported["launch"][0]   # torch-free at load time


# -- the result set ---------------------------------------------------------------------------

def test_a_result_set_answers_every_path(tmp_path):
    rs = results.ResultSet(tmp_path, "torch-2.14.1+cu130")
    d = tmp_path / "torch-2.14.1+cu130"
    assert rs.dir == d and results.ResultSet.at(d) == rs
    assert rs.metrics_path("ddp-g2-r0") == d / "runs/ddp-g2-r0/metrics.json"
    assert rs.steps_path("ddp-g2-r0") == d / "runs/ddp-g2-r0/steps.csv"
    assert rs.table_path("summary") == d / "summary.csv" == results.table_path(tmp_path, rs.tag, "summary")
    assert set(rs.table_paths()) == set(results.TABLES)
    assert rs.provenance_path == d / "provenance.json" and rs.summary_md == d / "summary.md"
    assert (rs.claims_md, rs.claims_json) == (d / "claims.md", d / "claims.json")
    assert rs.probe_path("C2") == d / "claims/C2.json" and rs.probe_paths() == {}
    assert rs.figure_path("memory") == d / "figures/memory.png"
    assert rs.claim_figure_path("C8_dp_step") == d / "figures/claim_c8_dp_step.png"
    assert rs.relative(rs.claim_figure_path("C1")) == "figures/claim_c1.png"
    assert rs.log_path("ddp-g2-r0") == d / "logs/ddp-g2-r0.log" and rs.report_html == d / "report.html"
    assert rs.compare_paths("b") == (tmp_path / "compare/torch-2.14.1+cu130_vs_b.md",
                                     tmp_path / "compare/torch-2.14.1+cu130_vs_b.json")
    with pytest.raises(KeyError, match="'nope'"):   # the table asked for
        rs.table_path("nope")
    assert rs.metrics("ddp-g2-r0") is None and rs.record("ddp-g2-r0") is None
    results.write_json(rs.metrics_path("ddp-g2-r0"), {"run_id": "ddp-g2-r0", "status": "ok"})
    results.write_json(rs.probe_path("C3"), {})
    assert [rec["run_id"] for rec, _ in rs.runs()] == ["ddp-g2-r0"] and list(rs.probe_paths()) == ["C3"]


def test_an_old_record_reads_with_defaults_and_a_new_one_as_written():
    old = {"run_id": "ddp-g2-r1", "status": "ok", "variant": "ddp", "gpus": 2, "repeat": 1, "options": {},
           "config": {"global_batch": 512, "seed": 3}}
    rec = results.RunRecord.from_json(old)
    assert (rec.seed, rec.deterministic, rec.scaling, rec.per_gpu_batch, rec.reason) == (3, False, "strong", 256.0, "")
    new = dict(old, seed=4, deterministic=True, scaling="weak", per_gpu_batch=64,
               config={"global_batch": 128, "per_gpu_batch": 64})
    rec = results.RunRecord.from_json(new)
    assert (rec.seed, rec.deterministic, rec.scaling, rec.per_gpu_batch, rec.ok) == (4, True, "weak", 64, True)
    weak_old = dict(old, config={"global_batch": 128, "per_gpu_batch": 64})
    assert results.RunRecord.from_json(weak_old).scaling == "weak"
    with pytest.raises(ValueError, match="run_id"):   # the key it lacks
        results.RunRecord.from_json({"status": "ok"})


def test_provenance_values_are_one_value_or_a_list():
    prov = {"torch": "2.14.1", "cpu_threads": [1, 2], "gpu_names": ["H200", "H200"], "driver": None}
    assert results.provenance_values(prov, "torch") == ["2.14.1"]
    assert results.provenance_values(prov, "cpu_threads") == [1, 2]
    assert results.provenance_values(prov, "gpu_names") == [["H200", "H200"]]
    assert results.provenance_values(prov, "driver") == results.provenance_values(prov, "nope") == []
    assert results.provenance_values({"gpu_names": [["H200"], ["H200", "H200"]]}, "gpu_names") == \
        [["H200"], ["H200", "H200"]]
    assert results.gpu_models({"gpu_names": [["B200"], ["H200", "H200"]]}) == ["B200", "H200"]
    assert results.gpu_models({"gpu_names": []}) == []


def test_tables_read_text_columns_as_text(tmp_path):
    rs = results.ResultSet(tmp_path, "t")
    results.write_csv(rs.table_path("summary"), results.SUMMARY_COLUMNS,
                      [{"run_id": "single-g1-r0", "variant": "single", "gpus": 1, "repeat": 0, "status": "ok",
                        "images_per_s": 10.5, "precision": "", "device_type": ""}])
    df = rs.table("summary")
    assert df.loc[0, "options"] == "" and df.loc[0, "reason"] == "" and df.loc[0, "precision"] == ""
    assert df.loc[0, "images_per_s"] == 10.5 and df.loc[0, "gpus"] == 1


# -- the dpbench command ----------------------------------------------------------------------

def test_the_dpbench_command_runs_each_tool_and_returns_its_exit_code(tmp_path, capsys):
    import torch
    assert cli.main(["tag", "smoke"]) == 0 and capsys.readouterr().out.strip() == f"smoke-torch-{torch.__version__}"
    assert cli.main([]) == 2
    with pytest.raises(SystemExit) as err:
        cli.main(["bogus"])
    assert err.value.code == 2
    assert set(cli.COMMANDS) == {"train", "collect", "plots", "summary", "claims", "probe", "compare",
                                 "reference", "check-workload", "bisect"}
    out = tmp_path / "run"
    cfg = {"dataset": "synthetic", "synthetic_size": 24, "synthetic_test_size": 8, "global_batch": 12,
           "max_steps": 1, "warmup_steps": 0, "eval_each_epoch": False, "variant": "dp", "device": "cpu"}
    assert cli.main(["train", "--config", json.dumps(cfg), "--out", str(out)]) == 0   # dp: skipped on CPU
    assert results.read_json(out / results.METRICS)["status"] == results.STATUS_SKIPPED
    assert cli.main(["collect", "--results-dir", str(tmp_path), "--tag", "none"]) in (0, 1, 2)


def test_the_launcher_names_itself_as_it_was_started(monkeypatch, capsys):
    from dpbench.run import launch
    monkeypatch.setattr(sys, "argv", ["/x/dpbench/launch.py"])
    with pytest.raises(SystemExit):
        launch.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: launch.py ")      # python -m dpbench.run.launch
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert capsys.readouterr().out.startswith("usage: dpbench train ")


def test_the_mixed_experiment_has_a_single_baseline_for_both_kinds_of_scaling():
    """experiments/mixed.yaml exists to give strong and weak efficiencies from one launch: every
    2-GPU cell needs single runs of its setup at its global and at its per-GPU batch."""
    plan = pipeline.make_plan(dict(pipeline.load_experiment({"experiment": "mixed"}, REPO), gpus_available=2))
    setup_of = {rid: ident.setup_id for rid, ident in plan.identities.items()}
    singles = {(setup_of[rid], rc.global_batch) for rid, rc in plan.runs.items() if rc.variant == "single"}
    multi = {rid: rc for rid, rc in plan.runs.items() if rc.gpus == 2}
    assert {rc.variant for rc in multi.values()} == {"dp", "ddp"} and {rc.repeat for rc in multi.values()} == {0, 1}
    for rid, rc in multi.items():
        setup = setup_of[rid]
        assert (setup, rc.global_batch) in singles, f"{rc.variant} g2 at {rc.global_batch}: no strong baseline"
        if rc.global_batch == 1024:   # 512 a GPU, as single runs at 512
            assert (setup, 512) in singles, f"{rc.variant} g2 at 1024: no weak baseline"
    assert {rc.global_batch for rc in multi.values()} == {512, 1024}
    assert plan.config["exclusive_timing"] is True


def test_the_cpu_plan_shrinks_a_named_workloads_args_and_says_so():
    lm = {"name": "transformer-lm", "args": {"width": 768, "layers": 12, "heads": 12, "vocab": 50257}}
    over = {"matrix": [{"name": "lm", "variants": ["single"], "options": {"workload": lm}}],
            "cpu_plan": {"workload_args": {"transformer-lm": {"width": 64, "layers": 2, "heads": 4}}}}
    cpu = _plan(0, **over)
    (rc,) = cpu.runs.values()
    assert rc.workload == {"name": "transformer-lm", "args": {"width": 64, "layers": 2, "heads": 4, "vocab": 50257}}
    assert rc.options["workload"] == rc.workload          # the label names what trains
    doc = cpu.document()["cpu_replaced"]["lm.workload.args"]
    assert doc == {"asked": {"heads": 12, "layers": 12, "width": 768}, "used": {"heads": 4, "layers": 2, "width": 64}}
    assert "lm.workload.args=" in cpu.banner()
    (gpu,) = _plan(2, **over).runs.values()                # a GPU plan trains the size asked for
    assert gpu.workload == lm


# -- options a variant ignores, factories that are not there (issue 36, row 12) ------------------

def _refused(visible: int = 2, **over) -> str:
    with pytest.raises(pipeline.ConfigError) as err:
        _plan(visible, **over).runs
    return str(err.value)


@pytest.mark.parametrize("option, value, variants", [
    ("hsdp_shard_size", 2, ["ddp"]), ("reshard_after_forward", False, ["single", "ddp"]),
    ("static_graph", True, ["fsdp"]), ("bucket_cap_mb", 50, ["ddp", "fsdp"]),
    ("collective_timeout_s", 60, ["single", "dp"])])
def test_a_groups_option_its_variant_ignores_is_refused_naming_both(option, value, variants):
    from dpbench.plan import variants as registry
    ignoring = [v for v in variants if not registry.takes(v, option)]
    text = _refused(matrix=[{"name": "g", "variants": variants, "options": {option: value}}])
    assert text.count("\n") == 0 and option in text and all(v in text for v in ignoring)
    takers = registry.takers(option)
    ok = _plan(2, matrix=[{"name": "g", "variants": list(takers), "gpus": [2], "options": {option: value}}])
    assert {rc.variant for rc in ok.runs.values()} == set(takers)   # a sweep over those that take it
    assert all(getattr(rc, option) == value for rc in ok.runs.values())


def test_a_groups_option_at_its_default_names_nothing_and_passes():
    plan = _plan(2, matrix=[{"name": "g", "variants": ["single", "ddp"], "options": {"static_graph": False}}])
    assert "single-g1-static_graphfalse-r0" in plan.runs


def test_a_train_option_needs_a_variant_of_the_experiment_that_takes_it():
    text = _refused(train={"hsdp_shard_size": 2}, variants=["single", "ddp"])
    assert "train" in text and "hsdp_shard_size" in text
    # a recipe's DDP knobs over single and ddp: ddp takes them (the runs' ids are as before)
    plan = _plan(2, train={"static_graph": True})
    assert set(plan.runs) == set(_plan(2).runs)
    # the fast recipe over perf: single groups, and ddp groups that name the knob themselves
    perf = _plan(2, train={"static_graph": True}, matrix=[
        {"name": "s", "variants": ["single"]}, {"name": "d", "variants": ["ddp"], "options": {"static_graph": False}}])
    assert {rc.static_graph for rc in perf.runs.values() if rc.variant == "ddp"} == {False}
    assert _refused(train={"static_graph": True}, matrix=[{"name": "s", "variants": ["single", "fsdp"]}])


def test_a_memory_cap_without_cuda_is_a_skipped_run_with_the_reason():
    cpu = _plan(0, train={"memory_cap_gib": 8})
    reasons = {rid: cpu.skip_reason(rc) for rid, rc in cpu.runs.items()}
    assert reasons["single-g1-r0"] and "memory_cap_gib" in reasons["single-g1-r0"]
    assert all(r for r in reasons.values())
    gpu = _plan(2, train={"memory_cap_gib": 8})
    assert gpu.skip_reason(gpu.runs["single-g1-r0"]) is None
    assert cpu.skip_reason(dataclasses.replace(cpu.runs["single-g1-r0"], memory_cap_gib=None)) is None


@pytest.mark.parametrize("factory", ["no/such/models.py:build", "models_not_here.py:build",
                                     "no_such_package_36.models:build", "dpbench.workloads.no_such:build",
                                     "dpbench.workloads.registry.deeper:build"])
def test_a_factory_that_is_not_there_is_refused_at_planning(factory, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = _refused(matrix=[{"name": "g", "options": {"workload": f"{factory}"}}])
    assert factory in text and text.count("\n") == 0
    assert _refused(train={"workload": {"factory": factory, "args": {"width": 8}}})


def test_a_factory_that_is_there_plans_without_being_imported(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text("raise SystemExit('imported at planning')\n")
    (tmp_path / "pkg36").mkdir()
    (tmp_path / "pkg36" / "__init__.py").write_text("raise SystemExit('imported at planning')\n")
    (tmp_path / "pkg36" / "models.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for factory in ("mine.py:build", f"{tmp_path}/mine.py:build", "pkg36.models:build",
                    "dpbench.workloads.resnet_cifar:build"):
        assert _plan(2, matrix=[{"name": "g", "options": {"workload": factory}}]).runs
    assert "pkg36" not in sys.modules


# -- a workload set in train names the runs (row 13) ----------------------------------------------

LM = {"name": "transformer-lm", "args": {"width": 16, "layers": 1, "heads": 2, "seq_len": 8, "vocab": 64}}


def test_a_workload_set_in_train_is_part_of_every_runs_id_and_label():
    plain, lm = _plan(2), _plan(2, train={"workload": LM})
    assert not set(plain.runs) & set(lm.runs)
    label = results.options_label({"workload": LM})
    assert all(rc.options["workload"] == LM and rc.workload == LM for rc in lm.runs.values())
    assert {rid.replace(f"-w{results.workload_label(LM)}", "") for rid in lm.runs} == set(plain.runs)
    assert [g["label"] for g in lm.document()["groups"]] == [label]
    # spelled as the default, or a group's own workload: as before
    assert set(_plan(2, train={"workload": "resnet18-cifar10"}).runs) == set(plain.runs)
    mine = _plan(2, train={"workload": LM}, matrix=[{"name": "g", "options": {"workload": "torchvision"}}])
    assert {rc.options["workload"] for rc in mine.runs.values()} == {"torchvision"}


def test_the_cpu_plan_keeps_a_groups_batch_and_budget_within_keep_up_to():
    over = {"variants": ["single"], "matrix": [
        {"name": "small", "options": {"global_batch": 16, "max_steps": 12}},
        {"name": "mid", "options": {"global_batch": 64}},
        {"name": "big", "options": {"global_batch": 512, "max_steps": 40}}]}
    old = _plan(0, **over)
    assert len(old.runs) == 1                         # without keep_up_to: the CPU's budget, one cell
    cpu = _plan(0, cpu_plan={"keep_up_to": {"global_batch": 64, "max_steps": 12}}, **over)
    got = {g: [(rc.global_batch, rc.max_steps) for rc in runs.values()] for g, runs in cpu.group_runs.items()}
    assert got == {"small": [(16, 12)], "mid": [(64, 5)], "big": [(32, 5)]}
    assert len(cpu.runs) == 3
