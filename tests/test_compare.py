"""dpbench.compare on synthetic result sets laid out exactly as collect writes them."""
from __future__ import annotations

import re
import copy
import json
import math

import pytest

from dpbench import compare as cmp
from dpbench import results as R

BASE_IPS = {("single", 1): 10_000.0, ("dp", 2): 15_000.0, ("ddp", 2): 19_000.0}
JITTER = (1.0, 1.01, 0.99)  # ~1% spread between the 3 repeats
PROVENANCE = {"torch": "2.14.1+cu130", "torch_git": "abc123", "cuda": "13.0", "cudnn": 91900,
              "nccl": "2.28.9", "driver": "580.159.04", "gpu_names": ["NVIDIA H200", "NVIDIA H200"],
              "python": "3.11.7", "hostname": "node1", "git_sha": "deadbeef"}
DP_WARNING = {"category": "UserWarning", "message": "Was asked to gather along dimension 0",
              "count": 98, "first_step": 0, "location": "torch/nn/parallel/_functions.py:70", "rank": 0}


def make_runs() -> list[dict]:
    """3 repeats of three run groups; tests edit this list before writing the candidate."""
    runs = []
    for (variant, gpus), ips in BASE_IPS.items():
        for repeat, jitter in enumerate(JITTER):
            runs.append({
                "variant": variant, "gpus": gpus, "repeat": repeat, "options": {},
                "status": R.STATUS_OK, "reason": "", "images_per_s": ips * jitter,
                "memory": [2000.0 + 300 * (d == 0) for d in range(gpus)],
                "warnings": [dict(DP_WARNING)] if variant == "dp" else [],
                "losses": [2.3 - 0.1 * s for s in range(10)], "test_acc": 0.60 + 0.001 * repeat,
                "config": {"variant": variant, "gpus": gpus, "repeat": repeat, "options": {},
                           "lr": 0.1, "global_batch": 128, "precision": "fp32"},
                "device_type": "cuda",
            })
    return runs


def write_set(root, tag: str, runs: list[dict], provenance: dict | None = None) -> None:
    """Per-run metrics.json + steps.csv and the tidy tables, with results' columns and writers."""
    tables: dict[str, list[dict]] = {name: [] for name in R.TABLES}
    for run in runs:
        rid = R.run_id(run["variant"], run["gpus"], run["repeat"], run["options"])
        ok = run["status"] == R.STATUS_OK
        key = {"run_id": rid, "variant": run["variant"], "gpus": run["gpus"],
               "options": R.options_label(run["options"]), "repeat": run["repeat"]}
        steps = [{"epoch": 1, "step": s, "loss_global": loss, "loss_reported": loss, "lr": 0.1,
                  "step_ms": 10.0} for s, loss in enumerate(run["losses"])]
        tables["summary"].append({**key, "status": run["status"], "reason": run["reason"],
                                  "images_per_s": run["images_per_s"] if ok else None,
                                  "peak_mem_mib": max(run["memory"]), "n_warnings": len(run["warnings"]),
                                  "final_loss": run["losses"][-1], "test_acc": run["test_acc"] if ok else None,
                                  "global_batch": 128, "device_type": run["device_type"]})
        tables["memory"] += [{**key, "device": d, "allocated_mib": m, "reserved_mib": m + 100}
                             for d, m in enumerate(run["memory"])]
        tables["warnings"] += [{**key, **w} for w in run["warnings"]]
        tables["accuracy"].append({**key, "epoch": 1, "test_acc": run["test_acc"], "test_loss": 1.0})
        tables["steps"] += [{**key, **s} for s in steps]
        R.write_json(R.run_dir(root, tag, rid) / R.METRICS,
                     {"run_id": rid, "status": run["status"], "config": run["config"], **key})
        R.write_csv(R.run_dir(root, tag, rid) / R.STEPS, R.STEP_COLUMNS, steps)
    for name, rows in tables.items():
        R.write_csv(R.table_path(root, tag, name), R.TABLES[name], rows)
    prov = {**PROVENANCE, **(provenance or {}), "tag": tag, "n_runs": len(runs)}
    R.write_json(R.tag_dir(root, tag) / "provenance.json", prov)


