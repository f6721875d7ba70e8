"""dpbench.analysis.compare (and its command line and markdown) on synthetic result sets laid out exactly as collect writes them.

Nothing here trains: result sets are written with results' own writers and columns, and the
noise rules are also checked on simulated data (A/A throughput cells, A/A loss curves)."""
from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fakes import BASE_IPS, N_STEPS, PAIR_DP_WARNING, PAIR_PROVENANCE, curve, make_runs, write_set

from dpbench import results as R
from dpbench import compare_cli
from dpbench.analysis import compare as cmp
from dpbench.report import compare_report

def find(runs: list[dict], variant: str, repeat: int | None = None) -> list[dict]:
    return [r for r in runs if r["variant"] == variant and repeat in (None, r["repeat"])]


def row(rows: list[dict], variant: str) -> dict:
    (match,) = [r for r in rows if r["variant"] == variant]
    return match


def argv(root, *extra: str) -> list[str]:
    return ["--results-dir", str(root), "--baseline", "A", "--candidate", "B", *extra]


@pytest.fixture
def pair(tmp_path):
    """Writes the baseline now; returns (root, candidate runs to edit, write-candidate fn)."""
    write_set(tmp_path, "A", make_runs())
    runs = make_runs()

    def finish(provenance: dict | None = None, **overrides) -> dict:
        write_set(tmp_path, "B", runs, provenance)
        return cmp.compare(tmp_path, "A", "B", **overrides)

    return tmp_path, runs, finish


@pytest.fixture
def det_pair(tmp_path):
    """Like `pair`, with every run deterministic and seeded by its repeat on both sides."""
    write_set(tmp_path, "A", make_runs(deterministic=True))
    runs = make_runs(deterministic=True)

    def finish(provenance: dict | None = None) -> dict:
        write_set(tmp_path, "B", runs, provenance)
        return cmp.compare(tmp_path, "A", "B")

    return tmp_path, runs, finish


# -- whole comparisons -------------------------------------------------------------------

def test_identical_sets_report_no_regression_and_exit_0(pair):
    root, _, finish = pair
    report = finish()
    assert report["verdict"]["line"] == "no regression beyond noise"
    assert report["verdict"]["counts"] == {"regressions": 0, "new-warnings": 0,
                                           "diverged-curves": 0, "findings": 0}
    assert {r["verdict"] for r in report["throughput"]} == {"no change"}
    assert {(r["mode"], r["verdict"]) for r in report["loss"]} == {("envelope", "identical")}
    assert report["provenance"]["differs"] == [] and report["provenance"]["config_differs"] == {}
    assert compare_cli.main(argv(root, "--fail-on-regression", "--fail-on", "new-warnings,diverged-curves")) == 0
    md, js = R.compare_paths(root, "A", "B")
    assert R.read_json(js) == {**report, "fail_on": ["regressions", "new-warnings", "diverged-curves"]}
    assert f"**Verdict: {report['verdict']['line']}**" in md.read_text()   # the words: compare.md snapshot


def test_planted_20pct_throughput_drop_is_a_regression_and_fails(pair):
    root, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.8
    report = finish()
    ddp = row(report["throughput"], "ddp")
    assert ddp["verdict"] == "regression" and ddp["severity"] == "regression"
    assert ddp["change"] == pytest.approx(-0.2, abs=1e-9) and ddp["p_holm"] < 0.05
    assert row(report["throughput"], "dp")["verdict"] == "no change"
    assert report["verdict"]["regressions"] == 1
    assert cmp.exit_code(report, []) == 0  # without the flag a regression is reported, not fatal
    assert compare_cli.main(argv(root, "--fail-on-regression")) == 1
    assert cmp.exit_code(report, ["regressions"]) == 1
    assert "**regression**" in R.compare_paths(root, "A", "B")[0].read_text()


@pytest.mark.parametrize("drop, verdict", [(0.07, "regression"), (0.03, "no change")])
def test_planted_drop_at_3pct_spread_7pct_found_3pct_not(tmp_path, drop, verdict):
    base, cand = make_runs(), make_runs()
    for runs, scale in ((base, 1.0), (cand, 1.0 - drop)):  # the repeats span 3% (±1.5%)
        for r, jitter in zip(find(runs, "ddp"), (0.985, 1.0, 1.015)):
            r["images_per_s"] = BASE_IPS[("ddp", 2)] * jitter * scale
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand)
    ddp = row(cmp.compare(tmp_path, "A", "B")["throughput"], "ddp")
    assert ddp["verdict"] == verdict and ddp["change"] == pytest.approx(-drop)


def test_change_beyond_floor_but_inside_the_repeats_spread_is_too_noisy(tmp_path):
    base, cand = make_runs(), make_runs()
    for runs, scale in ((base, 1.0), (cand, 0.92)):  # 8% drop, repeats spread ~15%
        for r, jitter in zip(find(runs, "ddp"), (1.0, 1.15, 0.85)):
            r["images_per_s"] = BASE_IPS[("ddp", 2)] * jitter * scale
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand)
    ddp = row(cmp.compare(tmp_path, "A", "B")["throughput"], "ddp")
    assert ddp["floor"] == pytest.approx(2 * 0.15, rel=1e-6)
    assert ddp["verdict"] == "too noisy to tell" and ddp["severity"] == "finding"


def test_change_inside_the_noise_floor_is_no_change_whatever_the_p_value(pair):
    _, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.96  # a launch-to-launch shift: tiny spread, p small, 4% < floor
    ddp = row(finish(threshold=0.02)["throughput"], "ddp")
    assert ddp["p_value"] < 0.01 and ddp["verdict"] == "no change"
    assert ddp["note"] == "within the noise floor between launches"


