"""The within-launch throughput test (dpbench.analysis.compare.paired) on constructed launches."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpbench.analysis.compare.paired import paired_throughput

CELLS = {"single-g1": 10_000.0, "ddp-g1": 9_500.0, "dp-g1": 8_000.0, "dp_sum-g1": 8_100.0}
ABBA = ["base", "cand", "cand", "base", "base", "cand"]


def launch(slow: dict[str, float] | None = None, sd: float = 0.001, n: int = 3, seed: int = 0) -> pd.DataFrame:
    """n runs a side per cell, interleaved ABBAAB, log-normal noise of sd; slow: cell -> planted change."""
    rng = np.random.default_rng(seed)
    order = (ABBA * n)[: 2 * n]
    rows = []
    for i, (cell, ips) in enumerate(CELLS.items()):
        for j, env in enumerate(order):
            factor = 1 + (slow or {}).get(cell, 0.0) if env == "cand" else 1.0
            rows.append({"cell": cell, "environment": env, "order": 2 * n * i + j,
                         "samples_per_s": ips * factor * math.exp(rng.normal(0, sd))})
    return pd.DataFrame(rows)


def test_no_change_is_called_no_change():
    v = paired_throughput(launch(), "base", "cand")
    assert [c.verdict for c in v.cells] == ["no change"] * 4
    assert all(c.n_base == c.n_cand == 3 and c.p_holm >= 0.05 for c in v.cells)
    assert v.launch.verdict == "no change" and v.launch.cells == 4 and abs(v.launch.change) < 0.002
    assert "ABBAAB" in v.design


def test_a_one_percent_slowdown_of_one_cell_is_found_and_only_there():
    v = paired_throughput(launch({"ddp-g1": -0.01}), "base", "cand")
    by = {c.cell: c for c in v.cells}
    assert by["ddp-g1"].verdict == "slower" and by["ddp-g1"].change == pytest.approx(-0.01, abs=0.002)
    assert {c.verdict for k, c in by.items() if k != "ddp-g1"} == {"no change"}
    # 0.1% noise, 3 a side: a cell resolves well under 1%
    assert all(0 < c.smallest_detectable < 0.01 for c in v.cells)


def test_a_one_percent_slowdown_of_every_cell_moves_the_launch():
    v = paired_throughput(launch({c: -0.01 for c in CELLS}), "base", "cand")
    assert {c.verdict for c in v.cells} == {"slower"}
    assert v.launch.verdict == "slower" and v.launch.change == pytest.approx(-0.01, abs=0.001)
    assert v.launch.p < 1e-6 and 0 < v.launch.smallest_detectable < min(c.smallest_detectable for c in v.cells)
    assert v.launch.df == pytest.approx(16, rel=0.3)  # four cells of 4 df each


def test_change_is_the_ratio_of_geometric_means():
    df = pd.DataFrame({"cell": "c", "environment": ["base", "base", "cand", "cand"], "order": range(4),
                       "samples_per_s": [100.0, 400.0, 150.0, 150.0]})
    assert paired_throughput(df, "base", "cand").cells[0].change == pytest.approx(150 / 200 - 1)


def test_one_run_a_side_is_noise_unknown():
    v = paired_throughput(launch({"ddp-g1": -0.05}, n=1), "base", "cand")
    assert {c.verdict for c in v.cells} == {"noise unknown"}
    assert all(c.p_holm is None and c.smallest_detectable is None for c in v.cells)
    assert v.launch.verdict == "noise unknown" and v.launch.change is None


def test_identical_repeats_give_a_defined_answer():
    df = pd.DataFrame({"cell": "c", "environment": ["base", "base", "cand", "cand"], "order": range(4),
                       "samples_per_s": [100.0, 100.0, 100.0, 100.0]})
    assert (paired_throughput(df, "base", "cand").cells[0].p_holm,
            paired_throughput(df, "base", "cand").cells[0].verdict) == (1.0, "no change")
    df.loc[df.environment == "cand", "samples_per_s"] = 99.0
    assert paired_throughput(df, "base", "cand").cells[0].verdict == "slower"