def find(runs: list[dict], variant: str, repeat: int | None = None) -> list[dict]:
    return [r for r in runs if r["variant"] == variant and repeat in (None, r["repeat"])]


def row(rows: list[dict], variant: str) -> dict:
    (match,) = [r for r in rows if r["variant"] == variant]
    return match


@pytest.fixture
def pair(tmp_path):
    """Writes the baseline now; returns (root, candidate runs to edit, write-candidate fn)."""
    write_set(tmp_path, "A", make_runs())
    runs = make_runs()

    def finish(provenance: dict | None = None) -> dict:
        write_set(tmp_path, "B", runs, provenance)
        return cmp.compare(tmp_path, "A", "B")

    return tmp_path, runs, finish


def test_identical_sets_report_no_regression_and_exit_0(pair):
    root, _, finish = pair
    report = finish()
    assert report["verdict"] == {"regressions": 0, "findings": 0, "line": "no regression beyond noise"}
    assert {r["verdict"] for r in report["throughput"]} == {"no change"}
    assert report["provenance"]["differs"] == [] and report["provenance"]["config_differs"] == {}
    argv = ["--results-dir", str(root), "--baseline", "A", "--candidate", "B", "--fail-on-regression"]
    assert cmp.main(argv) == 0
    md, js = R.compare_paths(root, "A", "B")
    assert "no regression beyond noise" in md.read_text()
    assert R.read_json(js) == report


def test_planted_20pct_throughput_drop_is_a_regression_and_fails(pair):
    root, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.8
    report = finish()
    ddp = row(report["throughput"], "ddp")
    assert ddp["verdict"] == "regression" and ddp["severity"] == "regression"
    assert ddp["change"] == pytest.approx(-0.2, abs=1e-9) and ddp["p_value"] < 0.05
    assert row(report["throughput"], "dp")["verdict"] == "no change"
    assert report["verdict"]["regressions"] == 1
    argv = ["--results-dir", str(root), "--baseline", "A", "--candidate", "B"]
    assert cmp.main(argv) == 0  # without the flag a regression is reported, not fatal
    assert cmp.main(argv + ["--fail-on-regression"]) == 1
    assert "**regression**" in R.compare_paths(root, "A", "B")[0].read_text()


def test_one_percent_change_inside_the_spread_is_no_change(pair):
    _, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.99
    ddp = row(finish()["throughput"], "ddp")
    assert ddp["verdict"] == "no change" and ddp["change"] == pytest.approx(-0.01, abs=1e-9)


def test_change_beyond_threshold_but_inside_noise_floor_is_too_noisy(tmp_path):
    base, cand = make_runs(), make_runs()
    for runs, scale in ((base, 1.0), (cand, 0.92)):  # 8% drop, repeats spread ~15%
        for r, jitter in zip(find(runs, "ddp"), (1.0, 1.15, 0.85)):
            r["images_per_s"] = BASE_IPS[("ddp", 2)] * jitter * scale
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand)
    ddp = row(cmp.compare(tmp_path, "A", "B")["throughput"], "ddp")
    assert ddp["floor"] == pytest.approx(2 * 0.15, rel=1e-6)
    assert ddp["verdict"] == "too noisy to tell" and ddp["severity"] == "finding"


def test_single_repeat_never_claims_a_regression(tmp_path):
    base = [r for r in make_runs() if r["repeat"] == 0]
    cand = copy.deepcopy(base)
    find(cand, "ddp")[0]["images_per_s"] *= 0.8
    write_set(tmp_path, "A", base)
    write_set(tmp_path, "B", cand)
    report = cmp.compare(tmp_path, "A", "B")
    assert row(report["throughput"], "ddp")["verdict"] == "too noisy to tell"
    single = row(report["throughput"], "single")
    assert single["verdict"] == "no change" and "spread unknown" in single["note"]


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


