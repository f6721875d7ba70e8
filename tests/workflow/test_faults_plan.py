"""Issue 28 rows 5, 6, 8, 11 (rest): faults of the plan and of the commands around it, as a new
user met them: two pipelines on one result set, a tag that is a path, a report built from the
default experiment instead of the set's own, sets of two experiments read as regressions."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from fakes import write_fake_run

from dpbench import compare_cli
from dpbench import results as R
from dpbench.analysis import collect
from dpbench.plan import pipeline

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           OMP_NUM_THREADS="1")


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


# == row 5: one pipeline per result set ========================================================

HOLD = ("import sys; from dpbench.plan import pipeline; "
        "pipeline.hold_pipeline_lock(sys.argv[1], 'lock'); print('held', flush=True); sys.stdin.read()")


@pytest.fixture
def held(tmp_path):
    """results/lock/ held by another process (as a running pipeline holds it); yields (set folder, pid)."""
    import subprocess
    import sys
    folder = tmp_path / "results" / "lock"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield folder, proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_a_second_holder_of_a_result_set_is_refused_naming_the_tag_and_pid(held):
    folder, pid = held
    with pytest.raises(pipeline.PipelineBusy) as err:
        pipeline.hold_pipeline_lock(folder, "lock")
    assert (err.value.tag, err.value.holder) == ("lock", str(pid))
    assert "'lock'" in str(err.value) and str(pid) in str(err.value)


def test_the_lock_goes_with_the_process_that_held_it(tmp_path):
    import subprocess
    import sys
    folder = tmp_path / "results" / "lock"
    proc = subprocess.run([sys.executable, "-c", HOLD, str(folder)], input="", capture_output=True, text=True,
                          env=ENV, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert pipeline.hold_pipeline_lock(folder, "lock") == folder / pipeline.PIPELINE_LOCK   # no stale lock


@pytest.mark.parametrize("targets, locks", [((), True), (("all",), True), (("results/x/summary.csv",), True),
                                            (("compare",), False)])
def test_compare_alone_takes_no_lock(targets, locks):
    assert pipeline.needs_pipeline_lock(targets) is locks


TINY_CPU_PLAN = {"repeats": 1, "max_ranks": 1,
                 "train": {"dataset": "synthetic", "synthetic_size": 48, "synthetic_test_size": 16,
                           "global_batch": 12, "epochs": 1, "max_steps": 3, "warmup_steps": 1,
                           "workers": 0, "log_every": 1000}}


@pytest.fixture
def lock_workflow(tmp_path) -> Path:
    """A copy of the workflow with a one-run smoke-like experiment (tag `lock`) on the CPU plan."""
    import yaml
    from fakes import copy_workflow
    wd = copy_workflow(tmp_path / "wf")
    (wd / "lock.yaml").write_text(yaml.safe_dump(dict(experiment="smoke", tag="lock", repeats=1,
                                                      variants=["single"], gpus=[1], cpu_plan=TINY_CPU_PLAN)))
    return wd


def snakemake(wd: Path, *args: str):
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-m", "snakemake", "results/lock/summary.csv", "--cores", "1",
                             *args, "--configfile", "lock.yaml"], cwd=wd, env={**ENV, "CUDA_VISIBLE_DEVICES": ""},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("snakemake_lock", ["raced", "its own"])
def test_two_pipelines_started_together_on_one_tag_train_once(lock_workflow, snakemake_lock):
    # "raced": --nolock stands for Snakemake's own lock letting both through, as it did once in three.
    extra = ("--nolock",) if snakemake_lock == "raced" else ()
    procs = [snakemake(lock_workflow, *extra) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    trained = [out.count("rule train:") for out in outs]
    assert sorted(codes) == [0, 1] and sorted(trained) == [0, 1], "\n====\n".join(o[-3000:] for o in outs)
    loser = outs[codes.index(1)]
    if snakemake_lock == "raced":
        winner = procs[codes.index(0)].pid
        assert re.search(rf"'lock'.*\b{winner}\b", loser), loser[-3000:]   # the tag and the holder's pid


@pytest.mark.slow
def test_a_dry_run_needs_no_lock_and_a_real_run_is_refused(lock_workflow):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_workflow / "results" / "lock")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert proc.stdout.readline().strip() == "held"
        dry = snakemake(lock_workflow, "-n")
        out = dry.communicate(timeout=300)[0]
        assert dry.returncode == 0 and "rule train:" in out, out[-3000:]
        real = snakemake(lock_workflow)
        out = real.communicate(timeout=300)[0]
        assert real.returncode == 1 and f"pid {proc.pid}" in out and "rule train:" not in out, out[-3000:]
        assert not (lock_workflow / "results" / "lock" / "runs").exists()
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


# == row 8: the report of the set it names =====================================================

def planned_set(wd: Path, given: dict) -> dict:
    """results/<tag>/plan.json as the plan rule writes it for `given` (and a Snakefile beside it)."""
    (wd / "Snakefile").touch()
    plan = pipeline.make_plan(pipeline.load_experiment(dict(given), REPO), given)
    path = wd / "results" / plan.tag / "plan.json"
    path.parent.mkdir(parents=True)
    path.write_text(plan.plan_json())
    return json.loads(path.read_text())


def test_plan_json_keeps_the_config_as_given(tmp_path):
    doc = planned_set(tmp_path, {"experiment": "smoke", "tag": "quick", "repeats": "1", "gpus": ["1"]})
    assert doc["given"] == {"experiment": "smoke", "tag": "quick", "repeats": 1, "gpus": [1]}


def test_the_report_command_carries_the_sets_experiment_tag_and_config(tmp_path, monkeypatch, capsys):
    import subprocess

    import yaml

    from dpbench import cli
    planned_set(tmp_path, {"experiment": "smoke", "tag": "quick", "repeats": 1, "gpus_available": 2,
                           "train": {"max_steps": 5}})
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append((cmd, kw)) or subprocess.CompletedProcess(cmd, 0))
    assert cli.main(["report", "quick", "--workflow", str(tmp_path)]) == 0
    ((cmd, kw),) = ran
    assert cmd[1:5] == ["-m", "snakemake", "--report", "results/quick/report.html"] and kw["cwd"] == tmp_path
    config = yaml.safe_load(Path(cmd[cmd.index("--configfile") + 1]).read_text())
    assert (config["experiment"], config["tag"], config["results_dir"]) == ("smoke", "quick", "results")
    assert config["repeats"] == 1 and config["train"] == {"max_steps": 5} and config["gpus_available"] == 2


def test_a_default_tag_is_pinned_to_the_one_the_set_was_planned_with(tmp_path, monkeypatch):
    import subprocess

    import yaml

    from dpbench import cli
    doc = planned_set(tmp_path, {"experiment": "smoke", "tag": "", "gpus_available": 0})
    doc.update(tag="smoke-torch-2.13.0", given={"experiment": "smoke"})   # made under an older torch
    (tmp_path / "results" / "smoke-torch-2.13.0").mkdir()
    (tmp_path / "results" / "smoke-torch-2.13.0" / "plan.json").write_text(json.dumps(doc))
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert cli.main(["report", "smoke-torch-2.13.0", "--workflow", str(tmp_path)]) == 0
    config = yaml.safe_load(Path(ran[0][ran[0].index("--configfile") + 1]).read_text())
    assert config["tag"] == "smoke-torch-2.13.0" and config["experiment"] == "smoke"


@pytest.mark.parametrize("tag, fragment", [("nothere", "plan.json: not found"), ("a/b", "config key tag")])
def test_a_report_of_no_set_is_exit_2_with_one_line(tmp_path, tag, fragment, capsys):
    from dpbench import cli
    (tmp_path / "Snakefile").touch()
    assert cli.main(["report", tag, "--workflow", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_the_report_of_a_set_made_with_other_config_shows_that_set(lock_workflow):
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "lock.yaml",
                          "--config", "tag=other"], cwd=lock_workflow, env={**ENV, "CUDA_VISIBLE_DEVICES": ""},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "dpbench.cli", "report", "other", "--workflow", str(lock_workflow)],
                            env=ENV, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    html = (lock_workflow / "results" / "other" / "report.html").read_text(errors="replace")
    assert "results/other/figures" in html and not re.search(r"results/(?!other/)[\w.+-]+/figures", html)


# == row 12: one install order =================================================================

def test_one_install_order_the_pair_first_then_the_readmes_install_lines():
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    installs = [i for i, b in enumerate(blocks) if 'pip install -e ".[' in b]
    pairs = [i for i, b in enumerate(blocks) if "torchvision==" in b]
    assert installs == [0] and pairs, (installs, pairs)   # dpbench is installed by the set-up lines only
    intro = " ".join(readme.split("```bash\n" + blocks[pairs[0]])[0].strip().rsplit("\n\n", 1)[1].split())
    assert "pair first" in intro and "lines above" in intro and "then dpbench" not in intro
    # Wherever a command installs the pair and dpbench, the pair comes first (docs, the conda env).
    for doc in [*sorted((REPO / "docs").glob("*.md")), REPO / "envs" / "dpbench.yaml"]:
        text = doc.read_text()
        if "torchvision" in text and ("pip install -e" in text or "- -e" in text):
            dpbench = min(i for i in (text.find("pip install -e"), text.find("- -e")) if i >= 0)
            assert text.find("torchvision") < dpbench, doc.name
