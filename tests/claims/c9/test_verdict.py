"""C9's verdict on fixture rows: crossover found, not found, fewer than two GPUs."""

import pytest

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE
from dpbench.claims.c9 import predicted, text, verdict

from claims.planted import CROSSING, SIZES, row


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
