"""dpbench.analysis.compare.calibration on the committed references: the rules' error rates measured on
real launches, and docs/compare.md quoting the frozen measurement it made."""
import json
from pathlib import Path

import numpy as np

from dpbench.analysis.compare import calibration as cal

ROOT = Path(__file__).resolve().parents[3]


def test_curve_test_between_real_launches_holds_its_rate_and_finds_a_shift():
    """Every pair of the seven one-H200 launches of the default experiment, same seeds a side."""
    summ, seeds = cal.seeded_summaries(cal.DESIGNS[cal.SEEDED_DESIGN])
    assert seeds == [0, 1, 2]
    at2, at3 = cal.between_launch_curve_rates(summ, 2), cal.between_launch_curve_rates(summ, 3)
    assert (at2["comparisons"], at3["comparisons"]) == (21 * 3, 21)
    for r in (at2, at3):
        assert r["fa_comparison"] <= cal.ALPHA
        assert r["power_4sd"] > 3 * cal.ALPHA
    assert at3["power_4sd"] > at2["power_4sd"]
    assert cal.between_launch_curve_rates(summ, 4) is None  # three seeds: 4 a side cannot be drawn


def test_unpaired_curve_test_on_resampled_real_curves():
    pools = cal.fast_pools(cal.DESIGNS["1x H200"])
    r = cal.curve_rates(pools, 3, 300, np.random.default_rng(0))
    # 300 draws: a true 5% lands under 9% with 99.9% probability.
    assert r["fa_comparison"] < 0.09
    assert r["power_4sd"] > 0.4 and r["power_4sd"] > r["power_3sd"]


def test_paired_throughput_on_real_paired_launches():
    df = cal.paired_launch_samples(cal.PAIRED_LAUNCHES)
    assert set(df["environment"]) == set(cal.AA_ENVIRONMENTS)
    residuals = cal.launch_residuals(df)
    assert sorted(len(r) for r in residuals.values()) == [6, 12, 12]
    r = cal.paired_rates(residuals, df["cell"].nunique(), 3, 300, np.random.default_rng(0))
    assert r["fa_comparison"] < 0.09
    assert r["power_one_cell"] >= 0.8 and r["power_every_cell"] >= 0.8
    assert r["detectable_cell"] < 0.01  # a 1% slowdown of a cell is within reach at 3 a side
    assert cal.paired_rates(residuals, 2, 7, 10, np.random.default_rng(0)) is None  # 14 > any launch's runs


def test_docs_quote_the_frozen_calibration():
    frozen = json.loads((ROOT / "docs" / "compare_calibration.json").read_text())
    doc = (ROOT / "docs" / "compare.md").read_text()
    missing = [line for line in frozen["markdown"].splitlines() if line.startswith("|") and line not in doc]
    assert not missing, f"docs/compare.md lacks {len(missing)} rows of the frozen calibration, e.g. {missing[0]}"
