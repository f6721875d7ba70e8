"""advise.predict and advise.recommend on probe facts given by hand (torch-free): the memory
model's terms add up as its docstring says, the largest batch is the last that fits, and a
model too large for any setup says so and what would fit."""
from __future__ import annotations

import pytest

from dpbench.advise.predict import GIB, ProbeFacts, Setup, largest_batch, predict, setups
from dpbench.advise.check import _setup_fields
from dpbench.advise.recommend import HEADROOM, advise
from dpbench.analysis.memory_model import MIB, Setting, predicted_bytes

P = 100_000_000   # 100M parameters, fp32: 381 MiB a copy


def facts(**kw) -> ProbeFacts:
    base = dict(workload="w", parameters=P, param_bytes=4.0, largest_unit_bytes=4.0 * P / 10, batches=(2, 8),
                activation_mib=(300.0, 1200.0), checkpoint_activation_mib=(60.0, 240.0), fixed_mib=50.0,
                step_extra_mib=381.0, reserved_extra_mib=200.0, context_mib=500.0, step_s=(0.02, 0.05))
    return ProbeFacts(**{**base, **kw})


def test_the_terms_add_up_as_the_memory_model_says():
    f = facts()
    for setup in (Setup("ddp"), Setup("zero1"), Setup("fsdp"), Setup("fsdp", reshard_after_forward=False)):
        p = predict(f, setup, 4, 16)
        b = predicted_bytes(Setting(setup.variant, P, 4.0, 1, 4, reshard_after_forward=setup.reshard_after_forward,
                                    largest_unit_bytes=4.0 * P / 10))
        assert p.state_mib == pytest.approx(b["state"] / MIB)
        assert p.gathered_mib == pytest.approx(b["unsharded"] / MIB)
        assert p.activation_mib == pytest.approx(150.0 * 16)          # the probe's line: 150 MiB a sample
        assert p.allocated_mib == pytest.approx(p.state_mib + 50.0 + p.gathered_mib + p.activation_mib)
        assert p.reserved_mib == pytest.approx(p.allocated_mib + 200.0)
        assert p.nvml_mib == pytest.approx(p.reserved_mib + 500.0)
    ck = predict(f, Setup("ddp", checkpoint=True), 4, 16)
    assert ck.activation_mib == pytest.approx(30.0 * 16)              # the checkpointed line
    acc = predict(f, Setup("ddp", accumulate=4), 4, 16)
    assert acc.activation_mib == pytest.approx(150.0 * 4)             # one micro-batch's


@pytest.mark.parametrize("what", ["allocated", "reserved", "nvml"])
def test_the_largest_batch_is_the_last_that_fits(what):
    f, limit = facts(), 20 * 1024.0
    for setup in setups(True, 2):
        b = largest_batch(f, setup, 4, limit, what)
        assert b % setup.accumulate == 0
        attr = f"{what}_mib"
        assert getattr(predict(f, setup, 4, b), attr) <= limit
        assert getattr(predict(f, setup, 4, b + setup.accumulate), attr) > limit


def test_advice_recommends_the_fastest_setup_that_fits():
    a = advise(facts(), gpus=4, gpu_memory_gib=24)
    names = [r["setup"] for r in a.rows]
    assert {"ddp", "zero1", "fsdp", "fsdp-keep", "hsdp", "fsdp+offload"} <= set(names)
    assert a.chosen == a.rows[0]["setup"] and a.rows[0]["fits"]
    fitting = [r["samples_per_s"] for r in a.rows if r["fits"]]
    assert fitting[0] >= 0.99 * max(fitting)
    assert all(r["nvml_gib"] <= 24 for r in a.rows if r["fits"])


def test_a_wanted_batch_that_ddp_cannot_hold_brings_accumulation():
    a = advise(facts(), gpus=4, gpu_memory_gib=8, batch=64)
    rows = {r["setup"]: r for r in a.rows}
    assert not rows["ddp"]["fits"]
    acc = [r for r in a.rows if "accumulate" in r["setup"]]
    assert acc and any(r["fits"] for r in acc)