def test_single_repeat_never_claims_a_regression(tmp_path):
    base = [r for r in make_runs() if r["repeat"] == 0]
    cand = copy.deepcopy(base)
    find(cand, "ddp")[0]["images_per_s"] *= 0.8
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand)
    report = cmp.compare(tmp_path, "A", "B")
    assert row(report["throughput"], "ddp")["verdict"] == "too noisy to tell"
    single = row(report["throughput"], "single")
    assert single["verdict"] == "no change" and single["p_value"] is None and single["pooled_cv"] is None


# -- the throughput rule on simulated A/A data -------------------------------------------

def test_aa_null_simulation_raises_regressions_at_most_at_the_nominal_rate():
    """400 cells in 100 A/A comparisons of 4 cells, 3 vs 3 repeats: each repeat 3% CV, each
    launch shifted as a whole (2% sd) and each cell once more (1% sd), as between two days."""
    rng = np.random.default_rng(20261201)
    th = cmp.Thresholds()
    cells_flagged, comparisons_flagged = 0, 0
    for _ in range(100):
        day = rng.normal(0.0, 0.02)
        cells = {k: (1e4 * np.exp(rng.normal(0, 0.03, 3)),
                     1e4 * np.exp(day + rng.normal(0, 0.01) + rng.normal(0, 0.03, 3))) for k in range(4)}
        n = sum(v.verdict == "regression" for v in cmp.throughput_verdicts(cells, th)[0].values())
        cells_flagged += n
        comparisons_flagged += n > 0
    assert cells_flagged / 400 <= th.alpha
    assert comparisons_flagged / 100 <= th.alpha


def test_holm_adjusts_step_down_and_skips_untested_cells():
    assert cmp.holm([0.01, None, 0.04, 0.03]) == pytest.approx([0.03, None, 0.06, 0.06])
    assert cmp.holm([None]) == [None] and cmp.holm([]) == []


def test_welch_p_is_scipys():
    from scipy import stats

    x, y = np.array([100.0, 103.0, 98.0]), np.array([95.0, 97.0, 99.5, 96.0])
    assert cmp.welch_p(x, y) == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue, rel=1e-12)
    assert cmp.welch_p(x[:1], y) is None
    assert cmp.welch_p(np.ones(3), np.ones(3)) == 1.0


def test_welch_p_at_zero_variance_has_a_resolution_floor():
    """Identical repeats: a hair's difference (under float32's resolution) is no difference, and a
    resolved one is small p, never p = 0 (the old test returned 0.0 for both)."""
    hair = np.ones(3) * (1 + 1e-12)
    assert cmp.welch_p(np.ones(3), hair) == 1.0
    assert 0 < cmp.welch_p(np.ones(3), 2 * np.ones(3)) < 1e-6
    assert cmp.welch_p(np.ones(3), np.ones(3) * (1 + 1e-7)) > 0.05   # one ulp of float32: unresolved
    # one side spread, the other identical: the identical side's sd is the floor, not 0
    assert 0 < cmp.welch_p(np.array([1.0, 1.1, 0.9]), np.ones(3)) <= 1


# -- the noise between launches, learned from A/A launches -------------------------------

CELL_WOBBLE = {("single", 1): 1.0008, ("dp", 2): 0.9993, ("ddp", 2): 1.0}


def a_a_launches(root, shifts=(1.0, 0.999, 1.002, 0.998), provenance: dict | None = None) -> list[str]:
    """The baseline's experiment launched again: each launch shifted as a whole, each cell wobbling
    a little around it (alternately up and down), written as tags A, A2, A3..."""
    tags = []
    for i, shift in enumerate(shifts):
        tag = "A" if i == 0 else f"A{i + 1}"
        runs = make_runs()
        for r in runs:
            wobble = CELL_WOBBLE[r["variant"], r["gpus"]]
            r["images_per_s"] *= shift * (wobble if i % 2 else 1 / wobble)
        write_set(root, tag, runs, provenance if i else None)
        tags.append(tag)
    return tags


def test_a_cell_of_its_own_is_a_regression_below_the_fixed_floor(tmp_path):
    tags = a_a_launches(tmp_path)
    runs = make_runs()
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.96
    write_set(tmp_path, "B", runs)
    fixed = row(cmp.compare(tmp_path, "A", "B")["throughput"], "ddp")
    assert fixed["verdict"] == "no change"   # 4% is inside the fixed 5% floor
    report = cmp.compare(tmp_path, "A", "B", noise_from=tags)
    ddp, single = row(report["throughput"], "ddp"), row(report["throughput"], "single")
    assert ddp["verdict"] == "regression" and ddp["note"].startswith("departs from the other cells")
    assert ddp["departure"] < -ddp["floor"] < 0 and single["verdict"] == "no change"
    assert report["noise"]["launches"] == tags and report["noise"]["cells"] == 3
    assert not report["noise"]["shift_beyond"]


def test_a_shift_of_every_cell_beyond_the_launches_is_a_regression_everywhere(tmp_path):
    tags = a_a_launches(tmp_path)
    runs = make_runs()
    for r in runs:
        r["images_per_s"] *= 0.90
    write_set(tmp_path, "B", runs)
    report = cmp.compare(tmp_path, "A", "B", noise_from=tags)
    assert report["noise"]["shift_beyond"]
    assert {r["verdict"] for r in report["throughput"]} == {"regression"}
    assert all(r["note"] == "the common shift is beyond the launch-to-launch noise" for r in report["throughput"])


def test_a_shift_the_launches_also_showed_is_no_change(tmp_path):
    tags = a_a_launches(tmp_path, shifts=(1.0, 0.97, 1.03, 0.96))
    runs = make_runs()
    for r in runs:
        r["images_per_s"] *= 0.97
    write_set(tmp_path, "B", runs)
    report = cmp.compare(tmp_path, "A", "B", noise_from=tags)
    assert not report["noise"]["shift_beyond"]
    assert {r["verdict"] for r in report["throughput"]} == {"no change"}
    # each cell moved beyond the fixed threshold, and neither it nor the whole set beyond launch noise
    assert all(abs(r["change"]) > report["thresholds"]["threshold"] and abs(r["departure"]) <= r["floor"]
               for r in report["throughput"])


