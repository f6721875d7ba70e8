"""C9: the largest-batch search on fake trials, the verdict on fixture rows (crossover found, not
found, fewer than two GPUs), and the ledger's words from that data."""
from pathlib import Path

import pytest

from dpbench import results
from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE
from dpbench.claims.c9 import bench, predicted, probe, text, verdict
from dpbench.claims.records import ProbeRecord, obs

OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


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
    assert ran == [] and row["largest_batch"] is None and "needs 1 CUDA GPU (found 0)" in row["reason"]
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


def row(variant, gpus, parameters, batch, speed, reshard=None, precision="fp32", cap=12.0):
    return {"workload": f"transformer-lm-{parameters}", "parameters": parameters, "variant": variant,
            "reshard_after_forward": variant == "fsdp" if reshard is None else reshard, "gpus": gpus,
            "precision": precision, "largest_batch": batch, "samples_per_s_at_largest": speed,
            "cap_gib": cap, "reason": "" if batch else OOM}


# Along 12M .. 1.07B on 2 GPUs: FSDP2's batch first exceeds DDP's at 235M, its throughput at 1.07B
# (where DDP fits no batch at all); on 1 GPU each variant's own cost.
SIZES = [12_000_000, 42_000_000, 235_000_000, 1_070_000_000]
CROSSING = ([row("ddp", 2, p, b, s) for p, b, s in zip(SIZES, [512, 256, 48, None], [900.0, 400.0, 60.0, None])]
            + [row("fsdp", 2, p, b, s) for p, b, s in zip(SIZES, [480, 256, 64, 16], [500.0, 250.0, 40.0, 9.0])]
            + [row(v, 1, SIZES[0], 500, 880.0) for v in ("ddp", "fsdp")])


def probe_record(rows, gpus=2, interconnect="NV18"):
    ran_on = {"device_type": "cuda", "gpus_visible": gpus, "torch": "2.14.1", "cuda": "13.0", "cudnn": 91900,
              "gpu_names": ["NVIDIA H200"] * gpus, "python": "3.12.3"}
    observations = [obs(verdict.CONDITIONS_ID, "where", interconnect=interconnect)]
    observations += [obs(verdict.row_id(r), "a row", **r) for r in rows]
    return ProbeRecord("C9", "C9", ran_on, observations, verdict.verdict_from(rows).verdict, "")


def test_crossover_found_names_the_smallest_size_for_batch_and_throughput():
    v = verdict.verdict_from(CROSSING)
    assert v.verdict == CONFIRMED and v.predicted is None
    first = {c.quantity: c.first_exceeds for c in v.crossovers}
    assert first == {"largest_batch": 235_000_000, "samples_per_s_at_largest": 1_070_000_000}
    batch = next(c for c in v.crossovers if c.quantity == "largest_batch")
    assert batch.gpus == 2 and batch.baseline == [512, 256, 48, 0] and batch.sharded == [480, 256, 64, 16]
    assert [r["gpus"] for r in v.one_rank] == [1, 1]


def test_crossover_not_found_within_the_sweep():
    rows = [r for r in CROSSING if r["parameters"] < 200e6]
    v = verdict.verdict_from(rows)
    assert v.verdict == NUANCE and all(c.first_exceeds is None for c in v.crossovers)
    assert "fsdp exceeded DDP in neither" in text.summary(v, "NV18") and "42M" in text.summary(v, "NV18")
    batch_only = [dict(r, samples_per_s_at_largest=1.0) if r["variant"] == "fsdp" else r
                  for r in CROSSING if r["parameters"] < 1e9]
    v = verdict.verdict_from(batch_only)   # more batch from 235M, never more speed
    assert v.verdict == NUANCE and {c.quantity: c.first_exceeds for c in v.crossovers}["largest_batch"] == 235_000_000


