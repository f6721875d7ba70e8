"""The sharded variants (zero1, fsdp, hsdp) on gloo ranks against ddp, on the same seed and
global batches: losses, gradients and parameters equal within 1e-6 (fp32), a planted
world-size scaling of the gradients caught, the profiled step's collectives and memory
components against their formulas, the skip rule on an older torch, and a stuck rank ending as
a failed record within the collective timeout."""
from __future__ import annotations

import csv
import json
import math
import os

import pytest
from sharded_ranks import TINY_CNN, TINY_LM, Case, max_differences, share_two_ranks, train_all, two_rank_results

from dpbench import results
from dpbench.plan import skips
from dpbench.plan.config import RunConfig
from dpbench.run.launch import main as launch_main

TOLERANCE = 1e-6   # fp32


def cases(workload) -> list[Case]:
    return [Case("ddp", "ddp", workload), Case("zero1", "zero1", workload),
            Case("fsdp", "fsdp", workload),
            Case("fsdp_keep", "fsdp", workload, {"reshard_after_forward": False}),
            Case("hsdp_2x1", "hsdp", workload, {"hsdp_shard_size": 1}),
            Case("fsdp_planted", "fsdp", workload, plant_scale=True)]


share_two_ranks(__name__, cases(TINY_LM))


@pytest.fixture(scope="module")
def two_ranks():
    """Every variant on the tiny transformer LM, 2 gloo ranks (seconds)."""
    return 2, two_rank_results(__name__)


@pytest.fixture(scope="module")
def four_ranks():
    """Every variant (and a 2x2 hsdp mesh) on a tiny ResNet and the tiny LM, 4 gloo ranks."""
    trained = {}
    for tag, workload in (("cnn", TINY_CNN), ("lm", TINY_LM)):
        four = cases(workload) + [Case("hsdp_2x2", "hsdp", workload, {"hsdp_shard_size": 2})]
        trained[tag] = train_all(four, world=4)
    return 4, trained


def check_parity(trained: dict) -> dict[str, dict[str, float]]:
    """Each sharded case's largest differences from ddp (the planted case left out)."""
    diffs = {name: max_differences(trained["ddp"], run) for name, run in trained.items()
             if name not in ("ddp", "fsdp_planted")}
    assert set(diffs) >= {"zero1", "fsdp", "fsdp_keep", "hsdp_2x1"}
    return diffs


def within(diffs: dict[str, float]) -> bool:
    return all(v <= TOLERANCE for v in diffs.values())


def test_two_ranks_every_sharded_variant_trains_as_ddp_does(two_ranks):
    _, trained = two_ranks
    for name, diffs in check_parity(trained).items():
        assert within(diffs), (name, diffs)
        assert len(trained[name].losses) == 3 and set(trained[name].grads) == {0, 2}


def test_gradients_world_size_times_too_large_fail_the_parity_check(two_ranks):
    """torch 2.7.1/2.8.0's FSDP2 on gloo: the run completes, its gradients are N times too
    large. The parity check must see it in the gradients and in the parameters."""
    _, trained = two_ranks
    diffs = max_differences(trained["ddp"], trained["fsdp_planted"])
    assert not within(diffs)
    assert diffs["grad_step0"] > 100 * TOLERANCE and diffs["params"] > 100 * TOLERANCE


def padded_bytes(trained_params: dict, world: int) -> int:
    """FSDP2's all-gather payload: each parameter's first dimension padded to a multiple of N."""
    return sum(math.ceil(p.shape[0] / world) * world * (p.numel() // p.shape[0]) * p.element_size()
               for p in trained_params.values())


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["collective"]: r for r in rows}


