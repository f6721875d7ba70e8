"""dpbench.bench.workloads (tools/device/workload_bench.py) end to end on the CPU (--tiny): the bare loop, dpbench's single
and one-rank ddp through the launcher, and the fields of its JSON and markdown."""
from __future__ import annotations

import json
import math

import pytest

from dpbench.bench import workloads as bench


def test_run_config_is_a_valid_fixed_feed_run():
    from dpbench.plan.config import RunConfig
    workload, batch, channels_last = bench.CELLS["lm-125m"]
    cfg = bench.run_config(workload, batch, channels_last, "bf16", "ddp", 10, 30, "auto")
    rc = RunConfig.from_dict(cfg)
    assert (rc.feed, rc.max_steps, rc.warmup_steps, rc.global_batch) == ("fixed", 40, 10, 16)
    assert rc.synthetic_size >= rc.global_batch * rc.max_steps   # one epoch holds every step


def test_finish_computes_ratio_tokens_and_mfu():
    bare = {"samples_per_s": 100.0, "flops_per_sample": 1e12, "sample_unit": "tokens", "units_per_sample": 1024}
    row = bench.finish({"samples_per_s": 98.0, "sample_unit": "tokens"}, bare, "bf16", 16)
    assert row["ratio_to_bare"] == pytest.approx(0.98)
    assert row["tokens_per_s"] == pytest.approx(98.0 * 1024)
    assert row["mfu_vs_peak"] == pytest.approx(98e12 / 989e12)
    assert row["mfu_vs_matmul"] == pytest.approx(98e12 / 790e12)
    fp32 = bench.finish({"samples_per_s": 98.0, "sample_unit": "tokens"}, bare, "fp32", 16)
    assert fp32["mfu_vs_peak"] is None and fp32["tokens_per_s"] == pytest.approx(98.0 * 1024)


def test_unknown_cell_is_a_clear_error():
    with pytest.raises(SystemExit, match="lm-9b"):
        bench.main(["--out", "/tmp/unused", "--cells", "lm-9b"])


@pytest.mark.slow
def test_tiny_run_writes_every_row(tmp_path):
    assert bench.main(["--tiny", "--out", str(tmp_path), "--cells", "lm", "--precisions", "bf16"]) == 0
    doc = json.loads((tmp_path / "workload_bench.json").read_text())
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"bare", "single", "ddp"} and doc["meta"]["tiny"]
    for variant, row in rows.items():
        assert row["status"] == "ok", (variant, row["reason"])
        assert row["precision"] == "bf16" and row["global_batch"] == 4
        assert row["samples_per_s"] > 0 and row["timed_steps"] == 2
        assert row["parameters"] == rows["bare"]["parameters"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * 16)   # seq_len 16
        assert row["ratio_to_bare"] == pytest.approx(row["samples_per_s"] / rows["bare"]["samples_per_s"])
        assert math.isclose(row["mfu_vs_peak"], row["flops_per_sample"] * row["samples_per_s"] / 989e12)
    assert rows["bare"]["ratio_to_bare"] == 1.0
    assert (tmp_path / "runs" / "lm-bf16-ddp" / "metrics.json").is_file()
    table = (tmp_path / "workload_bench.md").read_text()
    assert table.count("| lm |") == 3 and "MFU (989T)" in table


def test_fixed_workload_feed_keeps_one_batch_resident():
    """feed: fixed is the bare loop's ceiling: one batch on the device, served every step (it
    drew and kept a copy per step, so the run's peak memory held every step's batch)."""
    import torch

    from dpbench.run.data import WorkloadFeed

    def make(generator, n):
        return torch.randn(n, 3, generator=generator), torch.randint(0, 2, (n,), generator=generator)

    feed = WorkloadFeed(make, samples=40, batch=8, seed=1, device=torch.device("cpu"), total=4, fixed=True)
    steps = list(feed.epoch(0))
    assert len(steps) == 4 and all(s[0] is steps[0][0] for s in steps)
    assert feed.resident_bytes == steps[0][0].nbytes + steps[0][1].nbytes
    assert torch.equal(steps[0][0], feed.global_batch(0, 8)[0]) and steps[0][2] == 8
    assert list(feed.epoch(1)) == []   # total reached in epoch 0
