"""The knobs (run.knobs) and their mechanism checks (run.mechanisms) on gloo ranks: gradient
accumulation equals the unaccumulated step on the same global batch (losses, gradients,
parameters within 1e-6) for ddp, zero1, fsdp and hsdp, with one synchronisation per optimizer
step as planned; the planted no-op deferral (NVIDIA/cosmos-framework#161) and the checkpoint
wrapper that saves nothing (pytorch#82293) fail their checks; checkpointing and offload change
no loss; refused combinations are skips with the reason; compare calls a check that stopped
holding a regression."""
from __future__ import annotations

import json

import pytest
from fakes import make_runs, write_set
from sharded_ranks import TINY_CNN, TINY_LM, Case, max_differences, share_two_ranks, train_all, two_rank_results

from dpbench import results
from dpbench.plan import skips
from dpbench.plan.config import RunConfig

TOLERANCE = 1e-6
K = 4   # micro-batches: 2 ranks x 4 = the global batch of 8


def acc(name, variant, k=K, workload=TINY_LM, plant="", **options) -> Case:
    return Case(name, variant, workload, {"accumulate": k, **options}, plant=plant)


def two_rank_cases() -> list[Case]:
    return [Case("ddp", "ddp"), Case("zero1", "zero1"), Case("fsdp", "fsdp"),
            Case("hsdp", "hsdp", options={"hsdp_shard_size": 1}),
            acc("ddp_acc", "ddp"), acc("zero1_acc", "zero1"), acc("fsdp_acc", "fsdp"),
            acc("hsdp_acc", "hsdp", hsdp_shard_size=1),
            acc("ddp_acc_noop", "ddp", plant="accumulate-noop"), acc("fsdp_acc_noop", "fsdp", plant="accumulate-noop"),
            acc("hsdp_acc_noop", "hsdp", plant="accumulate-noop", hsdp_shard_size=1),
            Case("ddp_ckpt", "ddp", options={"checkpoint": "units"}),
            Case("fsdp_ckpt", "fsdp", options={"checkpoint": "units"}),
            Case("fsdp_ckpt_noop", "fsdp", options={"checkpoint": "units"}, plant="checkpoint-noop"),
            Case("fsdp_offload", "fsdp", options={"offload": True})]


share_two_ranks(__name__, two_rank_cases())


@pytest.fixture(scope="module")
def two():
    return two_rank_results(__name__)


def verdicts(trained, name) -> dict[str, dict]:
    return {f"{m['knob']}.{m['check']}": m for m in trained[name].mechanisms}


def counts(rows) -> dict[str, int]:
    return {r["collective"]: r["count"] for r in rows}


def within(diffs: dict[str, float]) -> bool:
    return all(v <= TOLERANCE for v in diffs.values())


@pytest.mark.parametrize("variant", ["ddp", "zero1", "fsdp", "hsdp"])
def test_accumulation_equals_one_step_on_the_same_global_batch(two, variant):
    diffs = max_differences(two[variant], two[f"{variant}_acc"])
    assert within(diffs), diffs
    assert len(two[f"{variant}_acc"].micro) == K


@pytest.mark.parametrize("variant", ["ddp", "zero1", "fsdp", "hsdp"])
def test_deferred_sync_holds_with_one_reduction_pass_per_optimizer_step(two, variant):
    v = verdicts(two, f"{variant}_acc")
    assert (v["accumulate.sync"]["held"], v["accumulate.sync"]["counted"]) == (True, 1)
    assert v["accumulate.gradients"]["held"] is True
    # the plan: the unaccumulated step's reductions, once; fsdp gathers in every micro-batch
    base, step = counts(two[variant].collectives), counts(two[f"{variant}_acc"].collectives)
    reduction = "reduce_scatter" if variant == "fsdp" else "all_reduce"
    assert step[reduction] == base[reduction]
    if variant == "fsdp":
        assert step["all_gather"] == K * base["all_gather"]
        # deferred reduce-scatter: every gradient whole mid-accumulation, sharded after the step
        grads = [m["gradient_bytes"] for m in two["fsdp_acc"].micro]
        assert grads[0] == 2 * grads[-1]