def check_collectives(trained: dict, world: int) -> None:
    params = trained["ddp"].params
    p_bytes = sum(p.numel() * p.element_size() for p in params.values())
    padded, units = padded_bytes(params, world), trained["fsdp"].units
    ddp = by_name(trained["ddp"].collectives)
    assert ddp["all_reduce"]["bytes"] == p_bytes   # one bucket pass over every gradient
    # what stands in where the reducer is out of sight, marked as not counted
    assert trained["ddp"].buckets == {**ddp["all_reduce"], "source": "buckets"} and ddp["all_reduce"]["source"] == "counted"
    zero1 = by_name(trained["zero1"].collectives)
    assert zero1["all_reduce"]["bytes"] == p_bytes
    # ZeRO-1 broadcasts every parameter from its owner after the step, one op per tensor
    ddp_bcast = ddp.get("broadcast", {"bytes": 0, "count": 0})
    assert zero1["broadcast"]["bytes"] - ddp_bcast["bytes"] == p_bytes
    assert zero1["broadcast"]["count"] - ddp_bcast["count"] == len(params)
    reshard = by_name(trained["fsdp"].collectives)   # each unit gathered in forward and again in backward
    assert (reshard["all_gather"]["count"], reshard["all_gather"]["bytes"]) == (2 * units, 2 * padded)
    keep = by_name(trained["fsdp_keep"].collectives)   # gathered once, kept to the backward
    assert (keep["all_gather"]["count"], keep["all_gather"]["bytes"]) == (units, padded)
    for rows in (reshard, keep):   # one reduce-scatter of each unit's gradients
        assert (rows["reduce_scatter"]["count"], rows["reduce_scatter"]["bytes"]) == (units, padded)
        assert "all_reduce" not in rows
    # a 2x1 mesh: shards of one rank, so no gather; the replicas all-reduce each unit's gradients
    hsdp = by_name(trained["hsdp_2x1"].collectives)
    assert set(hsdp) == {"all_reduce"} and (hsdp["all_reduce"]["count"], hsdp["all_reduce"]["bytes"]) == (units, p_bytes)


def check_memory(trained: dict, world: int) -> None:
    params = trained["ddp"].params
    p_bytes = sum(p.numel() * p.element_size() for p in params.values())
    mib = 2 ** 20
    ddp = trained["ddp"].memory
    assert [r["device"] for r in ddp] == list(range(world))
    assert all(r["parameters_mib"] * mib == r["gradients_mib"] * mib == r["optimizer_mib"] * mib == p_bytes
               for r in ddp)   # SGD with momentum: one buffer per parameter
    for name in ("fsdp", "fsdp_keep"):   # the shards add up to the model; each about 1/N of it
        rows = trained[name].memory
        for key in ("parameters_mib", "gradients_mib", "optimizer_mib"):
            assert sum(r[key] for r in rows) * mib == p_bytes
            assert max(r[key] for r in rows) * mib <= padded_bytes(params, world) / world
        assert rows[0]["largest_unit_mib"] * mib <= p_bytes and rows[0]["largest_unit_mib"] > 0
    zero1 = trained["zero1"].memory   # parameters and gradients whole, the optimizer partitioned
    assert all(r["parameters_mib"] * mib == p_bytes for r in zero1)
    assert sum(r["optimizer_mib"] for r in zero1) * mib == p_bytes
    largest = max(p.numel() * p.element_size() for p in params.values())
    assert max(r["optimizer_mib"] for r in zero1) * mib <= p_bytes / world + largest
    assert all(r[k] is None for r in ddp + zero1 for k in ("forward_peak_mib", "activation_peak_mib"))  # CPU


def test_two_ranks_collectives_match_their_formulas(two_ranks):
    world, trained = two_ranks
    check_collectives(trained, world)


def test_two_ranks_memory_components_match_their_formulas(two_ranks):
    world, trained = two_ranks
    check_memory(trained, world)


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["cnn", "lm"])
def test_four_ranks_parity_collectives_and_memory(four_ranks, workload):
    world, all_trained = four_ranks
    trained = all_trained[workload]
    diffs = check_parity(trained)
    assert "hsdp_2x2" in diffs
    for name, d in diffs.items():
        assert within(d), (name, d)
    assert not within(max_differences(trained["ddp"], trained["fsdp_planted"]))
    check_collectives(trained, world)
    check_memory(trained, world)
    # 2x2: gather within a shard pair, reduce-scatter there, all-reduce the half across replicas
    hsdp = by_name(trained["hsdp_2x2"].collectives)
    assert set(hsdp) == {"all_gather", "reduce_scatter", "all_reduce"}


# -- the skip rule and the options, torch-free ------------------------------------------------------

def cfg(**kw) -> RunConfig:
    return RunConfig.from_dict({"gpus": 2, **kw})


@pytest.mark.parametrize("release,cuda,expected", [
    ((2, 8, 0), False, skips.FSDP_ON_GLOO), ((2, 7, 1), False, skips.FSDP_ON_GLOO),
    ((2, 5, 1), False, skips.FSDP_ON_GLOO), ((2, 8, 0), True, None), ((2, 9, 0), False, None),
    ((2, 14, 1), False, None)])
def test_fsdp_on_gloo_before_2_9_is_skipped_with_the_reason(monkeypatch, release, cuda, expected):
    monkeypatch.setattr(skips, "torch_release", lambda: release)
    for variant in ("fsdp", "hsdp"):
        assert skips.skip_reason(cfg(variant=variant), 2 if cuda else 0) == expected
    assert skips.skip_reason(cfg(variant="zero1"), 0) is None   # ZeRO-1 is right on gloo everywhere


