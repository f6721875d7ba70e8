"""Issue 28 rows 5, 6, 8, 11 (rest): faults of the plan and of the commands around it, as a new
user met them: two pipelines on one result set, a tag that is a path, a report built from the
default experiment instead of the set's own, sets of two experiments read as regressions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import write_fake_run

from dpbench import compare_cli
from dpbench import results as R
from dpbench.analysis import collect
from dpbench.plan import pipeline

REPO = Path(__file__).resolve().parents[1]


def write_set(root: Path, tag: str, runs: list[dict]) -> None:
    for run in runs:
        write_fake_run(R.runs_dir(root, tag), **{"device_type": "cpu", **run})
    assert collect.main(["--results-dir", str(root), "--tag", tag]) == 0


def fail_on_regression(root: Path, baseline: str, candidate: str) -> tuple[int, dict]:
    code = compare_cli.main(["--results-dir", str(root), "--baseline", baseline, "--candidate", candidate,
                             "--fail-on-regression"])
    return code, json.loads(R.compare_paths(root, baseline, candidate)[1].read_text())


# == row 11 (rest): cells only one experiment has are not runs gone missing ====================

SINGLE = [dict(variant="single", images_per_s=v, repeat=r) for r, v in enumerate((990.0, 1010.0))]
DDP2 = [dict(variant="ddp", gpus=2, images_per_s=v, repeat=r) for r, v in enumerate((1700.0, 1720.0))]


def test_cells_only_the_other_experiment_has_are_not_regressions(tmp_path, capsys):
    write_set(tmp_path, "scaling", SINGLE + DDP2)
    write_set(tmp_path, "smoke", SINGLE + [dict(variant="dp", gpus=2, images_per_s=1500.0)])
    code, report = fail_on_regression(tmp_path, "scaling", "smoke")
    assert report["sets"]["experiments"]["differ"]
    status = {r["run_id"]: (r["change"], r["severity"]) for r in report["status"]}
    assert status == {"ddp-g2-r0": ("not in the other experiment", "info"),
                      "ddp-g2-r1": ("not in the other experiment", "info"),
                      "dp-g2-r0": ("not in the other experiment", "info")}
    assert report["verdict"]["regressions"] == 0 and code == 0


def test_a_run_missing_in_the_same_experiment_is_still_a_regression(tmp_path, capsys):
    write_set(tmp_path, "a", SINGLE + DDP2)
    write_set(tmp_path, "b", SINGLE + DDP2[:1])   # ddp g2's second repeat went missing
    code, report = fail_on_regression(tmp_path, "a", "b")
    assert not report["sets"]["experiments"]["differ"]
    status = {r["run_id"]: (r["change"], r["severity"]) for r in report["status"]}
    assert status == {"ddp-g2-r1": ("missing in candidate", "regression")}
    assert code == 1


# == row 6: a tag is a name, not a path ========================================================

@pytest.mark.parametrize("tag", ["a/b", "a\\b", "..", "../up", "a..b/..", ".hidden", "."])
def test_a_tag_that_is_a_path_is_refused_naming_the_key(tag):
    with pytest.raises(pipeline.ConfigError) as err:
        pipeline.load_experiment({"experiment": "smoke", "tag": tag}, REPO)
    assert "tag" in str(err.value)


@pytest.mark.parametrize("tag", ["quick", "torch-2.14.1+cu130", "smoke_2026-12-02", "a.b", ""])
def test_names_are_accepted_as_tags(tag):
    assert pipeline.load_experiment({"experiment": "smoke", "tag": tag}, REPO)["tag"] == tag


def test_a_tag_the_schema_alone_is_asked_about_is_refused_too():
    """Snakemake's own validate(), or any jsonschema reader, refuses the same tags."""
    import jsonschema
    from dpbench.plan.config import schema
    validator = jsonschema.Draft202012Validator(schema()["properties"]["tag"])
    assert not validator.is_valid("a/b") and not validator.is_valid("..") and validator.is_valid("quick")


def test_compare_refuses_a_baseline_that_is_a_path():
    config = pipeline.load_experiment({"experiment": "smoke", "baseline": "../etc"}, REPO)
    with pytest.raises(pipeline.ConfigError, match="baseline"):
        pipeline.compare_args(config, "quick")