@pytest.mark.parametrize("variant", ["ddp", "fsdp", "hsdp"])
def test_the_planted_noop_deferral_trains_the_same_and_fails_its_check(two, variant):
    planted = two[f"{variant}_acc_noop"]
    assert within(max_differences(two[variant], planted))   # only the mechanism check can see it
    sync = verdicts(two, f"{variant}_acc_noop")["accumulate.sync"]
    assert (sync["held"], sync["expected"], sync["counted"]) == (False, 1, K)   # the knob did nothing
    reduction = "reduce_scatter" if variant == "fsdp" else "all_reduce"
    assert counts(planted.collectives)[reduction] == K * counts(two[variant].collectives)[reduction]
    if variant == "fsdp":   # reduce-scattered every micro-batch: the gradients were never whole
        assert verdicts(two, "fsdp_acc_noop")["accumulate.gradients"]["held"] is False


def test_checkpointing_changes_no_loss_and_keeps_only_unit_inputs(two):
    for variant in ("ddp", "fsdp"):
        assert max_differences(two[variant], two[f"{variant}_ckpt"])["loss"] == 0.0
        check = verdicts(two, f"{variant}_ckpt")["checkpoint.saved_inside_units"]
        assert check["held"] is True and check["counted"] <= check["expected"]
    noop = verdicts(two, "fsdp_ckpt_noop")["checkpoint.saved_inside_units"]
    assert noop["held"] is False and noop["counted"] > 2 * noop["expected"]


def test_offload_changes_no_loss_and_says_the_cpu_has_nothing_to_offload_from(two):
    assert within(max_differences(two["fsdp"], two["fsdp_offload"]))
    check = verdicts(two, "fsdp_offload")["offload.device_bytes"]
    assert (check["held"], check["expected"], check["counted"]) == (None, 0, None)   # nothing to count on a CPU


def test_runs_without_knobs_judge_nothing(two):
    assert all(not two[name].mechanisms for name in ("ddp", "zero1", "fsdp", "hsdp"))


@pytest.mark.slow
def test_four_ranks_accumulation_parity_and_the_hsdp_mesh_keeps_its_shards():
    """4 ranks, per-rank batch 4 in 2 micro-batches: the LM and a BatchNorm CNN (frozen
    statistics, so a micro-batch's statistics are the batch's); a 2x2 hsdp mesh reduce-scatters
    every micro-batch (its gradients stay sharded) and all-reduces across replicas once."""
    for workload in (TINY_LM, TINY_CNN):
        bn = {"batchnorm": "eval"} if workload == TINY_CNN else {}
        cases = [Case(v, v, workload, dict(bn, **({"hsdp_shard_size": 2} if v == "hsdp" else {})))
                 for v in ("ddp", "zero1", "fsdp", "hsdp")]
        cases += [acc(f"{c.name}_acc", c.variant, 2, workload, **c.options) for c in cases]
        cases.append(acc("fsdp_acc_noop", "fsdp", 2, workload, plant="accumulate-noop", **bn))
        trained = train_all(cases, world=4, global_batch=16)
        for v in ("ddp", "zero1", "fsdp", "hsdp"):
            assert within(max_differences(trained[v], trained[f"{v}_acc"])), v
            assert verdicts(trained, f"{v}_acc")["accumulate.sync"]["held"] is True, v
        hsdp, base = counts(trained["hsdp_acc"].collectives), counts(trained["hsdp"].collectives)
        assert hsdp["all_reduce"] == base["all_reduce"] and hsdp["reduce_scatter"] == 2 * base["reduce_scatter"]
        kept, whole = (verdicts(trained, f"{v}_acc")["accumulate.gradients"] for v in ("hsdp", "fsdp"))
        assert kept["held"] is True and kept["expected"] == pytest.approx(whole["expected"] / 2, rel=1e-4)   # 1/2 shards
        assert verdicts(trained, "fsdp_acc_noop")["accumulate.sync"]["held"] is False


# -- refusals, torch-free --------------------------------------------------------------------------

