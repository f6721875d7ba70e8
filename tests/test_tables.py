"""The tidy-table layer: strong and weak efficiencies against hand-computed values, bootstrap
intervals, option sets in words, old records, and collect's handling of a damaged record."""
from __future__ import annotations

import math

import pytest
from fakes import fake_result_set, write_fake_run

from dpbench import results
from dpbench.analysis import collect
from dpbench.analysis.tables import (
    CONFIDENCE,
    NO_INTERVAL,
    cells,
    describe,
    interval_text,
    median_ci,
    range_coverage,
    ratio_ci,
    repeats_for,
    with_efficiency,
)

FP32 = {"global_batch": 512}
FP32_1K = {"global_batch": 1024}
BF16_1K = {"global_batch": 1024, "precision": "bf16", "channels_last": True}
BF16 = {"global_batch": 512, "precision": "bf16", "channels_last": True}

# single at 512: median 1000; single at 1024: median 1900; bf16 single at 512: median 3000.
SPEC = [
    dict(variant="single", options=FP32, images_per_s=[990.0, 1000.0, 1010.0]),
    dict(variant="single", options=FP32_1K, images_per_s=[1880.0, 1920.0]),
    dict(variant="ddp", gpus=2, options=FP32, images_per_s=[1700.0, 1800.0]),
    dict(variant="ddp", gpus=2, options=FP32_1K, images_per_s=[3500.0, 3700.0]),
    dict(variant="single", options=BF16, images_per_s=[3000.0]),
    dict(variant="ddp", gpus=2, options=BF16_1K, images_per_s=[5000.0, 5200.0]),
    dict(variant="single", per_gpu_batch=256, options={"per_gpu_batch": 256},
         images_per_s=[500.0, 520.0]),
    dict(variant="ddp", gpus=4, per_gpu_batch=256, options={"per_gpu_batch": 256},
         images_per_s=[1800.0, 1840.0]),
    dict(variant="ddp", gpus=4, options=FP32, repeat=0, status="skipped", images_per_s=None,
         reason="needs 4 GPUs, 2 visible"),
]


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    return fake_result_set(tmp_path_factory.mktemp("tables"), SPEC)


def cell(table, variant, gpus, options):
    rows = table[(table["variant"] == variant) & (table["gpus"] == gpus)
                 & (table["options"] == results.options_label(options))]
    assert len(rows) == 1, rows
    return rows.iloc[0]


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
    assert c["weak_reference"] == "single at global batch 512 (the per-GPU batch)"
    # bf16 + channels_last at 1024: no bf16 single at 1024 (no strong); weak against bf16 at 512,
    # never against fp32's single
    c = cell(med, "ddp", 2, BF16_1K)
    assert math.isnan(c["efficiency_strong"]) and c["strong_reference"] == ""
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


def test_intervals_contain_the_estimate_and_state_the_confidence_their_repeats_give(rs):
    # the range of n values holds the median with 1 - 2^(1-n): 50% for 2, 75% for 3, 94% for 5
    for values, level in (([990.0, 1000.0, 1010.0], 0.75), ([1.0, 2.0], 0.5), ([5.0, 1.0, 9.0, 3.0, 4.0], 0.9375)):
        est = median_ci(values)
        assert (est.low, est.high) == (min(values), max(values)) and est.low <= est.value <= est.high
        assert est.level == pytest.approx(level)
    # with enough repeats the interval narrows to inner order statistics and still reaches 95%
    est = median_ci(list(range(1, 21)))
    assert 1 < est.low < est.value < est.high < 20 and est.level >= CONFIDENCE
    assert (est.low, est.high) == (6, 15)   # k = 6: 1 - 2 P(Bin(20, 1/2) <= 5) = 0.959; k = 7 gives 0.885
    assert range_coverage(20, 6) == pytest.approx(0.9586, abs=1e-4)
    assert repeats_for(CONFIDENCE) == 6 and interval_text(est, "{:g}") == "95% CI 6–15"
    # a ratio spans low/high and high/low of the two ranges, at the product of their confidences
    ratio = ratio_ci([1700.0, 1800.0], [990.0, 1000.0, 1010.0], 2)
    assert ratio.value == pytest.approx(0.875)
    assert (ratio.low, ratio.high) == pytest.approx((1700 / 2020, 1800 / 1980))
    assert ratio.level == pytest.approx(0.5 * 0.75)
    assert ratio.at_least and interval_text(ratio, "{:.2f}") == "≥37% CI 0.84–0.91"   # a bound; 37.5% never rounds up
    med = cells(rs.table("summary"))
    for q in ("images_per_s", "efficiency_strong", "efficiency_weak"):
        has = med[f"{q}_ci_low"].notna()
        assert (med.loc[has, f"{q}_ci_low"] <= med.loc[has, q] + 1e-12).all()
        assert (med.loc[has, q] <= med.loc[has, f"{q}_ci_high"] + 1e-12).all()
        assert med.loc[has, f"{q}_ci_level"].between(0, 1).all()