def test_new_warning_is_a_finding_even_when_numbers_are_fine(pair):
    _, runs, finish = pair
    new = {**DP_WARNING, "category": "FutureWarning", "message": "torch.foo is deprecated", "count": 1}
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
    assert changes == {"dp-g2-r2": ("missing in candidate", "regression"),
                       "ddp-g4-r0": ("new in candidate", "info")}


def test_diverged_loss_curve_is_flagged_at_its_step(pair):
    _, runs, finish = pair
    find(runs, "ddp", repeat=2)[0]["losses"][5] += 0.01
    find(runs, "dp", repeat=0)[0]["losses"][3] += 1e-4  # inside the tolerance
    report = finish()
    ddp = row(report["loss"], "ddp")
    assert ddp["verdict"] == "diverged" and ddp["max_abs_diff"] == pytest.approx(0.01)
    assert (ddp["at_repeat"], ddp["at_step"]) == (2, 5)
    assert row(report["loss"], "dp")["verdict"] == "matches"


def test_nan_loss_on_one_side_counts_as_diverged(pair):
    _, runs, finish = pair
    find(runs, "single", repeat=0)[0]["losses"][7] = math.nan
    single = row(finish()["loss"], "single")
    assert single["verdict"] == "diverged" and single["note"] == "loss not finite on one side"


def test_accuracy_change_in_percentage_points(pair):
    _, runs, finish = pair
    for r in find(runs, "dp"):
        r["test_acc"] -= 0.02
    assert row(finish()["accuracy"], "dp")["change_pp"] == pytest.approx(-2.0)


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
    assert "timings are not comparable" in report["provenance"]["warning"]
    assert "timings are not comparable" in cmp.render_markdown(report)


def test_missing_baseline_folder_exits_2_naming_it(pair, capsys):
    root, _, finish = pair
    finish()
    assert cmp.main(["--results-dir", str(root), "--baseline", "nope", "--candidate", "B"]) == 2
    err = capsys.readouterr().err
    assert "baseline" in err and str(root / "nope") in err
    assert not R.compare_paths(root, "nope", "B")[1].exists()


def test_missing_table_exits_2_naming_it(pair, capsys):
    root, _, finish = pair
    finish()
    R.table_path(root, "B", "summary").unlink()
    assert cmp.main(["--results-dir", str(root), "--baseline", "A", "--candidate", "B"]) == 2
    assert str(R.table_path(root, "B", "summary")) in capsys.readouterr().err


def test_welch_p_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    import numpy as np

    x, y = np.array([100.0, 103.0, 98.0]), np.array([95.0, 97.0, 99.5, 96.0])
    assert cmp.welch_p(x, y) == pytest.approx(stats.ttest_ind(x, y, equal_var=False).pvalue, rel=1e-9)
    for t, df in ((0.3, 2.0), (2.5, 3.7), (40.0, 4.0)):
        assert cmp.t_two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-9)


def test_markdown_is_a_readable_report(pair):
    _, runs, finish = pair
    for r in find(runs, "ddp"):
        r["images_per_s"] *= 0.8
    md = cmp.render_markdown(json.loads(json.dumps(finish())))  # works on the json twin too
    assert md.startswith("# dpbench compare")
    assert md.index("## Provenance") < md.index("**Verdict: 1 regressions, 0 findings**") < md.index("## Run status")
    assert re.search(r"\| ddp g2 +\| 3/3 +\|", md)


def test_report_names_keep_dotted_version_tags(tmp_path):
    md, js = R.compare_paths(tmp_path, "torch-2.13.0+cpu", "torch-2.14.1+cu130")
    assert md.name == "torch-2.13.0+cpu_vs_torch-2.14.1+cu130.md"
    assert js.name == "torch-2.13.0+cpu_vs_torch-2.14.1+cu130.json"