def test_fewer_than_two_gpus_is_the_memory_models_prediction_only():
    one = [r for r in CROSSING if r["gpus"] == 1] + [row("fsdp", 1, SIZES[-1], None, None)]
    v = verdict.verdict_from(one)
    assert v.verdict == NOT_RUN and v.crossovers == []
    pred = v.predicted[0]   # at the rows' own budget (12 GiB here), none assumed
    assert len(v.predicted) == 1 and pred["cap_gib"] == 12.0
    assert [s["parameters"] for s in pred["sizes"]] == [SIZES[0], SIZES[-1]]
    big = pred["sizes"][-1]
    # fp32, SGD with momentum: DDP 16 B/param (with its buckets), FSDP2 on 2 ranks 12/2 B/param
    assert big["ddp_state_gib"] == pytest.approx(16 * SIZES[-1] / 2**30)
    assert big["fsdp_state_gib"] == pytest.approx(6 * SIZES[-1] / 2**30)
    assert pred["ddp_limit"] == int(12 * 2**30 / 16) and pred["fsdp_limit"] == int(12 * 2**30 / 6)
    assert predicted.predicted_state_bytes("zero1", 1000, 4) == 4000 + 4000 + 4000 + 1000


class Ev:
    """The little of the ledger's Evidence that C9 reads."""

    def __init__(self, probe_rec):
        self.probes = {"C9": probe_rec} if probe_rec else {}

    def measured_on_probe(self, cid):
        return f"probe: {cid}"

    def gpus_found(self):
        return 0


def test_finding_words_come_from_the_rows():
    f = text.finding(Ev(probe_record(CROSSING)))
    assert f.verdict == CONFIRMED
    first = {c["quantity"]: c["first_exceeds"] for c in f.data["crossovers"]}
    assert first == {"largest_batch": 235_000_000, "samples_per_s_at_largest": 1_070_000_000}
    assert "235M" in f.summary and "1.07B" in f.summary and "12 GiB per rank" in f.summary
    assert len(f.data["rows"]) == len(CROSSING) and f.data["interconnect"] == "NV18"
    moved = [dict(r, largest_batch=8) if r["variant"] == "ddp" and r["gpus"] == 2 else r for r in CROSSING]
    assert "first exceeds DDP at 12M parameters" in text.finding(Ev(probe_record(moved))).summary


def test_finding_on_one_gpu_predicts_and_says_not_measured():
    f = text.finding(Ev(probe_record([r for r in CROSSING if r["gpus"] == 1], gpus=1)))
    assert f.verdict == NOT_RUN and "needs 2 GPUs (found 1)" in f.not_run
    assert "the crossover itself was not measured" in f.summary and "on one GPU: ddp on 1 GPU(s)" in f.summary
    none = text.finding(Ev(None))
    assert none.verdict == NOT_RUN and "no probe record claims/C9.json" in none.not_run
    # without rows: the named devices' budgets, never the probe's cap
    assert [p["budget"] for p in none.data["predicted"]] == list(predicted.BUDGETS)
    assert "22 GiB per rank (24GB)" in none.summary and "12 GiB" not in none.summary


def test_interconnect_reads_nvidia_smi_topo():
    topo = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV18\t0-47\nGPU1\tNV18\t X \t0-47\n"
    assert probe.interconnect(topo) == "NV18" and probe.interconnect(None).startswith("unknown")


def test_the_probe_says_not_measured_without_cuda(monkeypatch):
    monkeypatch.setattr(probe, "gpus_visible", lambda: 0)
    rec = probe.run()
    assert rec.verdict == NOT_RUN and rec.not_run.startswith("needs CUDA") and rec.observations == []


def test_the_bench_prints_the_ledgers_c9_section_from_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "cuda_devices", lambda: 1)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])   # experiments/claims.yaml
    one = [r for r in CROSSING if r["gpus"] == 1]
    section = bench.ledger_section(one, 12.0, tmp_path)
    assert section.startswith("## C9:") and "**Verdict: not measured here.**" in section
    assert "- The memory model predicts, on 2 GPUs" in section and "crossover itself was not measured" in section
    assert "ddp on 1 GPU(s), transformer-lm-12000000 (12M parameters), fp32: largest batch 500" in section
    table = results.ResultSet(tmp_path, "c9").claim_table("largest_batch")
    assert sorted(table["variant"]) == ["ddp", "fsdp"] and table["largest_batch"].tolist() == [500, 500]