def test_the_report_shows_the_launch_noise_and_what_the_launches_differ_in(tmp_path, capsys):
    tags = a_a_launches(tmp_path, provenance={"git_sha": "cafe"})
    write_set(tmp_path, "B", make_runs())
    assert compare_cli.main(argv(tmp_path, "--noise-from", ",".join(tags))) == 0
    md_path, js = R.compare_paths(tmp_path, "A", "B")
    md, noise = md_path.read_text(), R.read_json(js)["noise"]
    assert noise["launches"] == tags and noise["software_differs"] == ["git_sha"]
    assert re.search(r"\| ddp g2 +\| +3/3 \|.*\| +[+-]0\.0% \|", md)   # the vs-shift column


@pytest.mark.parametrize("case, words", [
    ("one", "needs at least 2 launches"),
    ("hardware", "ran on other hardware than the baseline"),
    ("missing", "A/A launch result set 'A9' not found"),
])
def test_unusable_a_a_launches_exit_2_naming_the_problem(tmp_path, capsys, case, words):
    tags = a_a_launches(tmp_path, provenance={"gpu_names": ["NVIDIA A100"] * 2} if case == "hardware" else None)
    write_set(tmp_path, "B", make_runs())
    noise_from = {"one": ["A"], "hardware": tags, "missing": ["A", "A9"]}[case]
    assert compare_cli.main(argv(tmp_path, "--noise-from", ",".join(noise_from))) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert not R.compare_paths(tmp_path, "A", "B")[0].exists()


# -- memory, warnings, status, provenance ------------------------------------------------

def test_memory_increase_must_exceed_both_limits(pair):
    root, runs, finish = pair
    for r in find(runs, "ddp"):
        r["memory"][0] += 200.0  # +200 MiB of 2300: +8.7%, both limits -> regression
        r["memory"][1] += 90.0  # +90 MiB of 2000: +4.5%, only the MiB limit -> no change
    for r in find(runs, "dp"):
        r["memory"][1] += 60.0  # +3%: under 64 MiB whatever the percentage
    mem = {(r["variant"], r["device"]): r for r in finish()["memory"]}
    assert [mem[("ddp", d)]["verdict"] for d in (0, 1)] == ["regression", "no change"]
    assert mem[("ddp", 0)]["delta_mib"] == pytest.approx(200.0)
    mem = {(r["variant"], r["device"]): r["verdict"]
           for r in cmp.compare(root, "A", "B", mem_threshold_pct=1.0)["memory"]}
    assert (mem[("ddp", 1)], mem[("dp", 1)]) == ("regression", "no change")


def test_new_warning_is_a_finding_and_fails_only_when_asked(pair):
    root, runs, finish = pair
    new = {**PAIR_DP_WARNING, "category": "FutureWarning", "message": "torch.foo is deprecated", "count": 1}
    for r in find(runs, "ddp"):
        r["warnings"].append(dict(new))
    for r in find(runs, "dp"):
        r["warnings"][0]["count"] = 50
    report = finish()
    (w,) = report["warnings"]["new"]
    assert (w["variant"], w["category"], w["message"]) == ("ddp", "FutureWarning", "torch.foo is deprecated")
    assert w["severity"] == "finding" and w["count_per_run_candidate"] == 1.0
    (c,) = report["warnings"]["changed"]
    assert (c["count_per_run_baseline"], c["count_per_run_candidate"]) == (98.0, 50.0)
    assert report["verdict"]["regressions"] == 0 and report["verdict"]["findings"] == 1
    assert cmp.exit_code(report, ["regressions", "diverged-curves"]) == 0
    assert compare_cli.main(argv(root, "--fail-on-regression", "--fail-on", "new-warnings")) == 1
    written = R.read_json(R.compare_paths(root, "A", "B")[1])
    assert written["fail_on"] == ["regressions", "new-warnings"]
    assert (written["verdict"]["counts"]["regressions"], written["verdict"]["counts"]["new-warnings"]) == (0, 1)


def test_run_that_turned_failed_is_a_regression(pair):
    _, runs, finish = pair
    failed = find(runs, "ddp", repeat=1)[0]
    failed.update(status=R.STATUS_FAILED, reason="NCCL timeout")
    report = finish()
    (s,) = report["status"]
    assert (s["run_id"], s["change"], s["severity"], s["reason"]) == (
        "ddp-g2-r1", "ok → failed", "regression", "NCCL timeout")
    assert row(report["throughput"], "ddp")["n_candidate"] == 2


def test_missing_run_is_a_regression_and_new_run_is_info(pair):
    _, runs, finish = pair
    runs.remove(find(runs, "dp", repeat=2)[0])
    runs.append({**copy.deepcopy(find(runs, "ddp", repeat=0)[0]), "gpus": 4})
    changes = {s["run_id"]: (s["change"], s["severity"]) for s in finish()["status"]}
    # A cell of its own makes the candidate another experiment: its runs are not "new" runs.
    assert changes == {"dp-g2-r2": ("missing in candidate", "regression"),
                       "ddp-g4-r0": ("not in the other experiment", "info")}


def test_accuracy_change_is_tested_against_the_repeats(pair):
    _, runs, finish = pair
    for r in find(runs, "dp"):
        r["test_acc"] -= 0.10  # ten times the repeats' spread
    for r in find(runs, "ddp"):
        r["test_acc"] -= 0.005  # well inside it
    report = finish()
    dp, ddp = row(report["accuracy"], "dp"), row(report["accuracy"], "ddp")
    assert dp["change_pp"] == pytest.approx(-10.0) and dp["verdict"] == "differs" and dp["p_holm"] < 0.05
    assert ddp["verdict"] == "no change"


