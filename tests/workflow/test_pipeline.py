"""The pipeline end to end on the CPU plan, in a temporary folder, through the real Snakemake
(slow: `python -m pytest -m slow`), and the checks that a bad config stops before training."""
import threading
import time
from pathlib import Path

import pytest
from fakes import copy_workflow, run_snakemake

from dpbench import results
from dpbench.host import gpu_lease
from dpbench.plan.matrix import Plan

PNG = b"\x89PNG\r\n\x1a\n"
# Every Snakemake call here may take this long: the first one trains smoke's whole CPU plan.
TIMEOUT = 900


@pytest.fixture(scope="module")
def workflow(tmp_path_factory):
    """A copy of the workflow with the smoke experiment run once (the CPU plan)."""
    wd = copy_workflow(tmp_path_factory.mktemp("wf"))
    first = run_snakemake(wd, "--config", "experiment=smoke", timeout=TIMEOUT, check=True)
    return wd, first


@pytest.fixture(scope="module")
def dry(tmp_path_factory) -> Path:
    """A copy of the workflow for dry runs (nothing trains)."""
    return copy_workflow(tmp_path_factory.mktemp("dry"))


@pytest.mark.slow
def test_cpu_plan_says_what_it_skips_and_writes_every_table_and_figure(workflow):
    wd, first = workflow
    assert "no CUDA device visible: running the CPU plan" in first.stderr
    base = wd / "results" / "smoke"
    import pandas as pd
    summary = pd.read_csv(base / "summary.csv", keep_default_na=False)
    assert list(summary.columns) == results.SUMMARY_COLUMNS
    by_status = summary.groupby("status")["variant"].apply(set).to_dict()
    assert by_status["ok"] == {"single", "ddp"}
    assert by_status["skipped"] == {"dp", "dp_mean", "dp_sum"}
    assert (summary[summary.status == "skipped"].reason.str.contains("needs CUDA")).all()
    assert (summary[summary.status == "ok"].images_per_s.astype(float) > 0).all()
    for name in results.TABLES:
        assert (base / f"{name}.csv").read_text().splitlines()[0].split(",") == results.TABLES[name]
    steps = pd.read_csv(base / "steps.csv")
    assert set(steps.run_id) == {"single-g1-r0", "ddp-g1-r0", "ddp-g2-r0"}
    for fig in results.FIGURE_NAMES:
        assert (base / "figures" / f"{fig}.png").read_bytes()[:8] == PNG
    text = (base / "summary.md").read_text()   # its words: the summary.md snapshot
    assert text.startswith("# dpbench results: smoke\n")
    assert all(reason in text for reason in set(summary[summary.status == "skipped"].reason))
    prov = results.read_json(base / "provenance.json")
    assert prov["tag"] == "smoke" and prov["torch"]


@pytest.mark.slow
def test_a_second_run_has_nothing_to_do(workflow):
    wd, _ = workflow
    again = run_snakemake(wd, "--config", "experiment=smoke", timeout=TIMEOUT, check=True)
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.slow
def test_one_run_reruns_alone_as_a_target(workflow):
    wd, _ = workflow
    target = "results/smoke/runs/single-g1-r0/metrics.json"
    before = (wd / target).stat().st_mtime
    other = (wd / "results/smoke/runs/ddp-g2-r0/metrics.json").stat().st_mtime
    out = run_snakemake(wd, target, "--forcerun", "train", "--config", "experiment=smoke",
                        timeout=TIMEOUT, check=True)
    assert "1 of 1 steps" in out.stdout + out.stderr
    assert (wd / target).stat().st_mtime > before
    assert (wd / "results/smoke/runs/ddp-g2-r0/metrics.json").stat().st_mtime == other


@pytest.mark.slow
def test_changing_one_variants_options_runs_only_its_runs(workflow):
    wd, _ = workflow
    (wd / "ddp_lr.yaml").write_text(
        "matrix:\n"
        "  - {name: smoke, variants: [single, dp, dp_mean, dp_sum]}\n"
        "  - {name: ddp_lr, variants: [ddp], options: {lr: 0.05}}\n")
    dry = run_snakemake(wd, "-n", "--configfile", "ddp_lr.yaml", "--config", "experiment=smoke",
                        timeout=TIMEOUT, check=True)
    planned = {line.split("/runs/")[1].split("/")[0] for line in dry.stdout.splitlines()
               if "output:" in line and "/runs/" in line}
    assert planned == {"ddp-g1-lr0p05-r0", "ddp-g2-lr0p05-r0"}


