"""The cell table: strong and weak efficiencies against hand-computed values, each quantity's
interval, and medians.csv in long form."""
from __future__ import annotations

import math

import pytest
from fakes import fake_result_set
from scaling_runs import SPEC, BF16_1K, FP32, FP32_1K, cell

from dpbench import results
from dpbench.analysis.cell_table import cells, with_efficiency


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    return fake_result_set(tmp_path_factory.mktemp("tables"), SPEC)


def test_strong_and_weak_efficiency_match_hand_computed_values(rs):
    med = cells(rs.table("summary"))
    # ddp on 2 GPUs at global 512 (256 per GPU): strong against single at 512; no single at 256.
    c = cell(med, "ddp", 2, FP32)
    assert c["efficiency_strong"] == pytest.approx(1750.0 / (2 * 1000.0))
    assert c["speedup_strong"] == pytest.approx(1750.0 / 1000.0)
    assert c["scaling"] == "strong" and c["per_gpu_batch"] == 256
    # per-GPU 256 is the weak group's single, with the same setup: weak is defined too
    assert c["efficiency_weak"] == pytest.approx(1750.0 / (2 * 510.0))
    # ddp on 2 GPUs at 1024 = 512 per GPU: strong against single at 1024, weak against 512
    c = cell(med, "ddp", 2, FP32_1K)
    assert c["efficiency_strong"] == pytest.approx(3600.0 / (2 * 1900.0))
    assert c["efficiency_weak"] == pytest.approx(3600.0 / (2 * 1000.0))
    assert c["weak_reference_n"] == 3
    # bf16 + channels_last at 1024: no bf16 single at 1024 (no strong); weak against bf16 at 512,
    # never against fp32's single
    c = cell(med, "ddp", 2, BF16_1K)
    assert math.isnan(c["efficiency_strong"]) and c["strong_reference_n"] == 0
    assert c["efficiency_weak"] == pytest.approx(5100.0 / (2 * 3000.0))
    # a weak run: 4 GPUs at 256 each against single at 256
    c = cell(med, "ddp", 4, {"per_gpu_batch": 256})
    assert c["scaling"] == "weak" and c["global_batch"] == 1024
    assert c["efficiency_weak"] == pytest.approx(1820.0 / (4 * 510.0))
    assert c["efficiency_strong"] == pytest.approx(1820.0 / (4 * 1900.0))


def test_each_run_gets_its_own_ratio_against_singles_median(rs):
    summary = rs.table("summary")
    eff = with_efficiency(summary[summary["status"] == "ok"]).set_index("run_id")
    assert eff.loc["ddp-g2-global_batch1024-r0", "efficiency_strong"] == pytest.approx(3500 / 3800)
    assert eff.loc["ddp-g2-global_batch1024-r1", "efficiency_weak"] == pytest.approx(3700 / 2000)


def test_every_interval_holds_its_cells_value(rs):
    med = cells(rs.table("summary"))
    for q in ("images_per_s", "efficiency_strong", "efficiency_weak"):
        has = med[f"{q}_ci_low"].notna()
        assert (med.loc[has, f"{q}_ci_low"] <= med.loc[has, q] + 1e-12).all()
        assert (med.loc[has, q] <= med.loc[has, f"{q}_ci_high"] + 1e-12).all()
        assert med.loc[has, f"{q}_ci_level"].between(0, 1).all()


def test_a_cell_whose_baseline_ran_once_has_no_interval(rs):
    c = cell(cells(rs.table("summary")), "ddp", 2, BF16_1K)
    assert math.isnan(c["efficiency_weak_ci_low"]) and c["weak_reference_n"] == 1


def test_medians_csv_holds_values_intervals_and_references(rs):
    table = rs.table("medians")
    assert list(table.columns) == results.CELL_COLUMNS
    row = table[(table["quantity"] == "efficiency_weak") & (table["variant"] == "ddp")
                & (table["options"] == results.options_label(FP32_1K))].iloc[0]
    assert row["value"] == pytest.approx(1.8)
    assert row["reference"].endswith("n=3")   # the reference's words: the fixtures' medians.csv pins them
    assert row["ci_low"] <= row["value"] <= row["ci_high"] and 0 < row["ci_level"] < 1