def cfg(**kw) -> RunConfig:
    return RunConfig.from_dict({"gpus": 2, "global_batch": 8, **kw})


def test_refused_combinations_are_skips_with_the_reason():
    assert "offload" in skips.skip_reason(cfg(variant="ddp", offload=True), 0)            # the key named
    assert "accumulate=3" in skips.skip_reason(cfg(variant="ddp", accumulate=3), 0)
    assert skips.skip_reason(cfg(variant="fsdp", offload=True, accumulate=4), 0) is None
    assert skips.skip_reason(cfg(variant="fsdp", compile="default"), 2) is None   # per-unit compile is wired
    with pytest.raises(ValueError, match="checkpoint"):
        cfg(checkpoint="everything")
    with pytest.raises(ValueError, match="accumulate"):
        cfg(accumulate=0)


def test_the_knobs_stay_out_of_a_default_runs_config():
    assert not {"accumulate", "checkpoint", "offload"} & set(cfg(variant="ddp").to_dict())
    assert cfg(variant="ddp", accumulate=2).to_dict()["accumulate"] == 2


def test_an_old_record_reads_with_no_mechanisms():
    old = {"format": 2, "run_id": "ddp-g2-r0", "status": "ok", "config": {}}
    assert results.upgrade(old)["mechanisms"] == []


def test_a_workload_without_shard_units_is_a_skip_for_checkpointing(tmp_path):
    from dpbench.run.launch import main as launch_main
    config = {"variant": "single", "gpus": 1, "device": "cpu", "max_steps": 1, "checkpoint": "units",
              "workload": "sharded_ranks.py:tiny_cnn", "synthetic_size": 8, "global_batch": 4}
    # tiny_cnn names BasicBlock as its unit: it runs; the same without units is refused
    import sharded_ranks
    assert sharded_ranks.tiny_cnn().shard_modules
    config["workload"] = {"factory": str(tmp_path / "flat.py") + ":build"}
    (tmp_path / "flat.py").write_text(
        "import torch\nfrom dpbench.workloads.resnet_cifar import per_sample_cross_entropy\n"
        "from dpbench.workloads.spec import WorkloadSpec\n"
        "def build():\n    return WorkloadSpec(model=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10)),\n"
        "        loss=per_sample_cross_entropy, batch=lambda g, n: (torch.randn(n, 3, 2, 2, generator=g),\n"
        "        torch.randint(0, 10, (n,), generator=g)))\n")
    assert launch_main(["--config", json.dumps(config), "--out", str(tmp_path / "run")]) == 0
    rec = results.read_metrics(tmp_path / "run")
    assert rec["status"] == results.STATUS_SKIPPED and "shard_modules" in rec["reason"]


# -- through the engine and compare ----------------------------------------------------------------

def launch(out, **config) -> dict:
    from dpbench.run.launch import main as launch_main
    base = {"gpus": 2, "workload": TINY_LM, "synthetic_size": 32, "global_batch": 8, "max_steps": 3,
            "warmup_steps": 2, "eval_each_epoch": False, "variant": "ddp", "accumulate": 2}
    assert launch_main(["--config", json.dumps({**base, **config}), "--out", str(out)]) == 0
    return results.read_metrics(out)


@pytest.mark.slow
def test_the_record_says_the_mechanism_held_and_the_planted_noop_failed(tmp_path, monkeypatch):
    ok = launch(tmp_path / "ok")
    assert ok["status"] == "ok", ok["reason"]
    assert [(m["knob"], m["check"], m["held"]) for m in ok["mechanisms"]] == [
        ("accumulate", "sync", True), ("accumulate", "gradients", True)]
    monkeypatch.setenv("DPBENCH_PLANT", "accumulate-noop")
    bad = launch(tmp_path / "bad")
    sync = bad["mechanisms"][0]
    assert (sync["held"], sync["counted"]) == (False, 2)
    assert {r["collective"]: r["count"] for r in bad["collectives"]}["all_reduce"] == 2