def test_provenance_and_config_differences_are_listed(pair):
    _, runs, finish = pair
    for r in runs:
        r["config"]["lr"] = 0.2
    # Runs saw 1 or 2 GPUs of the same model: a list of lists in provenance.json, same hardware.
    gpus_per_run = [["NVIDIA H200"], ["NVIDIA H200", "NVIDIA H200"]]
    report = finish({"torch": "2.15.0+cu130", "cudnn": 92000, "gpu_names": gpus_per_run})
    prov = report["provenance"]
    assert prov["differs"] == ["torch", "cudnn"] and not prov["hardware_differs"]
    assert prov["config_differs"] == {"lr": {"baseline": [0.1], "candidate": [0.2]}}


@pytest.mark.parametrize("change", [{"gpu_names": ["NVIDIA A100"] * 2}, {"hostname": "node2"}, "cpu"])
def test_hardware_difference_warns_timings_not_comparable(pair, change):
    root, runs, finish = pair
    if change == "cpu":
        for r in runs:
            r["device_type"] = "cpu"
    report = finish(change if isinstance(change, dict) else None)
    assert report["provenance"]["hardware_differs"]
    assert report["provenance"]["warning"]
    assert report["provenance"]["warning"] in compare_report.render_markdown(report)


# -- loss curves: deterministic runs compare bit for bit ---------------------------------

def test_identical_deterministic_curves_are_identical(det_pair):
    _, _, finish = det_pair
    report = finish()
    assert {(r["mode"], r["verdict"], r["severity"]) for r in report["loss"]} == {("exact", "identical", "info")}
    assert row(report["loss"], "ddp")["steps_matched"] == 3 * N_STEPS


def test_one_bit_difference_reports_the_first_differing_step(det_pair):
    root, runs, finish = det_pair
    run = find(runs, "dp", repeat=1)[0]
    run["losses"][7] = float(np.nextafter(run["losses"][7], 10.0))  # one bit
    run["losses"][20] += 0.5
    report = finish()
    dp = row(report["loss"], "dp")
    assert row(report["loss"], "ddp")["verdict"] == "identical"
    assert (dp["mode"], dp["verdict"], dp["severity"]) == ("exact", "bits changed", "regression")
    first = dp["first_diff"]
    assert (first["repeat"], first["epoch"], first["step"]) == (1, 1, 7)
    assert 0 < first["abs_diff"] < 1e-12 and dp["max_abs_diff"] == pytest.approx(0.5)
    assert report["provenance"]["differs"] == []   # same software: changed bits are not expected
    assert report["verdict"]["counts"]["diverged-curves"] == 1
    md = R.compare_paths(root, "A", "B")[0]
    assert compare_cli.main(argv(root, "--fail-on-regression")) == 1
    assert re.search(r"\| dp g2 +\| +3/3 \| exact +\|.*r1 epoch 1, step 7: .*\*\*bits changed\*\*", md.read_text())


def test_changed_bits_after_a_torch_upgrade_are_a_finding_not_a_regression(det_pair):
    root, runs, finish = det_pair
    find(runs, "single", repeat=0)[0]["losses"][3] += 1e-6
    report = finish({"torch": "2.15.0+cu130"})
    single = row(report["loss"], "single")
    assert (single["verdict"], single["severity"]) == ("bits changed", "finding")
    assert "torch" in single["note"]
    assert cmp.exit_code(report, ["regressions"]) == 0
    # Expected changed bits are no divergence: a version check with deterministic curves can pass.
    assert report["verdict"]["counts"]["diverged-curves"] == 0
    assert cmp.exit_code(report, ["diverged-curves"]) == 0
    assert cmp.exit_code(report, ["findings"]) == 1


def test_after_a_software_change_deterministic_curves_still_face_the_envelope(det_pair):
    root, runs, finish = det_pair
    for r in find(runs, "ddp"):
        r["losses"] = [v + 0.1 * (s >= 10) for s, v in enumerate(r["losses"])]
    find(runs, "single", repeat=0)[0]["losses"][3] += 1e-6
    report = finish({"torch": "2.15.0+cu130"})
    ddp, single = row(report["loss"], "ddp"), row(report["loss"], "single")
    assert (ddp["mode"], ddp["verdict"], ddp["severity"]) == ("exact", "diverged", "finding")
    assert ddp["outside_fraction"] > 0.5 and ddp["first_outside"]["step"] >= 10
    assert ddp["first_diff"]["step"] == 10
    assert (single["verdict"], single["outside_fraction"]) == ("bits changed", 0.0)
    assert report["verdict"]["counts"]["diverged-curves"] == 1
    assert compare_cli.main(argv(root, "--fail-on", "diverged-curves")) == 1


def test_unreproducible_bits_count_as_a_diverged_curve(det_pair):
    _, runs, finish = det_pair
    find(runs, "dp", repeat=1)[0]["losses"][7] += 1e-9
    report = finish()
    assert row(report["loss"], "dp")["severity"] == "regression"
    assert report["verdict"]["counts"]["diverged-curves"] == 1
    assert cmp.exit_code(report, ["diverged-curves"]) == 1


