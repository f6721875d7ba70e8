"""advise.check with a stand-in launcher: the run configs it asks for (the advised card's cap on
CUDA, rehearsed ranks where fewer GPUs are visible, a batch the shared GPU holds) and its
predicted-against-measured rows (NVML and speed only where each rank has its GPU)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dpbench.advise import check as C
from dpbench.advise.predict import ProbeFacts, Setup, predict
from dpbench.advise.recommend import advise

P = 100_000_000


def facts() -> ProbeFacts:
    return ProbeFacts(workload="w", parameters=P, param_bytes=4.0, largest_unit_bytes=4.0 * P / 10, batches=(2, 8),
                      activation_mib=(300.0, 1200.0), fixed_mib=50.0, step_extra_mib=381.0,
                      reserved_extra_mib=200.0, context_mib=500.0, step_s=(0.02, 0.05), device="cuda")


def fake_run(seen: list, f: ProbeFacts):
    def run(cfg: dict) -> dict:
        seen.append(cfg)
        setup = Setup(cfg["variant"], cfg.get("reshard_after_forward", True))
        p = predict(f, setup, cfg["gpus"], cfg["per_gpu_batch"])
        mem = [{"device": d, "allocated_mib": 1.05 * p.allocated_mib, "reserved_mib": 0.95 * p.reserved_mib,
                "nvml_used_mib": p.nvml_mib} for d in range(cfg["gpus"])]
        return {"status": "ok", "memory": mem, "memory_components": [], "throughput": {"samples_per_s": 1000.0}}
    return run


@pytest.mark.parametrize("visible", [1, 2])
def test_the_check_caps_at_the_advised_card_and_rehearses_where_gpus_are_missing(monkeypatch, visible):
    f = facts()
    monkeypatch.setattr(C, "visible_gpus", lambda: (visible, 139 * 1024.0))
    a = advise(f, gpus=2, gpu_memory_gib=80)
    seen: list = []
    rows = C.check(a, "w", f, "fp32", run=fake_run(seen, f), runners_up=1)
    assert [c["variant"] for c in seen] == [C._setup_fields(r["options"])["variant"] for r in a.rows[:2]]
    rehearsed = visible < 2
    for cfg in seen:
        assert cfg.get("rehearse", False) is rehearsed and cfg["device"] == "cuda"
        share = 139 * 1024 * C.DEVICE_SHARE / (2 if rehearsed else 1)
        assert cfg["memory_cap_gib"] == pytest.approx((min(80 * 1024, share) - f.context_mib) / 1024, abs=1e-3)
        if rehearsed:   # two ranks on one GPU: their predicted NVML memory fits it together
            setup = Setup(cfg["variant"], cfg.get("reshard_after_forward", True))
            assert 2 * predict(f, setup, 2, cfg["per_gpu_batch"]).nvml_mib <= share * 2
    by = {(r["setup"], r["what"]): r for r in rows}
    top = a.rows[0]["setup"]
    assert by[(top, "allocated")]["error"] == pytest.approx(0.05)
    assert by[(top, "reserved")]["error"] == pytest.approx(-0.05)
    assert ((top, "nvml") in by) is not rehearsed
    assert ((top, "samples_per_s") in by) is not rehearsed


def test_a_run_that_fails_is_a_row_with_its_reason(monkeypatch):
    f = facts()
    monkeypatch.setattr(C, "visible_gpus", lambda: (2, 139 * 1024.0))
    a = advise(f, gpus=2, gpu_memory_gib=80)
    rows = C.check(a, "w", f, "fp32", run=lambda cfg: {"status": "failed", "reason": "CUDA out of memory"},
                   runners_up=0)
    assert rows[0]["what"] == "run" and rows[0]["status"] == "failed" and rows[0]["reason"] == "CUDA out of memory"
    # out of memory one bisection step below too: the largest batch was not within that step
    assert [(r["what"], r["measured"]) for r in rows[1:]] == [("largest_batch", None)]


def test_an_advised_batch_out_of_memory_is_tried_one_bisection_step_below(monkeypatch):
    f = facts()
    monkeypatch.setattr(C, "visible_gpus", lambda: (2, 139 * 1024.0))
    a = advise(f, gpus=2, gpu_memory_gib=80)
    advised = C.chosen_setups(a, 0)[0]["batch"]
    seen: list = []
    ok = fake_run([], f)

    def run(cfg):
        seen.append(cfg["per_gpu_batch"])
        if cfg["per_gpu_batch"] >= advised:
            return {"status": "failed", "reason": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"}
        return ok(cfg)

    rows = C.check(a, "w", f, "fp32", run=run, runners_up=0)
    below = int(advised * (1 - C.BISECTION_STEP))
    assert seen == [advised, below]
    largest = next(r for r in rows if r["what"] == "largest_batch")
    assert (largest["predicted"], largest["measured"]) == (advised, below)
    assert largest["error"] == pytest.approx(below / advised - 1)
    # the memory rows compare at the batch that ran
    assert {r["batch"] for r in rows if r["what"] in ("allocated", "reserved")} == {below}


def test_a_failure_other_than_memory_is_not_retried(monkeypatch):
    f = facts()
    monkeypatch.setattr(C, "visible_gpus", lambda: (2, 139 * 1024.0))
    a = advise(f, gpus=2, gpu_memory_gib=80)
    seen: list = []
    rows = C.check(a, "w", f, "fp32", run=lambda cfg: seen.append(cfg) or {"status": "failed", "reason": "timeout"},
                   runners_up=0)
    assert len(seen) == 1 and [r["what"] for r in rows] == ["run"]


@pytest.mark.parametrize("visible", [1, 2])
def test_the_cap_leaves_nccls_memory_out_only_where_the_ranks_have_an_nccl_group(monkeypatch, visible):
    f = replace(facts(), process_group_mib=600.0)
    share = 139 * 1024 * C.DEVICE_SHARE / (1 if visible == 2 else 2)
    outside = f.context_mib + (600.0 if visible == 2 else 0.0)    # rehearsed ranks: gloo
    setup = Setup("ddp")
    assert C.cap_gib(f, setup, 80, 2 // visible, 139 * 1024.0) == pytest.approx((min(80 * 1024, share) - outside) / 1024)


def test_the_ranking_judges_the_advised_setup_against_the_fastest_measured():
    def rate(setup, measured):
        return {"setup": setup, "what": "samples_per_s", "measured": measured}
    first = {"setup": "ddp", "what": "run", "measured": None}
    got = C.ranking([first, rate("ddp", 96.0), rate("fsdp", 100.0)])
    assert (got["advised"], got["best"], round(got["share_of_best"], 2), got["within"]) == ("ddp", "fsdp", 0.96, True)
    assert C.ranking([rate("ddp", 94.0), rate("fsdp", 100.0)])["within"] is False
    assert C.ranking([first, rate("fsdp", 100.0), rate("zero1", 90.0)])["within"] is False   # the advised did not run
    assert C.ranking([rate("ddp", 94.0)]) is None   # one timed setup: nothing to rank against