def test_what_fully_shard_refuses_is_a_skip(monkeypatch):
    monkeypatch.setattr(skips, "torch_release", lambda: (2, 3, 1))
    reason = skips.skip_reason(cfg(variant="fsdp"), 2)
    assert reason is not None and "2.4" in reason and "2.3.1" in reason   # the torch it needs, the one here
    monkeypatch.setattr(skips, "torch_release", lambda: (2, 14, 1))
    assert "channels_last" in skips.skip_reason(cfg(variant="fsdp", channels_last=True), 2)
    assert skips.skip_reason(cfg(variant="hsdp", compile="default"), 2) is None   # each unit, before fully_shard
    assert skips.skip_reason(cfg(variant="zero1", channels_last=True), 2) is None


def test_the_release_is_read_without_torch():
    import importlib.metadata
    assert skips.torch_release()[:2] == tuple(int(p) for p in importlib.metadata.version("torch").split(".")[:2])


def test_a_sharded_run_on_an_old_torch_is_a_skipped_record_naming_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(skips, "torch_release", lambda: (2, 8, 0))
    config = {"variant": "fsdp", "gpus": 2, "device": "cpu", "max_steps": 1}
    assert launch_main(["--config", json.dumps(config), "--out", str(tmp_path)]) == 0
    rec = results.read_metrics(tmp_path)
    assert rec["status"] == results.STATUS_SKIPPED and rec["reason"] == skips.FSDP_ON_GLOO


def test_hsdp_shard_size_must_divide_the_gpus():
    with pytest.raises(ValueError, match="hsdp_shard_size"):
        cfg(variant="hsdp", gpus=4, hsdp_shard_size=3)
    assert cfg(variant="hsdp", gpus=4, hsdp_shard_size=2).hsdp_shard_size == 2


def test_the_new_options_stay_out_of_a_default_runs_config_and_setup():
    """A ddp run's config reads as before the sharded variants (compare's config check, the
    setup hash); an fsdp run's knobs are recorded, and do not split it from single's setup."""
    from dpbench.results import setup_id as setup_key
    new = {"reshard_after_forward", "hsdp_shard_size", "collective_timeout_s"}
    assert not new & set(cfg(variant="ddp").to_dict())
    keep = cfg(variant="fsdp", reshard_after_forward=False, collective_timeout_s=30).to_dict()
    assert keep["reshard_after_forward"] is False and keep["collective_timeout_s"] == 30
    assert RunConfig.from_dict(keep).reshard_after_forward is False
    assert setup_key(keep) == setup_key(RunConfig.from_dict({"variant": "single"}).to_dict())


# -- through the launcher -----------------------------------------------------------------------------

def launch(out, **config) -> dict:
    base = {"gpus": 2, "workload": TINY_LM, "synthetic_size": 32, "global_batch": 8, "max_steps": 3,
            "warmup_steps": 2, "eval_each_epoch": False}
    assert launch_main(["--config", json.dumps({**base, **config}), "--out", str(out)]) == 0
    return results.read_metrics(out)


@pytest.mark.slow
def test_fsdp_run_records_ddps_curve_its_components_and_a_full_checkpoint(tmp_path):
    import torch
    ddp = launch(tmp_path / "ddp", variant="ddp")
    fsdp = launch(tmp_path / "fsdp", variant="fsdp", save_checkpoint=True)
    assert ddp["status"] == fsdp["status"] == "ok", fsdp["reason"]
    curve = {name: [float(r["loss_global"]) for r in csv.DictReader(open(tmp_path / name / results.STEPS))]
             for name in ("ddp", "fsdp")}
    assert max(abs(a - b) for a, b in zip(curve["ddp"], curve["fsdp"], strict=True)) <= TOLERANCE
    assert [r["device"] for r in fsdp["memory_components"]] == [0, 1]
    assert {r["collective"] for r in fsdp["collectives"]} == {"all_gather", "reduce_scatter"}
    state = torch.load(tmp_path / "fsdp" / "model.pt")
    assert all(not hasattr(t, "to_local") for t in state.values()) and "blocks.0.qkv.weight" in state
    assert not list((tmp_path / "fsdp").glob("rank*.wait.txt"))


