"""Today's code on the small frozen result sets of tests/fixtures: collect, summary, compare.

Each fixture's runs are copies of a committed reference's runs (tests/fixtures/README.md), so
what today's code makes of them is checked by its data: each table holds what the reference's
table holds for those runs, and each comparison decides per cell what the committed report
decided. The words are checked by one snapshot per output kind (summary.md, a compare report),
rewritten on purpose with DPBENCH_UPDATE_SNAPSHOTS=1.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from fakes import empty_panels, is_placeholder, notes_over_data, outside_points, overlapping_texts
from verdicts import compare_verdicts, run_compare

from dpbench import results
from dpbench.report import plots, summarize
from dpbench.report.figstyle import save, style

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
H200 = "h200-torch-2.11.0+cu130"                                          # fixture "gpu"
# fixture "cpu": two torch versions on one CPU host, and the A/A launches of the first
CPU_BASE, CPU_CAND = "cpu_check-aa1-torch-2.13.0+cpu", "cpu_check-aa1-torch-2.14.1+cu130"
CPU_AA = [CPU_BASE, "cpu_check-aa2-torch-2.13.0+cpu", "cpu_check-aa3-torch-2.13.0+cpu"]
# fixture "compare": two launches on one H200 and the A/A launches their report learnt noise from
PAIR = ("h200-torch-2.11.0+cu130", "h200-2951eab-torch-2.11.0+cu130")
AA = ["h200-torch-2.11.0+cu130", "h200-aa2-torch-2.11.0+cu130", "h200-67dd99a-torch-2.11.0+cu130"]

# What identifies a row of each table; the medians table has one row per cell and quantity.
RUN_KEY = ["run_id"]
KEYS = {"summary": RUN_KEY, "memory": RUN_KEY + ["device"], "accuracy": RUN_KEY + ["epoch"],
        "steps": RUN_KEY + ["step"], "warnings": RUN_KEY + ["rank", "category", "message"],
        "medians": ["options", "setup", "variant", "gpus", "quantity"]}
SETS = [("gpu", H200), ("cpu", CPU_BASE), ("cpu", CPU_CAND)]


def _sorted(df: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    return df.sort_values(key, kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("table", list(results.TABLES))
@pytest.mark.parametrize("fixture,tag", SETS, ids=[t for _, t in SETS])
def test_each_table_holds_what_the_reference_holds_for_its_runs(fixture_results, fixture, tag, table):
    if not results.table_path(REFERENCE, tag, table).is_file():
        pytest.skip(f"the reference has no {table}.csv to hold against")
    root = fixture_results(fixture)
    made = results.read_table(root, tag, table)
    kept = results.read_table(REFERENCE, tag, table)
    key = KEYS[table]
    if key == KEYS["medians"]:   # the fixtures hold every repeat of their cells: the same medians
        assert not made.empty
        # quantities added since the reference was made (the throughput in the workload's unit)
        # are checked against their own source below; the reference's hold what they held
        made = made[made["quantity"].isin(set(kept["quantity"]))]
        kept = kept.merge(made[key], on=key)
    else:
        kept = kept[kept["run_id"].isin([p.name for p in results.runs_dir(root, tag).iterdir()])]
    missing = [c for c in kept.columns if c not in made.columns]
    assert not missing, f"{table}.csv lost columns {missing}"
    assert len(made) == len(kept), f"{table}.csv: {len(made)} rows made, the reference has {len(kept)}"
    pd.testing.assert_frame_equal(_sorted(made[list(kept.columns)], key), _sorted(kept, key),
                                  check_dtype=False, rtol=1e-12)


@pytest.mark.parametrize("fixture,tag", SETS, ids=[t for _, t in SETS])
def test_provenance_names_what_the_reference_names(fixture_results, fixture, tag):
    made = results.read_json(results.provenance_path(fixture_results(fixture), tag))
    kept = results.read_json(results.provenance_path(REFERENCE, tag))
    assert made.pop("n_runs") == len(list(results.runs_dir(fixture_results(fixture), tag).iterdir()))
    kept.pop("n_runs")
    assert made.keys() == kept.keys()
    # A key the reference's runs disagree on is a list of their values: the fixture's runs take
    # some of them (the gpu fixture has no deterministic run).
    differ = {k: (made[k], v) for k, v in kept.items()
              if made[k] != v and not (isinstance(v, list) and _values(made[k]) <= _values(v))}
    assert not differ


def _values(v) -> set[str]:
    return {str(x) for x in (v if isinstance(v, list) else [v])}


def test_the_gpu_set_summary_is_its_snapshot(fixture_results, snapshot):
    root = fixture_results("gpu")
    snapshot("summary.md", summarize.render_summary(root, H200))
    summary = results.read_table(root, H200, "summary")
    assert summary.groupby("status").size().to_dict() == {"ok": 9, "skipped": 1}
    assert "needs 2 GPUs, 1 visible" in summary.loc[summary["status"] == "skipped", "reason"].item()


def test_a_cpu_comparison_decides_per_cell_what_its_committed_report_decided(fixture_results, tmp_path):
    kept = results.read_json(REFERENCE / results.COMPARE_DIR / f"{CPU_BASE}_vs_{CPU_CAND}.json")
    assert kept["noise"]["launches"] == CPU_AA
    code, made, _ = run_compare(tmp_path, fixture_results("cpu"), CPU_BASE, CPU_CAND, noise_from=CPU_AA,
                                thresholds=kept["thresholds"], report_format=kept.get("format", 1))
    assert compare_verdicts(made) == compare_verdicts(kept)
    assert code == 0 and made["verdict"]["counts"] == {"regressions": 0, "findings": 3, "new-warnings": 0,
                                                       "diverged-curves": 0}
    # a shared CPU host's launches spread wider than any change worth naming
    assert {r["verdict"] for r in made["throughput"]} == {"too noisy to tell"}
    assert {(r["mode"], r["verdict"]) for r in made["loss"]} == {("envelope", "identical")}


@pytest.mark.parametrize("fail_on,code", [("regressions", 0), ("findings", 1)])
def test_a_finding_fails_a_comparison_only_when_asked_to(fixture_results, tmp_path, fail_on, code):
    assert run_compare(tmp_path, fixture_results("cpu"), CPU_BASE, CPU_CAND, noise_from=CPU_AA,
                       fail_on=[fail_on], thresholds={"threshold": 0.02})[0] == code


def test_a_gpu_comparison_with_launch_noise_decides_as_its_committed_report(fixture_results, tmp_path, snapshot):
    kept = results.read_json(REFERENCE / results.COMPARE_DIR / f"{PAIR[0]}_vs_{PAIR[1]}.json")
    assert kept["noise"]["launches"] == AA
    code, made, md = run_compare(tmp_path, fixture_results("compare"), *PAIR, noise_from=AA,
                                 fail_on=kept["fail_on"], thresholds=kept["thresholds"],
                                 report_format=kept.get("format", 1))
    assert code == 0 and made["verdict"]["counts"] == kept["verdict"]["counts"]
    cells = {(r["variant"], r["gpus"], r["options"]) for r in made["throughput"]}
    assert cells == {("single", 1, ""), ("ddp", 1, "deterministic=True")}
    mine, theirs = compare_verdicts(made), compare_verdicts(kept)
    for aspect in ("throughput", "memory", "loss", "accuracy"):   # the committed report has many more cells
        assert set(mine[aspect]) <= set(theirs[aspect]), aspect
    loss = {r["variant"]: (r["mode"], r["verdict"]) for r in made["loss"]}
    assert loss == {"ddp": ("exact", "identical"), "single": ("envelope", "within noise")}
    noise = made["noise"]
    assert (noise["launches"], noise["cells"], noise["df_cell"], noise["shift_beyond"]) == (AA, 2, 2, False)
    snapshot("compare.md", md.read_text())


@pytest.mark.slow   # a few seconds a set on 2 cores
@pytest.mark.parametrize("fixture,tag", SETS[:2], ids=[t for _, t in SETS[:2]])
def test_figures_drawn_from_a_fixture_read_right(fixture_results, tmp_path, fixture, tag):
    tables = plots.load_tables(fixture_results(fixture), tag)
    problems = {}
    for figure, draw in plots.DRAW.items():
        with style():
            fig = draw(tables)
        save(fig, tmp_path / f"{figure}.png")   # drawn as the pipeline saves it
        found = outside_points(fig) + overlapping_texts(fig) + notes_over_data(fig) + \
            ([] if is_placeholder(fig) else empty_panels(fig))
        if found:
            problems[figure] = found[:5]
    assert not problems, f"{tag}: {problems}"


def test_the_throughput_in_the_workloads_unit_is_images_per_s_for_images(fixture_results):
    root = fixture_results("gpu")
    med = results.read_table(root, H200, "medians")
    rate = med[med["quantity"] == "rate"].set_index(["options", "variant", "gpus"])["value"]
    images = med[med["quantity"] == "images_per_s"].set_index(["options", "variant", "gpus"])["value"]
    assert len(rate) == len(images) > 0
    pd.testing.assert_series_equal(rate.sort_index(), images.sort_index(), check_names=False)
