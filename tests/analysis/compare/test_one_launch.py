"""compare --paired: one paired launch's environments compared within it, on synthetic sets
laid out as collect writes them. The within-launch throughput test is the stats branch's
(analysis.compare.paired); until it is merged these tests put a stand-in in its one call, and
they pass with either."""
from __future__ import annotations

import json

from fakes import make_runs, write_set

from dpbench import compare_cli
from dpbench import results as R
from dpbench.analysis.compare import one_launch
from dpbench.results import identity
from dpbench.report import compare_report

ORDER = [("base", "cand"), ("cand", "base"), ("base", "cand")]   # ABBA over 3 repeats



def write_paired(root, tag="P", edit=None, deterministic=True) -> list[str]:
    """A paired launch of make_runs' cells: every run once per environment, in ABBA order,
    plan.json naming the environments and the order; edit(run) may change cand's runs."""
    runs, order = [], []
    for run in make_runs(deterministic=deterministic):
        for env in ORDER[run["repeat"]]:
            mine = json.loads(json.dumps(run))
            mine["options"] = {"environment": env}
            mine["config"].update(environment=env, options={"environment": env})
            mine["record"]["options"] = {"environment": env}   # the record's options are a mapping
            if env == "cand" and edit:
                edit(mine)
            runs.append(mine)
            order.append(R.run_id(mine["variant"], mine["gpus"], mine["repeat"], mine["options"]))
    write_set(root, tag, runs)
    R.write_json(R.ResultSet(root, tag).plan_path,
                 {"environments": {"base": "/a/bin/python", "cand": "/b/bin/python"}, "run_order": order})
    return order


def test_the_sides_read_as_result_sets_of_the_launchs_cells(tmp_path):
    order = write_paired(tmp_path)
    assert order[:6] == ["single-g1-envbase-r0", "single-g1-envcand-r0", "single-g1-envcand-r1",
                         "single-g1-envbase-r1", "single-g1-envbase-r2", "single-g1-envcand-r2"]
    rs = one_launch.load_paired(tmp_path, "P")
    assert one_launch.environments(rs) == ["base", "cand"]
    cand = one_launch.side(rs, "cand")
    assert sorted(cand["records"])[:3] == ["ddp-g2-r0", "ddp-g2-r1", "ddp-g2-r2"]
    assert set(cand["tables"]["summary"]["options"]) == {""} and len(cand["tables"]["summary"]) == 9
    assert "environment" not in cand["records"]["ddp-g2-r0"].config
    frame = one_launch.samples(rs, "base", "cand")
    assert len(frame) == 18 and set(frame["cell"]) == {("single", 1, ""), ("dp", 2, ""), ("ddp", 2, "")}
    first = frame.sort_values("order").iloc[:2]
    assert list(first["environment"]) == ["base", "cand"] and list(first["order"]) == [0, 1]


def test_a_paired_a_a_finds_no_change_and_identical_deterministic_curves(tmp_path):
    write_paired(tmp_path)
    report = one_launch.compare_paired(tmp_path, "P")
    assert report["verdict"]["regressions"] == 0 and report["verdict"]["findings"] == 0
    assert [r["verdict"] for r in report["throughput"]] == ["no change"] * 3
    assert {r["n_baseline"] for r in report["throughput"]} == {3}
    assert {r["verdict"] for r in report["loss"]} == {"identical"}
    assert {r["change"] for r in report["status"]} <= {"unchanged", "ok"}
    assert report["paired"]["order"] == "ABBAAB" and report["paired"]["tag"] == "P"
    text = compare_report.render_markdown(report)
    assert "interleaved ABBAAB" in text and report["paired"]["design"] in text


def test_a_planted_slowdown_of_one_cell_is_a_regression_and_fails(tmp_path, capsys):
    def slower_ddp(run):
        if run["variant"] == "ddp":
            run["images_per_s"] *= 0.8
    write_paired(tmp_path, edit=slower_ddp)
    code = compare_cli.main(["--results-dir", str(tmp_path), "--paired", "P", "--fail-on-regression"])
    assert code == 1
    md, js = R.paired_compare_paths(tmp_path, "P", "base", "cand")
    report = json.loads(js.read_text())
    verdicts = {r["variant"]: (r["verdict"], r["severity"]) for r in report["throughput"]}
    assert verdicts == {"single": ("no change", "info"), "dp": ("no change", "info"),
                        "ddp": ("slower", "regression")}
    (ddp,) = [r for r in report["throughput"] if r["variant"] == "ddp"]
    assert abs(ddp["change"] + 0.2) < 0.01 and md.exists()


def test_a_set_that_is_no_paired_launch_exits_2_with_one_line(tmp_path, capsys):
    write_set(tmp_path, "A", make_runs())
    assert compare_cli.main(["--results-dir", str(tmp_path), "--paired", "A"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no paired launch" in err and "experiment=upgrade" in err
    assert compare_cli.main(["--results-dir", str(tmp_path), "--paired", "missing"]) == 2


def test_two_launches_without_a_a_data_point_to_the_paired_mode(tmp_path):
    from dpbench.analysis import compare as cmp
    write_set(tmp_path, "A", make_runs())
    write_set(tmp_path, "B", make_runs())
    text = compare_report.render_markdown(cmp.compare(tmp_path, "A", "B"))
    assert "cannot be told from the shift between two launches" in text and "compare --paired" in text


def test_a_launch_with_its_plans_cell_ids_compares_its_sides_by_them(tmp_path):
    """A paired launch whose plan lists identities and whose runs.csv carries them: each side's
    cells are the launch's cell ids less the environment, and the report is the same as by
    (variant, gpus, options)."""
    write_paired(tmp_path / "labels")
    by_label = one_launch.compare_paired(tmp_path / "labels", "P")
    write_paired(tmp_path / "ids")
    summary = R.read_table(tmp_path / "ids", "P", "summary")
    ids = {rid: identity.cell_of_run_id(rid) for rid in summary["run_id"]}
    summary.assign(cell_id=summary["run_id"].map(ids), group="").reindex(columns=R.TABLES["runs"]).to_csv(
        R.table_path(tmp_path / "ids", "P", "runs"), index=False)
    plan = R.ResultSet(tmp_path / "ids", "P").plan_path
    R.write_json(plan, {**R.read_json(plan), "identities": {
        rid: {"run_id": rid, "cell_id": cell, "setup_id": "", "group": ""} for rid, cell in ids.items()}})
    rs = one_launch.load_paired(tmp_path / "ids", "P")
    cand = one_launch.side(rs, "cand")
    assert rs["by_id"] and set(cand["tables"]["summary"]["cell"]) == {"single-g1", "dp-g2", "ddp-g2"}
    assert cand["cells"]["ddp-g2"] == ("ddp", 2, "")
    assert one_launch.compare_paired(tmp_path / "ids", "P") == by_label
