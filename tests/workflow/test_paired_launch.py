"""A paired launch end to end on the CPU: two virtual environments' runs made by their own
pythons in the plan's ABBA order (exclusive timing: one at a time), then `compare --paired`.
An A/A (both environments on this torch) must say no change in everything but the timings (a
throughput verdict on a shared CPU is a timing: the GPU benchmark checks those); torch 2.13.0 against this one,
built offline from /opt/wheels, must record each side's own torch, in torchrun's ranks too.

The within-launch throughput test is the stats branch's (analysis.compare.paired); until it is
merged, a stand-in takes its one call."""
from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from fakes import copy_workflow, run_snakemake

from dpbench import compare_cli
from dpbench import results as R

WHEELS = Path("/opt/wheels")
OLD_TORCH = "2.13.0"



def env_python(where: Path) -> str:
    """A venv on the packages of the python running these tests (this torch), whether that is
    a venv or not: a .pth file adds its site-packages after the new venv's own (so a torch
    installed into the new venv wins). `system_site_packages=True` would see the base
    interpreter's packages instead, which in a user's venv has no torch at all. dpbench comes
    from the rule's PYTHONPATH."""
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(where)
    python = where / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    running = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    # site.addsitedir, not a bare path: the .pth files there (editable installs) count too
    line = "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in running)
    Path(own, "_dpbench_test_running_python.pth").write_text(line + "\n")
    return str(python)


def paired_launch(wd: Path, tag: str, base: str, cand: str, *config: str) -> dict:
    """Runs the upgrade experiment's tables for the two environments; returns its plan.json."""
    rs = R.ResultSet(wd / "results", tag)
    targets = [str(p.relative_to(wd)) for p in [*rs.table_paths().values(), rs.provenance_path, rs.plan_path]]
    run_snakemake(wd, "--config", "experiment=upgrade", f"base={base}", f"cand={cand}", f"tag={tag}",
                  "repeats=2", *config, "--", *targets, timeout=900, check=True)
    return json.loads(rs.plan_path.read_text())


def finish_order(wd: Path, tag: str) -> list[str]:
    """The runs in the order they finished (one at a time: the order they started)."""
    paths = list(R.runs_dir(wd / "results", tag).glob(f"*/{R.METRICS}"))
    return [p.parent.name for p in sorted(paths, key=lambda p: p.stat().st_mtime_ns)]


def compare_paired(wd: Path, tag: str) -> dict:
    assert compare_cli.main(["--results-dir", str(wd / "results"), "--paired", tag]) == 0
    return json.loads(R.paired_compare_paths(wd / "results", tag, "base", "cand")[1].read_text())


def findings_beside_throughput(report: dict) -> list[dict]:
    """Rows that count (severity regression or finding) in every aspect but throughput: on a
    CPU shared with other jobs a throughput verdict is a timing, which no test asserts."""
    rows = [*report["status"], *report["memory"], *[r for rs in report["warnings"].values() for r in rs],
            *report["loss"], *report["accuracy"]]
    return [r for r in rows if r["severity"] != "info"]


@pytest.mark.slow
def test_a_paired_a_a_on_the_cpu_runs_abba_and_finds_no_change(tmp_path):
    wd = copy_workflow(tmp_path / "wd")
    base, cand = env_python(tmp_path / "a"), env_python(tmp_path / "b")
    plan = paired_launch(wd, "paired-aa", base, cand, "variants=[single]")
    assert plan["run_order"] == ["single-g1-envbase-r0", "single-g1-envcand-r0",
                                 "single-g1-envcand-r1", "single-g1-envbase-r1"]
    assert finish_order(wd, "paired-aa") == plan["run_order"]
    report = compare_paired(wd, "paired-aa")
    assert findings_beside_throughput(report) == [] and not report["provenance"]["keys"]["torch"]["differs"]
    assert [r["verdict"] for r in report["loss"]] == ["identical"]   # same torch, same seeds, on the CPU
    (row,) = report["throughput"]   # judged by the within-launch test, 2 runs a side
    assert (row["variant"], row["n_baseline"], row["n_candidate"]) == ("single", 2, 2)
    assert row["change"] is not None and report["paired"]["order"] == "ABBA"


def old_torch_wheel() -> Path | None:
    found = sorted(WHEELS.glob(f"torch-{OLD_TORCH}*-cp{sys.version_info.major}{sys.version_info.minor}-*.whl"))
    return found[0] if found else None


@pytest.mark.slow
def test_torch_2_13_against_this_torch_in_one_launch_records_each_sides_torch(tmp_path):
    wheel = old_torch_wheel()
    if wheel is None:
        pytest.skip(f"no torch {OLD_TORCH} wheel for this python in {WHEELS}: the test never downloads one")
    old = env_python(tmp_path / "old")
    # --no-index: from the wheel on disk only; its requirements are this machine's packages
    subprocess.run([old, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS),
                    f"torch=={OLD_TORCH}"], check=True, capture_output=True, timeout=600)
    wd = copy_workflow(tmp_path / "wd")
    plan = paired_launch(wd, "paired-upgrade", old, sys.executable, "variants=[ddp]", "gpus=[2]")
    versions = plan["environment_versions"]
    assert versions["base"].startswith(OLD_TORCH) and not versions["cand"].startswith(OLD_TORCH)
    assert finish_order(wd, "paired-upgrade") == plan["run_order"]
    for rid in plan["run_order"]:   # written by rank 0 under torchrun: the ranks ran the side's torch
        rec = json.loads((R.runs_dir(wd / "results", "paired-upgrade") / rid / R.METRICS).read_text())
        assert rec["status"] == R.STATUS_OK and rec["provenance"]["torch"] == versions[rec["config"]["environment"]]
    report = compare_paired(wd, "paired-upgrade")
    assert report["provenance"]["keys"]["torch"]["differs"]
    assert report["provenance"]["keys"]["torch"]["baseline"] == versions["base"]
    assert [r["variant"] for r in report["throughput"]] == ["ddp"]