def test_compare_calls_a_check_that_stopped_holding_a_regression():
    from dpbench.analysis.compare.mechanisms import compare_mechanisms
    from dpbench.analysis.compare.verdict import failing

    def side(held):
        raw = {"run_id": "ddp-g2-r0", "status": "ok", "variant": "ddp", "gpus": 2, "config": {},
               "mechanisms": [{"knob": "accumulate", "check": "sync", "expected": 1,
                               "counted": 1 if held else 4, "held": held, "text": "..."}]}
        return {"records": {"ddp-g2-r0": results.RunRecord.from_json(raw)}}
    (row,) = compare_mechanisms(side(True), side(False))
    assert (row.baseline, row.candidate, row.severity) == ("held", "failed", "regression")
    assert compare_mechanisms(side(True), side(True))[0].severity == "info"
    report = {"provenance": {"severity": "info"}, "status": [], "throughput": [], "memory": [],
              "warnings": {"new": [], "vanished": [], "changed": []}, "loss": [], "accuracy": [],
              "mechanisms": [{"severity": row.severity}]}
    assert failing(report)["regressions"] == 1


def test_a_planted_noop_in_the_candidate_set_fails_compare_and_shows_in_both_reports(tmp_path):
    """Two result sets, identical but for one run's sync check: compare's verdict counts one
    regression, its report and the candidate's summary.md show the mechanism table."""
    from dpbench.analysis import compare as cmp
    from dpbench.report.compare_report import render_markdown
    from dpbench.report.summarize import mechanisms_section

    def with_check(held: bool) -> list[dict]:
        runs = make_runs()
        for run in runs:
            if run["variant"] == "ddp":
                run["record"] = {"mechanisms": [{"knob": "accumulate", "check": "sync", "expected": 1,
                                                 "counted": 1 if held else 4, "held": held,
                                                 "text": "deferred sync: ..." if held else "expected 1, counted 4"}]}
        return runs
    write_set(tmp_path, "A", with_check(True))
    write_set(tmp_path, "B", with_check(False))
    report = cmp.compare(tmp_path, "A", "B")
    regressed = [m for m in report["mechanisms"] if m["severity"] == "regression"]
    assert regressed and {m["variant"] for m in regressed} == {"ddp"}
    assert report["verdict"]["counts"]["regressions"] == len(regressed)
    assert "## Mechanisms" in render_markdown(report)
    assert cmp.compare(tmp_path, "A", "A")["verdict"]["counts"]["regressions"] == 0
    section = mechanisms_section(results.ResultSet(tmp_path, "B"))
    assert "## Mechanisms" in section and "expected 1, counted 4" in section


@pytest.mark.slow
def test_the_one_gpu_knobs_bench_runs_a_tiny_cell_on_the_cpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    bench = Path(__file__).parents[2] / "tools" / "device" / "knobs_bench.py"
    done = subprocess.run([sys.executable, str(bench), "--tiny", "--only", "lm-124m", "--budget-s", "1",
                           "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "out" / "knobs_bench.json").read_text())
    assert [(r["cell"], r["variant"], r["knob"], r["status"]) for r in out["rows"]] == [
        ("lm-124m", "fsdp", "base", "ok")]
    assert "lm-124m-fsdp-accumulate" in out["not_run"]
    assert (tmp_path / "out" / "runs.tar.gz").is_file() and "| cell |" in done.stdout


def test_the_traffic_model_plans_an_accumulated_step():
    from dpbench.analysis.traffic_model import predicted_traffic

    def payload(variant, k, **kw):
        return {c: v["payload"] for c, v in predicted_traffic(variant, 100, 4, accumulate=k, **kw).items()}
    assert payload("ddp", 4) == payload("ddp", 1) == {"all_reduce": 400}
    fsdp = payload("fsdp", 4)   # gathered in every micro-batch, reduce-scattered once
    assert fsdp == {"all_gather": 4 * 800, "reduce_scatter": 400}
    hsdp = payload("hsdp", 4, shard_size=2)   # 2x2: reduce-scatter per micro-batch, all-reduce once
    assert hsdp == {"all_gather": 4 * 800, "reduce_scatter": 4 * 400, "all_reduce": 200}