@pytest.mark.slow
def test_the_report_renders(workflow):
    wd, _ = workflow
    run_snakemake(wd, "--report", "results/smoke/report.html", "--config", "experiment=smoke",
                  timeout=TIMEOUT, check=True)
    assert (wd / "results/smoke/report.html").stat().st_size > 10_000


@pytest.mark.slow
def test_lint_passes(workflow):
    wd, _ = workflow
    out = run_snakemake(wd, "--lint", "--config", "experiment=smoke", timeout=TIMEOUT)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("override, expected", [
    (["repeat=3"], "repeat"),                                   # unknown key (a typo of repeats)
    (["train={'precision': 'fp8'}"], "fp8"),                    # a bad value
    (["matrix=[{'name': 'x', 'variants': ['dp'], 'options': {'batchnorm': 'sync'}}]"], "batchnorm"),
])
def test_bad_config_stops_before_training_and_names_the_key(dry, override, expected):
    out = run_snakemake(dry, "-n", "--config", "experiment=smoke", *override, timeout=TIMEOUT)
    assert out.returncode != 0
    assert expected in out.stdout + out.stderr
    assert "rule train" not in out.stdout


def test_compare_without_a_baseline_says_how(dry):
    out = run_snakemake(dry, "compare", "--config", "experiment=smoke", timeout=TIMEOUT)
    assert out.returncode != 0 and "baseline=<tag>" in out.stdout + out.stderr


def _plan(visible, **over):
    cfg = {"experiment": "t", "tag": "t", "results_dir": "results", "variants": ["single", "dp", "ddp"],
           "gpus": [1, 2, 4], "repeats": 2, "exclusive_timing": False, "train": {},
           "matrix": [{"name": "m"}], "probes": [],
           "cpu_plan": {"repeats": 1, "max_ranks": 2, "train": {"dataset": "synthetic", "max_steps": 2}}}
    cfg.update(over)
    return Plan(cfg, visible)


def test_plan_expands_the_matrix_and_sizes_gpu_jobs():
    plan = _plan(visible=2)
    assert len(plan.runs) == 2 + 3 * 2 * 2          # single once per repeat; dp and ddp on 3 counts
    assert plan.gpus_for("ddp-g2-r1") == 2 and plan.gpus_for("ddp-g4-r0") == 0   # 4 > 2: skipped
    assert {rc.gpus for rc in plan.runs.values() if plan.skipped(rc)} == {4} and "[4]" in plan.banner()
    assert _plan(visible=2, exclusive_timing=True).gpus_for("dp-g1-r0") == 2
    cpu = _plan(visible=0)
    assert len(cpu.runs) == 1 + 3 * 2 and cpu.runs["ddp-g2-r0"].dataset == "synthetic"
    assert cpu.runs["ddp-g4-r0"].max_cpu_ranks == 2
    with pytest.raises(ValueError, match="'ddp-g8-r0'"):   # the run id asked for
        plan.run_json("ddp-g8-r0")


def test_leases_give_jobs_disjoint_gpus_and_wait_all_or_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with gpu_lease.lease(1, tmp_path) as a, gpu_lease.lease(1, tmp_path) as b:
        assert {a[0], b[0]} == {"3", "5"}
    for exclusive in (False, True):
        got = []

        def take():
            with gpu_lease.lease(2 if not exclusive else 1, tmp_path, exclusive=exclusive,
                                 poll_s=0.05, announce=lambda m: None) as ids:
                got.append(ids)

        with gpu_lease.lease(1, tmp_path) as held:
            t = threading.Thread(target=take)
            t.start()
            time.sleep(0.3)
            assert got == []                    # waits while one GPU is held, holding none
            with gpu_lease.lease(1, tmp_path, poll_s=0.05) as other:
                assert other and other != held  # ...so the other GPU is still free
        t.join(timeout=5)
        assert len(got) == 1 and len(got[0]) == (1 if exclusive else 2)
