"""C9's probe: the largest-batch search on fake trials, the sweep, the interconnect."""

import re

import pytest

from dpbench import results
from dpbench.claims import NOT_RUN
from dpbench.claims.c9 import probe

from claims.planted import OOM


def fake_trial(limit, failure=None, calls=None):
    """A trial record: ok up to `limit`, out of memory above it; `failure` = (batch, reason) fails otherwise."""
    def trial(batch):
        (calls if calls is not None else []).append(batch)
        if failure and batch >= failure[0]:
            return {"status": "failed", "reason": failure[1]}
        return {"status": "ok", "reason": ""} if batch <= limit else {"status": "failed", "reason": OOM}
    return trial


@pytest.mark.parametrize("limit", [1, 7, 8, 100, 1000, 4095])
def test_search_doubles_then_bisects_to_its_resolution(limit):
    calls = []
    found = probe.search(fake_trial(limit, calls=calls), start=8, resolution=1 / 16)
    assert found["largest"] <= limit and found["reason"] == ""
    assert limit - found["largest"] <= max(1, int(found["largest"] / 16))
    doubled = [8 * 2**i for i in range(len(calls)) if 8 * 2**i <= limit]   # every fit while doubling
    assert calls[: len(doubled) + 1] == doubled + [doubled[-1] * 2 if doubled else 8]
    assert found["trials"] == calls


def test_search_without_any_fit_says_so():
    found = probe.search(lambda b: {"status": "failed", "reason": OOM}, start=8)
    assert found["largest"] is None and "not even batch 1" in found["reason"]


def test_a_failure_other_than_out_of_memory_stops_the_search_with_its_reason():
    calls = []
    found = probe.search(fake_trial(1000, failure=(64, "RuntimeError: NCCL error"), calls=calls), start=8)
    assert found["largest"] is None and found["reason"] == "failed: RuntimeError: NCCL error"
    assert calls == [8, 16, 32, 64]   # nothing tried after it
    skipped = probe.search(lambda b: {"status": "skipped", "reason": "torch too old"}, start=8)
    assert skipped == {"largest": None, "reason": "skipped: torch too old", "trials": [8]}


def test_the_search_skips_without_cuda_and_runs_nothing():
    ran = []
    row = probe.search_row("fsdp", 1, (256, 4), 12.0, run=ran.append, cuda_gpus=0)
    assert ran == [] and row["largest_batch"] is None
    assert re.findall(r"\d+", row["reason"]) == ["1", "0"]   # GPUs needed, found
    assert row["parameters"] > 10e6 and row["reshard_after_forward"] is True
    assert set(row) == set(results.LARGEST_BATCH_COLUMNS)


def test_search_row_takes_the_throughput_from_a_timed_run_at_the_largest_batch():
    configs = []

    def run(cfg):
        configs.append(cfg)
        ok = cfg["per_gpu_batch"] <= 40
        return ({"status": "ok", "reason": "", "throughput": {"samples_per_s": 10.0 * cfg["max_steps"]}}
                if ok else {"status": "failed", "reason": OOM})
    row = probe.time_row(probe.search_row("ddp", 2, (256, 4), 8.0, run=run, cuda_gpus=2), (256, 4), run=run)
    assert row["largest_batch"] == 40 and row["samples_per_s_at_largest"] == 10.0 * probe.TIMED_STEPS
    assert all(c["memory_cap_gib"] == 8.0 and c["global_batch"] == 2 * c["per_gpu_batch"] for c in configs)
    assert configs[-1]["max_steps"] == probe.TIMED_STEPS and configs[-1]["per_gpu_batch"] == 40


def test_sweep_runs_searches_at_once_and_the_timed_runs_alone_after_them(monkeypatch):
    monkeypatch.setattr(probe, "cuda_devices", lambda: 2)
    seen = []

    def run(cfg):
        seen.append(cfg)
        fit = cfg["per_gpu_batch"] <= cfg["workload"]["args"]["width"] // 16
        return ({"status": "ok", "reason": "", "throughput": {"samples_per_s": 1.0}} if fit
                else {"status": "failed", "reason": OOM})
    rows = probe.sweep([(256, 4), (512, 8)], ("ddp", "fsdp"), None, 12.0, jobs=4, run=run)
    assert [(r["variant"], r["gpus"]) for r in rows] == [("ddp", 1), ("fsdp", 1)] * 2 + [("ddp", 2), ("fsdp", 2)] * 2
    assert [r["largest_batch"] for r in rows] == [16, 16, 32, 32] * 2
    timed = [i for i, c in enumerate(seen) if c["max_steps"] == probe.TIMED_STEPS]
    assert len(timed) == 8 and timed == list(range(len(seen) - 8, len(seen)))   # after every search


def test_interconnect_reads_nvidia_smi_topo():
    topo = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-47\nGPU1\tNV18\t X \t0-47\n"
    assert probe.interconnect(topo) == "NV18" and probe.interconnect(None).startswith("unknown")


def test_the_probe_says_not_measured_without_cuda(monkeypatch):
    monkeypatch.setattr(probe, "gpus_visible", lambda: 0)
    rec = probe.run()
    assert rec.verdict == NOT_RUN and rec.not_run.startswith("needs CUDA") and rec.observations == []
