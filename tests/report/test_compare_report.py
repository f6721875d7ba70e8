"""The paired throughput table shows the centres the test's change is made of (geometric
means), so its change never disagrees in sign with the numbers beside it."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

from dpbench.analysis.compare import one_launch
from dpbench.analysis.compare.thresholds import Thresholds
from dpbench.report import compare_report

REPO = Path(__file__).resolve().parents[2]


def test_the_shown_centres_make_the_change_the_test_judges():
    # medians 26.45 -> 26.81 (up), geometric means down: the median picture disagrees in sign
    base = [24.0, 26.45, 40.0]
    cand = [26.0, 26.81, 26.9]
    frame = pd.DataFrame({"cell": [("single", 1, "")] * 6, "environment": ["base"] * 3 + ["cand"] * 3,
                          "samples_per_s": base + cand, "order": [0, 3, 4, 1, 2, 5]})
    rows, _ = one_launch.paired_throughput_rows(frame, "base", "cand", Thresholds())
    (row,) = rows
    assert row["median_candidate"] > row["median_baseline"] and row["change"] < 0
    assert math.isclose(row["geomean_candidate"] / row["geomean_baseline"] - 1, row["change"], rel_tol=1e-9)


def test_a_paired_reports_table_shows_the_geometric_means(tmp_path):
    tag = "cpu-paired-213-vs-2141-43b8177"
    shutil.copytree(REPO / "results" / "reference" / tag, tmp_path / tag,
                    ignore=shutil.ignore_patterns("figures", "logs"))
    report = one_launch.compare_paired(tmp_path, tag, None, None, Thresholds())
    md = compare_report.render_markdown(report)
    assert "geometric mean over repeats" in md
    for r in report["throughput"]:
        shown = r["geomean_candidate"] / r["geomean_baseline"] - 1
        assert math.isclose(shown, r["change"], rel_tol=1e-6, abs_tol=1e-12)