@pytest.mark.parametrize("how", ["nan", "missing steps"])
@pytest.mark.parametrize("software_changed", [False, True])
def test_deterministic_curve_with_a_nan_or_missing_step_is_diverged_and_reported(
        det_pair, how, software_changed):
    root, runs, finish = det_pair
    run = find(runs, "single", repeat=1)[0]
    if how == "nan":
        run["losses"][5] = math.nan
    else:
        run["losses"] = run["losses"][:30]
    report = finish({"torch": "2.15.0+cu130"} if software_changed else None)
    single = row(report["loss"], "single")
    assert (single["mode"], single["verdict"]) == ("exact", "diverged")
    assert single["severity"] == ("finding" if software_changed else "regression")
    first = single["first_diff"]
    assert (first["repeat"], first["step"], first["abs_diff"]) == (1, 5 if how == "nan" else 30, None)
    assert report["verdict"]["counts"]["diverged-curves"] == 1
    assert compare_cli.main(argv(root)) == 0
    md, js = R.compare_paths(root, "A", "B")
    assert js.exists()
    assert re.search(r"\| single g1 +\| +3/3 \| exact +\|.*r1 epoch 1, step \d+: missing or non-finite"
                     r".*\*\*diverged\*\*", md.read_text())


@pytest.mark.parametrize("what", ["seed", "config", "gpus", "not deterministic"])
def test_curves_compare_bit_for_bit_only_when_everything_matches(det_pair, what):
    _, runs, finish = det_pair
    provenance = None
    for r in runs:
        if what == "seed":
            r["record"]["seed"] += 10
        elif what == "config":
            r["config"]["lr"] = 0.2
        elif what == "not deterministic":
            r["record"]["deterministic"] = False
    if what == "gpus":
        provenance = {"gpu_names": ["NVIDIA A100"] * 2}
    single = row(finish(provenance)["loss"], "single")
    assert single["mode"] == "envelope" and single["verdict"] == "identical"  # same bits, unpromised
    assert {"seed": "seeds differ", "config": "config differs (lr)", "gpus": "hardware differs",
            "not deterministic": "not deterministic on both sides"}[what] == single["why_not_exact"]


def test_inert_config_keys_do_not_stop_a_bit_for_bit_check(det_pair):
    _, runs, finish = det_pair
    for r in runs:
        r["config"]["data_root"] = "/elsewhere"
    assert {r["mode"] for r in finish()["loss"]} == {"exact"}


# -- loss curves: otherwise against the baseline's spread --------------------------------

def test_planted_curve_shift_beyond_the_envelope_is_found_noise_within_is_not(pair):
    root, runs, finish = pair
    for r in find(runs, "single"):
        r["losses"] = curve(r["repeat"], salt=7)  # fresh noise of the same size: other seeds
    for r in find(runs, "ddp"):
        r["losses"] = [v + 0.1 * (s >= 10) for s, v in enumerate(curve(r["repeat"], salt=8))]
    report = finish()
    single, ddp = row(report["loss"], "single"), row(report["loss"], "ddp")
    assert single["mode"] == "envelope" and single["verdict"] == "within noise"
    assert single["outside_fraction"] < 0.1 and single["severity"] == "info"
    assert ddp["verdict"] == "diverged" and ddp["severity"] == "finding"
    assert ddp["outside_fraction"] > 0.5 and ddp["first_outside"]["step"] >= 10
    assert cmp.exit_code(report, ["regressions", "new-warnings"]) == 0
    assert compare_cli.main(argv(root, "--fail-on", "diverged-curves")) == 1


