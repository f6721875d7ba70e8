"""The memory model's per-rank activation peak (memory_model.predicted_peaks: phase by phase
from the one-rank run) against what PyTorch's memory tracker counts on 1, 2 and 4 gloo ranks
(run.live_memory through claims.c9.rehearsal.run_case). A vocabulary-heavy tiny LM, as the
rehearsed transformers are: its loss dominates, so the backward's peak comes after zero_grad at
every N, the case the model predicts; where a one-rank backward peaks at its start instead (the
narrow-vocabulary TINY_LM), the model cannot see the later peak (tests/run/test_components_tracked)."""
from __future__ import annotations

import pytest
from sharded_ranks import rehearse_cases

from dpbench.analysis import rehearsal

ARGS = {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 4096}
CASES = [{"name": "fsdp", "variant": "fsdp", "args": ARGS, "batch": 8},
         {"name": "fsdp-keep", "variant": "fsdp", "args": ARGS, "batch": 8, "options": {"reshard_after_forward": False},
          "min_ranks": 2}]


pytestmark = pytest.mark.slow   # three launches of gloo ranks, ~20 s


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return [r for world in (1, 2, 4) for r in rehearse_cases(CASES, world).values()]


@pytest.fixture(scope="module")
def table(records) -> list[dict]:
    return rehearsal.memory_table(records)


def test_every_backward_peak_follows_zero_grad(records):
    """The backward's peak lies above the level the forward ended at, so after zero_grad."""
    rows = [m for r in records for m in r["memory_components"]]
    assert len(rows) == 1 + 2 * 2 + 2 * 4
    assert all(m["backward_peak_mib"] > m["forward_end_mib"] for m in rows)


@pytest.mark.parametrize("variant", ["fsdp", "fsdp-keep"])
def test_the_model_predicts_the_tracked_activation_peak_at_2_and_4_ranks(table, variant):
    rows = {m["gpus"]: m for m in table if m["variant"] == variant and m["component"] == "activation_peak"}
    assert set(rows) >= {2, 4}
    for n in (2, 4):
        assert rows[n]["relative_difference"] == pytest.approx(0.0, abs=0.01), (variant, n, rows[n])
    # the peak rises with N, as the gradients freed before the backward shrink: b·P·(1/2 - 1/4)
    if variant == "fsdp":
        assert rows[4]["measured_mib"] > rows[2]["measured_mib"]