def test_one_repeat_has_no_interval(rs):
    assert math.isnan(median_ci([3000.0]).low)
    assert math.isnan(ratio_ci([5000.0, 5200.0], [3000.0], 2).low)   # the baseline ran once
    assert interval_text(median_ci([3000.0]), "{:.0%}", 1) == NO_INTERVAL
    c = cell(cells(rs.table("summary")), "ddp", 2, BF16_1K)
    assert math.isnan(c["efficiency_weak_ci_low"]) and c["weak_reference_n"] == 1


def test_medians_csv_holds_values_intervals_and_references(rs):
    table = rs.table("medians")
    assert list(table.columns) == results.CELL_COLUMNS
    row = table[(table["quantity"] == "efficiency_weak") & (table["variant"] == "ddp")
                & (table["options"] == results.options_label(FP32_1K))].iloc[0]
    assert row["value"] == pytest.approx(1.8)
    assert row["reference"] == "single at global batch 512 (the per-GPU batch), n=3"
    assert row["ci_low"] <= row["value"] <= row["ci_high"] and 0 < row["ci_level"] < 1


def test_summary_csv_records_how_each_run_was_planned(rs):
    summary = rs.table("summary").set_index("run_id")
    weak = summary.loc["ddp-g4-per_gpu_batch256-r1"]
    assert (weak["scaling"], weak["per_gpu_batch"], weak["global_batch"], weak["seed"]) == \
        ("weak", 256, 1024, 1)
    strong = summary.loc["ddp-g2-global_batch512-r0"]
    assert (strong["scaling"], strong["per_gpu_batch"]) == ("strong", 256)
    assert not strong["deterministic"]
    # the batch fields do not make a different setup; precision and channels_last do
    assert summary.loc["single-g1-global_batch1024-r0", "setup"] == strong["setup"]
    assert summary.loc["single-g1-channels_lasttrue-global_batch512-precisionbf16-r0", "setup"] \
        != strong["setup"]


def test_records_from_before_scaling_read_as_strong(tmp_path):
    rs = fake_result_set(tmp_path, [
        dict(variant="single", images_per_s=[1000.0, 1010.0], legacy=True),
        dict(variant="ddp", gpus=2, images_per_s=[1800.0, 1820.0], legacy=True)])
    row = rs.table("summary").set_index("run_id").loc["ddp-g2-r0"]
    assert (row["scaling"], row["per_gpu_batch"], row["seed"]) == ("strong", 64, 0)
    c = cell(cells(rs.table("summary")), "ddp", 2, {})
    assert c["efficiency_strong"] == pytest.approx(1810 / (2 * 1005))


@pytest.mark.parametrize("options, kwargs, words", [
    ({"channels_last": True, "global_batch": 1024, "precision": "bf16"}, {}, "bf16 + channels_last, batch 1024"),
    ("channels_last=True,global_batch=1024,precision=bf16", {}, "bf16 + channels_last, batch 1024"),
    ({}, dict(precision="fp32", global_batch=512), "fp32, batch 512"),
    ({"per_gpu_batch": 256}, dict(precision="fp32", global_batch=1024, per_gpu_batch=256, scaling="weak"),
     "fp32, 256 per GPU"),
    ({"global_batch": 128, "batchnorm": "eval", "max_steps": 30}, {}, "BatchNorm eval, 30 steps, batch 128"),
    ({"cudnn_benchmark": True, "compile": "max-autotune"}, {}, "compile max-autotune, cudnn.benchmark on"),
    ({"static_graph": True}, {}, "static graph on"),
])
def test_option_sets_in_words(options, kwargs, words):
    assert describe(options, **kwargs) == words


def test_a_damaged_record_becomes_a_failed_row_and_the_rest_is_collected(tmp_path, capsys):
    runs = results.runs_dir(tmp_path, "t")
    write_fake_run(runs, variant="single", images_per_s=1000.0)
    bad = write_fake_run(runs, variant="ddp", gpus=2, images_per_s=1800.0) / results.METRICS
    bad.write_text('{"run_id": "ddp-g2-r0", "status": ')
    assert collect.main(["--results-dir", str(tmp_path), "--tag", "t", "--print"]) == 0
    summary = results.read_table(tmp_path, "t", "summary").set_index("run_id")
    assert summary.loc["single-g1-r0", "status"] == "ok"
    row = summary.loc["ddp-g2-r0"]
    assert (row["status"], row["variant"], row["gpus"]) == ("failed", "ddp", 2)
    assert str(bad) in row["reason"] and "--forcerun train" in row["reason"]
    assert "JSONDecodeError" in row["reason"]
    assert "Traceback" not in capsys.readouterr().err