@pytest.mark.parametrize("model", ["level", "drift"])
def test_envelope_null_simulation_calls_divergence_rarely_and_finds_real_shifts(model):
    """A/A pairs of 3 vs 3 curves: 'diverged' in at most 5% of them; a shift of 3 run-to-run sd
    in at least 80%. Runs differ as GPU repeats do: by a level each run keeps for its whole
    length (twice the per-step noise), or by a slow random drift."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(7)
    th, steps = cmp.Thresholds(), 200
    trend = 2.3 * np.exp(-np.arange(steps) / 40) + 0.6

    def curves(shift: float = 0.0) -> np.ndarray:
        if model == "level":
            wander = rng.normal(0, 0.1, (3, 1)) * np.minimum(1.0, np.arange(steps) / 20)
        else:
            wander = lfilter([1.0], [1.0, -0.99], rng.normal(0, 0.015, (3, steps)), axis=1)  # AR(1)
        return trend + wander + rng.normal(0, 0.05, (3, steps)) + shift

    sd = np.std(np.concatenate([curves() for _ in range(30)]), axis=0)[20:].mean()
    false = sum(cmp.envelope_check(curves(), curves(), th)["verdict"] == "diverged" for _ in range(200))
    found = sum(cmp.envelope_check(curves(), curves(3 * sd), th)["verdict"] == "diverged" for _ in range(50))
    assert false / 200 <= 0.05
    assert found / 50 >= 0.8


def test_one_baseline_repeat_says_the_noise_is_unknown(tmp_path):
    base = [r for r in make_runs() if r["repeat"] == 0]
    cand = copy.deepcopy(base)
    find(cand, "ddp")[0]["losses"] = [v + 1.0 for v in find(cand, "ddp")[0]["losses"]]
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand)
    ddp = row(cmp.compare(tmp_path, "A", "B")["loss"], "ddp")
    assert ddp["verdict"] == "noise unknown" and ddp["severity"] == "info"
    assert ddp["max_abs_diff"] == pytest.approx(1.0)


def test_nan_loss_on_one_side_counts_as_diverged(pair):
    _, runs, finish = pair
    find(runs, "single", repeat=0)[0]["losses"][7] = math.nan
    single = row(finish()["loss"], "single")
    assert single["verdict"] == "diverged" and single["note"] == "loss not finite on one side"
    assert single["first_outside"] == {"epoch": 1, "step": 7}


def test_old_records_without_deterministic_or_seed_still_compare(tmp_path):
    old, new = make_runs(deterministic=None), make_runs(deterministic=True)
    for r in old:
        r["config"].pop("seed")  # older still: no seed in the config either
    assert all("deterministic" not in r["config"] and not r["record"] for r in old)
    write_set(tmp_path, "A", old)
    write_set(tmp_path, "B", new)
    write_set(tmp_path, "C", copy.deepcopy(old))
    loaded = cmp.load_set(tmp_path, "A", "baseline")["records"]
    assert loaded["ddp-g2-r1"].deterministic is False and loaded["ddp-g2-r1"].seed == 0
    assert loaded["ddp-g2-r1"] == R.RunRecord.from_json(R.read_json(R.run_dir(tmp_path, "A", "ddp-g2-r1") / R.METRICS))
    report = cmp.compare(tmp_path, "A", "B")
    assert {(r["mode"], r["why_not_exact"]) for r in report["loss"]} == {
        ("envelope", "not deterministic on both sides")}
    assert {r["verdict"] for r in cmp.compare(tmp_path, "A", "C")["loss"]} == {"identical"}


# -- damaged input: exit 2, one line naming the file (and column) ------------------------

def _damage(root: Path, what: str) -> tuple[Path, str | None]:
    """Damages the candidate set B; returns the file and column the message must name."""
    summary, prov = R.table_path(root, "B", "summary"), R.provenance_path(root, "B")
    if what == "missing folder":
        import shutil
        shutil.rmtree(R.tag_dir(root, "B"))
        return R.tag_dir(root, "B"), None
    if what == "missing table":
        R.table_path(root, "B", "steps").unlink()
        return R.table_path(root, "B", "steps"), None
    if what == "missing column":
        text = summary.read_text().replace(",images_per_s,", ",ips,")
        summary.write_text(text)
        return summary, "images_per_s"
    if what == "empty summary":
        summary.write_text("")
        return summary, None
    if what == "header-only summary":
        summary.write_text(summary.read_text().splitlines()[0] + "\n")
        return summary, None
    if what == "non-numeric images_per_s":
        lines = summary.read_text().splitlines()
        cols = lines[0].split(",")
        cells = lines[3].split(",")
        cells[cols.index("images_per_s")] = "fast"
        summary.write_text("\n".join(lines[:3] + [",".join(cells)] + lines[4:]) + "\n")
        return summary, "images_per_s"
    if what == "non-numeric loss":
        steps = R.table_path(root, "B", "steps")
        steps.write_text(re.sub(r"^(ddp-g2-r0,ddp,2,,0,1,3,)[^,]*", r"\1-", steps.read_text(), flags=re.M))
        return steps, "loss_global"
    if what == "garbage provenance":
        prov.write_bytes(b"\x00{not json")
        return prov, None
    if what == "provenance not an object":
        prov.write_text("[1, 2]\n")
        return prov, None
    if what == "garbage run record":
        path = R.run_dir(root, "B", "ddp-g2-r1") / R.METRICS
        path.write_text('{"run_id": "ddp-g2-r1", ')
        return path, None
    if what == "run record without status":
        path = R.run_dir(root, "B", "ddp-g2-r1") / R.METRICS
        path.write_text('{"run_id": "ddp-g2-r1", "config": {}}\n')
        return path, None
    if what == "run record with a config that is no object":
        path = R.run_dir(root, "B", "ddp-g2-r1") / R.METRICS
        path.write_text('{"run_id": "ddp-g2-r1", "status": "ok", "config": [1]}\n')
        return path, None
    raise AssertionError(what)


DAMAGE = ["missing folder", "missing table", "missing column", "empty summary", "header-only summary",
          "non-numeric images_per_s", "non-numeric loss", "garbage provenance",
          "provenance not an object", "garbage run record", "run record without status",
          "run record with a config that is no object"]


@pytest.mark.parametrize("what", DAMAGE)
def test_damaged_input_exits_2_with_one_line_naming_file_and_column(pair, capsys, what):
    root, _, finish = pair
    finish()
    path, column = _damage(root, what)
    capsys.readouterr()
    assert compare_cli.main(argv(root, "--fail-on-regression")) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert str(path) in err
    if column:
        assert repr(column) in err
    assert "Traceback" not in err


def test_damaged_input_exits_2_from_the_command_line(pair):
    root, _, finish = pair
    finish()
    _damage(root, "non-numeric images_per_s")
    proc = subprocess.run([sys.executable, "-m", "dpbench.compare_cli", *argv(root, "--fail-on-regression")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "'images_per_s'" in proc.stderr


def test_unknown_fail_on_kind_is_a_usage_error(pair, capsys):
    root, _, finish = pair
    finish()
    with pytest.raises(SystemExit) as exc:
        compare_cli.main(argv(root, "--fail-on", "regressions,typo"))
    assert exc.value.code == 2 and "'typo'" in capsys.readouterr().err


# -- one source for the thresholds, and the report ---------------------------------------

def test_every_threshold_is_a_schema_key_and_a_flag():
    """Thresholds' defaults are the schema's; each knob is also a flag of the command line."""
    flags = compare_cli._parser().format_help()
    for f in cmp.dataclasses.fields(cmp.Thresholds):
        assert f.name in cmp.thresholds.COMPARE
        assert f"--{f.name.replace('_', '-')}" in flags


def test_markdown_is_a_readable_report(pair):
    _, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.8
    md = compare_report.render_markdown(json.loads(json.dumps(finish())))  # works on the json twin too
    assert md.startswith("# dpbench compare")
    assert md.index("## Provenance") < md.index("**Verdict: 1 regression, 0 findings**") < md.index("## Run status")
    assert re.search(r"\| ddp g2 +\| +3/3 \|", md)
    assert "Fails the job: nothing" in md


def test_report_names_keep_dotted_version_tags(tmp_path):
    md, js = R.compare_paths(tmp_path, "torch-2.13.0+cpu", "torch-2.14.1+cu130")
    assert md.name == "torch-2.13.0+cpu_vs_torch-2.14.1+cu130.md"
    assert js.name == "torch-2.13.0+cpu_vs_torch-2.14.1+cu130.json"


def test_counts_read_in_good_english(tmp_path):
    base = [r for r in make_runs() if r["variant"] == "ddp" and r["repeat"] == 0]
    cand = copy.deepcopy(base)
    cand[0]["losses"] = [v + 1.0 for v in cand[0]["losses"]]
    cand[0]["test_acc"] = 0.9
    cand.append({**copy.deepcopy(base[0]), "repeat": 1, "status": R.STATUS_FAILED, "reason": "boom"})
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand, {"gpu_names": ["NVIDIA A100"] * 2})
    report = cmp.compare(tmp_path, "A", "B")
    assert (report["verdict"]["regressions"], report["verdict"]["findings"]) == (0, 1)
    md = compare_report.render_markdown(report)
    assert "1 baseline run against 2 candidate runs, 1 cell (variant" in md
    assert "**Verdict: 0 regressions, 1 finding**" in md
    write_set(tmp_path, "C", [{**cand[1], "repeat": 0}], {"gpu_names": ["NVIDIA A100"] * 2})
    verdict = cmp.compare(tmp_path, "A", "C")["verdict"]
    assert (verdict["regressions"], verdict["findings"]) == (1, 1)
    assert verdict["line"] == "1 regression, 1 finding"   # the one line the command prints


def test_a_crash_while_rendering_leaves_neither_report_file(pair, monkeypatch, capsys):
    root, _, finish = pair
    finish()

    def broken(report):
        raise RuntimeError("cannot render")

    monkeypatch.setattr(compare_report, "render_markdown", broken)
    assert compare_cli.main(argv(root)) == 2
    assert "RuntimeError: cannot render" in capsys.readouterr().err
    md, js = R.compare_paths(root, "A", "B")
    assert not md.exists() and not js.exists()


def test_help_names_the_command_it_was_called_as(capsys):
    from dpbench import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: dpbench compare ")


def test_numbers_align_right_in_the_markdown_tables(pair):
    _, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.8
    md = compare_report.render_markdown(finish())
    throughput = md.split("## Throughput")[1].split("\n\n")[2].splitlines()
    rule = [c.strip() for c in throughput[1].strip("|").split("|")]
    headers = [c.strip() for c in throughput[0].strip("|").split("|")]
    right = {h for h, c in zip(headers, rule) if c.endswith(":")}
    assert right == {"repeats", "baseline", "candidate", "change", "floor", "p", "p (Holm)"}
    ddp = next(line for line in throughput if line.startswith("| ddp g2 "))
    assert re.search(r"\| +-20\.0% \|", ddp)


def test_internal_errors_read_as_one_line_type_and_first_line(pair, monkeypatch, capsys):
    from dpbench.analysis import collect
    from dpbench.results.errors import error_text

    root, _, finish = pair
    finish()
    exc = ValueError("first line\nsecond line")
    monkeypatch.setattr(cmp, "compare", lambda *a, **k: (_ for _ in ()).throw(exc))
    assert compare_cli.main(argv(root)) == 2
    assert capsys.readouterr().err == f"dpbench.compare_cli: error: cannot compare 'A' with 'B': {error_text(exc)}\n"
    reason = collect.damaged(Path("runs/ddp-g2-r0/metrics.json"), exc)["reason"]
    assert f"({error_text(exc)})" in reason and "second line" not in reason


def test_provenance_lists_read_as_results_reads_them(pair):
    _, _, finish = pair
    mixed = {"gpu_names": [["NVIDIA H200"], ["NVIDIA H200", "NVIDIA H200"]],
             "cuda": None, "nccl": ["2.28.9", "2.29.1"]}
    keys = finish(mixed)["provenance"]["keys"]
    assert keys["gpu_names"] == {"baseline": ["NVIDIA H200"], "candidate": ["NVIDIA H200"], "differs": False}
    assert keys["cuda"]["candidate"] is None and keys["cuda"]["differs"]
    assert keys["nccl"]["candidate"] == ["2.28.9", "2.29.1"]


def test_the_pipeline_passes_a_a_launches_to_compare():
    import shlex

    from dpbench.plan import pipeline

    cfg = pipeline.load_experiment({"experiment": "smoke", "baseline": "A",
                                    "compare": {"noise_from": ["A", "A2"], "threshold": "0.03"}},
                                   Path(__file__).parents[3])
    parsed = compare_cli._parser().parse_args(shlex.split(pipeline.compare_args(cfg, "B")))
    assert parsed.noise_from == ["A", "A2"] and parsed.threshold == 0.03 and parsed.candidate == "B"


def test_a_cell_the_a_a_launches_lack_says_so(tmp_path):
    tags = a_a_launches(tmp_path)
    extra = [{**r, "variant": "dp_sum", "config": {**r["config"], "variant": "dp_sum"}} for r in find(make_runs(), "dp")]
    write_set(tmp_path, "A", make_runs() + extra)   # the baseline ran a cell no other launch has
    write_set(tmp_path, "B", make_runs() + copy.deepcopy(extra))
    rows = cmp.compare(tmp_path, "A", "B", noise_from=tags)["throughput"]
    assert row(rows, "dp_sum")["note"].endswith("not in every A/A launch")
    assert "A/A" not in row(rows, "ddp")["note"]


def test_a_departure_against_its_own_change_is_named_not_called(tmp_path):
    tags = a_a_launches(tmp_path, shifts=(1.0, 0.95, 1.06, 0.93))   # launches that move by 5%
    runs = make_runs()
    for r in runs:   # everything 6% slower, ddp only 3%: beyond the others, yet slower
        r["images_per_s"] *= 0.97 if r["variant"] == "ddp" else 0.94
    write_set(tmp_path, "B", runs)
    report = cmp.compare(tmp_path, "A", "B", noise_from=tags)
    ddp = row(report["throughput"], "ddp")
    assert not report["noise"]["shift_beyond"] and ddp["verdict"] == "no change"
    assert ddp["note"].startswith("departs from the other cells by +3.2%, the other way from its own change")


def test_a_short_and_a_full_sha_of_one_commit_are_one_software(tmp_path):
    tags = a_a_launches(tmp_path, provenance={"git_sha": PAIR_PROVENANCE["git_sha"][:7]})
    write_set(tmp_path, "B", make_runs())
    assert cmp.compare(tmp_path, "A", "B", noise_from=tags)["noise"]["software_differs"] == []


def test_throughput_change_is_the_ratio_of_geometric_means_welch_tests_logs():
    """What is tested is what is reported: Welch on log images/s, change = geometric means' ratio;
    report format 1 (older reports) keeps its ratio of medians and Welch on raw values."""
    x, y = np.array([100.0, 200.0, 400.0]), np.array([150.0, 150.0, 600.0])
    th = cmp.Thresholds()
    v = cmp.throughput_verdicts({"c": (x, y)}, th)[0]["c"]
    assert v.change == pytest.approx((150 * 150 * 600) ** (1 / 3) / 200 - 1)
    assert v.p_value == pytest.approx(cmp.welch_p(np.log(x), np.log(y)))
    old = cmp.throughput_verdicts({"c": (x, y)}, th, report_format=1)[0]["c"]
    assert old.change == pytest.approx(150 / 200 - 1) and old.p_value == pytest.approx(cmp.welch_p(x, y))


# -- a workload set in `train` is part of a cell (issue 36, row 13) ---------------------------------

TIMM = {"factory": "timm_models.py:build", "args": {"name": "resnet26d"}}


def _two_models(tmp_path: Path, stale_labels: bool) -> dict:
    """ResNet18 (the default) against a set whose `train` named another model, written as plans
    before issue 36 wrote it: the workload in the config, not in the options or the run id."""
    from fakes import fake_result_set
    spec = [dict(variant="single", images_per_s=[1000, 1010]), dict(variant="ddp", gpus=2, images_per_s=[1800, 1790])]
    fake_result_set(tmp_path, spec, tag="resnet18")
    other = fake_result_set(tmp_path, [dict(e, images_per_s=[v * 0.12 for v in e["images_per_s"]],
                                            config={"workload": TIMM}) for e in spec], tag="timm")
    if stale_labels:   # its tables as collect wrote them then: no workload in the options column
        for name in ("summary", "memory", "warnings", "steps"):
            path = R.table_path(tmp_path, "timm", name)
            table = R.read_table(tmp_path, "timm", name)
            table.assign(options="").to_csv(path, index=False)
    assert (other.runs_dir / "ddp-g2-r0").is_dir()          # the old run ids, kept
    return cmp.compare(tmp_path, "resnet18", "timm")


@pytest.mark.parametrize("stale_labels", [False, True], ids=["collected-now", "collected-before"])
def test_compare_never_pairs_two_models_as_one_cell(tmp_path, stale_labels):
    report = _two_models(tmp_path, stale_labels)
    assert report["sets"]["shared_cells"] == 0
    assert report["sets"]["experiments"]["differ"] is True
    assert report["throughput"] == [] and report["memory"] == [] and report["accuracy"] == []
    only = {(c["variant"], c["options"]) for c in report["sets"]["only_candidate"]}
    assert only == {("single", f"workload={R.workload_label(TIMM)}"), ("ddp", f"workload={R.workload_label(TIMM)}")}


# -- cells by the plans' cell ids (issue 37) --------------------------------------------------------

def _planned(tmp_path: Path, tag: str, cell_of=lambda cell: cell) -> None:
    """A fake set as the pipeline leaves it now: plan.json lists every run's identity, and
    runs.csv carries the cell id that plan gave it (`cell_of` of the one collect wrote)."""
    runs = R.read_table(tmp_path, tag, "runs")
    runs = runs.assign(cell_id=runs["cell_id"].map(cell_of))
    runs.to_csv(R.table_path(tmp_path, tag, "runs"), index=False)
    R.write_json(R.ResultSet(tmp_path, tag).plan_path, {"identities": {
        rid: {"run_id": rid, "cell_id": cell, "setup_id": "", "group": ""}
        for rid, cell in zip(runs["run_id"], runs["cell_id"])}})


@pytest.mark.parametrize("planned", ["both", "baseline only", "neither"])
def test_cells_are_the_plans_cell_ids_where_both_sets_carry_them(tmp_path, planned):
    """Both sets carry their plans' cell ids: cells pair by them (here the candidate's plan put
    ddp's runs in a cell of their own, so ddp pairs with nothing), the rows showing variant,
    gpus and options as before; otherwise by (variant, gpus, options)."""
    from fakes import fake_result_set
    spec = [dict(variant="single", images_per_s=[1000, 1010]), dict(variant="ddp", gpus=2, images_per_s=[1800, 1790])]
    fake_result_set(tmp_path, spec, tag="A")
    fake_result_set(tmp_path, spec, tag="B")
    if planned != "neither":
        _planned(tmp_path, "A")
    if planned == "both":
        _planned(tmp_path, "B", lambda cell: f"{cell}-elsewhere" if cell.startswith("ddp") else cell)
    report = cmp.compare(tmp_path, "A", "B")
    paired = [(r["variant"], r["gpus"], r["options"]) for r in report["throughput"]]
    if planned == "both":
        assert paired == [("single", 1, "")] and report["sets"]["shared_cells"] == 1
        assert [(c["variant"], c["gpus"]) for c in report["sets"]["only_candidate"]] == [("ddp", 2)]
    else:
        assert paired == [("ddp", 2, ""), ("single", 1, "")] and report["sets"]["shared_cells"] == 2