@pytest.mark.slow
def test_a_rank_that_never_joins_ends_as_a_failed_record_naming_the_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("DPBENCH_FAULT", "1:1:hang")
    rec = launch(tmp_path / "run", variant="fsdp", collective_timeout_s=5)
    assert rec["status"] == results.STATUS_FAILED
    assert "rank0: at training, epoch 1 from step 0" in rec["reason"]
    assert os.path.exists(tmp_path / "run" / "rank0.error.txt")


@pytest.mark.slow
def test_a_rank_that_exits_badly_after_the_record_leaves_it_ok_with_the_exit_code_said(tmp_path, monkeypatch):
    """Rank 1 ends with a nonzero code once the run is over (a crash at teardown): rank 0's
    record is whole and stays ok, and it says torchrun's exit code in its warnings and launch."""
    from dpbench.run import faults
    monkeypatch.setenv(faults.FAULT_ENV, "1:exit")
    rec = launch(tmp_path / "run", variant="ddp")
    assert rec["status"] == results.STATUS_OK and rec["launch"]["exit_code"] != 0
    (said,) = [w for w in rec["warnings"] if w["category"] == "RankExit"]
    assert f"code {rec['launch']['exit_code']}" in said["message"]
    monkeypatch.setenv(faults.FAULT_ENV, "")
    clean = launch(tmp_path / "clean", variant="ddp")
    assert "exit_code" not in clean["launch"] and not [w for w in clean["warnings"] if w["category"] == "RankExit"]


def test_a_stalled_rank_ends_itself_naming_where_and_the_launcher_names_the_places(tmp_path):
    """What no collective timeout sees (a host-side hang) the stall guard ends; ranks aborted
    without a word (NCCL's watchdog) are named from their notes."""
    import subprocess
    import sys

    from dpbench.run import waits
    code = ("import time; from pathlib import Path; from dpbench.run.waits import Waits; "
            f"w = Waits(Path({str(tmp_path)!r}), 1); w.at('training, epoch 1 from step 0'); "
            "w.arm(0.3, poll_s=0.05); time.sleep(30)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert (tmp_path / "rank1.error.txt").read_text().startswith("at training, epoch 1 from step 0: no progress")
    waits.Waits(tmp_path, 0).at("evaluation after epoch 1")
    assert waits.notes(tmp_path) == {0: "evaluation after epoch 1", 1: "training, epoch 1 from step 0"}
    assert waits.waited_text(tmp_path, 300) == ("last places: rank 0 at evaluation after epoch 1, rank 1 at "
                                                "training, epoch 1 from step 0 (collective timeout 300 s)")
    waits.clear(tmp_path)
    assert waits.notes(tmp_path) == {} and waits.waited_text(tmp_path, 300) == ""


@pytest.mark.slow
def test_fsdp_in_bf16_trains_a_batchnorm_model_and_evaluates(tmp_path):
    """MixedPrecisionPolicy(bf16 parameters, fp32 reduction) on ResNet18: its BatchNorms compute
    in fp32 (PyTorch refuses bf16 weights beside fp32 running statistics); evaluation runs
    through the sharded model."""
    rec = launch(tmp_path / "bf16", variant="fsdp", workload="resnet18-cifar10", precision="bf16",
                 synthetic_size=16, synthetic_test_size=4, eval_samples=4, eval_each_epoch=True)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["accuracy"] and math.isfinite(rec["final_loss"])
    gathered = by_name(rec["collectives"])["all_gather"]["bytes"]
    reduced = by_name(rec["collectives"])["reduce_scatter"]["bytes"]
    assert gathered < 1.2 * reduced   # gathered twice in bf16 (~2 x P/2), reduced once in fp32 (P)


@pytest.mark.slow
def test_the_one_gpu_sharding_bench_runs_its_tiny_cells_on_the_cpu(tmp_path):
    import subprocess
    import sys
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "device", "sharding_bench.py")
    done = subprocess.run([sys.executable, bench, "--tiny", "--cells", "lm", "--variants", "single,fsdp",
                           "--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "out" / "sharding_bench.json").read_text())
    assert [(r["variant"], r["status"]) for r in rows] == [("single", "ok"), ("fsdp", "ok"), ("fsdp-bf16", "ok")]
    single, fsdp = rows[0], rows[1]
    assert fsdp["ratio_to_single"] > 0 and fsdp["largest_unit_mib"] > 0
    assert rows[2]["ratio_to_single"] is None   # bf16 against fp32 single would be a precision change
    assert fsdp["parameters_mib"] == single["parameters_mib"] > 0   # one rank holds every shard
    assert (tmp_path / "out" / "runs.tar.gz").is_file()