def test_a_model_too_large_for_any_setup_says_so_and_what_would_fit():
    big = facts(parameters=100_000_000_000, largest_unit_bytes=4.0 * 100e9 / 20)   # 100B, units of 20 GB
    a = advise(big, gpus=2, gpu_memory_gib=24)
    assert a.chosen is None and not any(r["fits"] for r in a.rows)
    m = a.misfit
    assert m["need_mib"] > 24 * GIB / MIB
    assert not m["offload_fits"] and not m["bf16_fits"]             # a unit gathered alone is 3 x 20 GB
    n, usable = m["gpus_needed"], 24 * 1024.0 * (1 - HEADROOM)     # what the advice plans to fill
    assert n > 2 and largest_batch(big, Setup("fsdp", checkpoint=True), n, usable, gpus_per_node=n) >= 1
    assert largest_batch(big, Setup("fsdp", checkpoint=True), n // 2, usable, gpus_per_node=n // 2) == 0
    smaller = facts(parameters=20_000_000_000, largest_unit_bytes=4.0 * 20e9 / 40)   # 20B, units of 2 GB
    a = advise(smaller, gpus=1, gpu_memory_gib=80)                  # 240 GB of state on one 80 GiB GPU
    assert a.chosen is not None and "offload" in a.chosen            # offload leaves the device the units
    assert not any(r["fits"] for r in a.rows if "offload" not in r["setup"])


def test_the_advised_batch_leaves_the_headroom_and_the_edge_is_reported():
    f = facts()
    a = advise(f, gpus=2, gpu_memory_gib=80)
    top = next(r for r in a.rows if r["setup"] == a.chosen)
    card = 80 * GIB / MIB
    setup = Setup(**_setup_fields(top["options"]))
    assert predict(f, setup, 2, top["batch"]).nvml_mib <= (1 - HEADROOM) * card
    assert predict(f, setup, 2, top["batch"] + 1).nvml_mib > (1 - HEADROOM) * card
    assert top["largest_batch"] == largest_batch(f, setup, 2, card) > top["batch"]
    edge = advise(f, gpus=2, gpu_memory_gib=80, headroom=0.0)
    assert next(r for r in edge.rows if r["setup"] == a.chosen)["batch"] == top["largest_batch"]


def test_nccls_memory_is_added_to_nvml_only_for_ranks_with_an_nccl_group():
    gpu, cpu = facts(device="cuda", process_group_mib=560.0), facts(device="cpu", process_group_mib=560.0)
    without = facts(device="cuda")
    for setup in (Setup("ddp"), Setup("zero1"), Setup("fsdp"), Setup("hsdp"), Setup("fsdp", offload=True)):
        base = predict(without, setup, 2, 16)
        ranks = predict(gpu, setup, 2, 16)
        assert ranks.nvml_mib == pytest.approx(base.nvml_mib + 560.0) and ranks.process_group_mib == 560.0
        assert (ranks.allocated_mib, ranks.reserved_mib) == (base.allocated_mib, base.reserved_mib)
        rehearsed = predict(gpu, setup, 2, 16, rehearsed=True)     # gloo on a shared GPU
        assert rehearsed.nvml_mib == pytest.approx(base.nvml_mib) and rehearsed.process_group_mib == 0.0
        assert predict(cpu, setup, 2, 16).nvml_mib == pytest.approx(predict(facts(device="cpu"), setup, 2, 16).nvml_mib)
        # the largest batch within NVML's limit moves by the same term; allocated's does not
        limit = 20 * 1024.0
        b = largest_batch(gpu, setup, 2, limit)
        assert predict(gpu, setup, 2, b).nvml_mib <= limit < predict(gpu, setup, 2, b + 1).nvml_mib
        assert largest_batch(gpu, setup, 2, limit, "allocated") == largest_batch(without, setup, 2, limit, "allocated")
        assert largest_batch(gpu, setup, 2, limit, rehearsed=True) == largest_batch(without, setup, 2, limit)
