"""A run that collect marked damaged (its steps.csv or metrics.json unreadable) is a broken
input to compare: named as damaged, exit 2, never 1, with --fail-on-regression too; in two
launches and in one paired launch (docs/compare.md)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from fakes import run_module

from dpbench import results

REPO = Path(__file__).resolve().parents[3]
REFERENCE = REPO / "results" / "reference"
BASELINE, CANDIDATE = "cpu_check-torch-2.13.0+cpu", "cpu_check-torch-2.14.1+cu130"
PAIRED = "cpu-paired-213-vs-2141-43b8177"


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m <args>` as that runs it, in this process (fakes.run_module): the command lines'
    start in a process of their own is tested in tests/workflow/test_faults.py."""
    return run_module(*args)


def copy_set(root: Path, tag: str) -> Path:
    shutil.copytree(REFERENCE / tag, root / tag, ignore=shutil.ignore_patterns("figures", "logs", "*.md"))
    return root / tag


def damage_and_collect(root: Path, tag: str, run_id: str) -> None:
    steps = root / tag / "runs" / run_id / "steps.csv"
    if steps.exists():
        text = steps.read_text()
        steps.write_text(text[: len(text) // 2])   # cut short mid-line
    else:   # the older reference kept no curves: one with no header
        steps.write_text("1,2,3\n")
    proc = cli("dpbench.analysis.collect", "--results-dir", str(root), "--tag", tag)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = results.read_table(root, tag, "summary")
    (row,) = summary[summary["run_id"] == run_id].to_dict("records")
    # the failed row compare's loading reads as damaged (by the mark in its reason)
    assert row["status"] == results.STATUS_FAILED and results.DAMAGED_MARK in row["reason"]


def _says_damaged(proc: subprocess.CompletedProcess, run_id: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert run_id in lines[0] and "damaged" in lines[0]


@pytest.fixture(scope="module")
def damaged_candidate(tmp_path_factory) -> Path:
    """Both sets, the candidate's ddp-g1-r0 damaged and collected: made once (collect is a
    process of its own), copied for each test."""
    root = tmp_path_factory.mktemp("damaged")
    for tag in (BASELINE, CANDIDATE):
        copy_set(root, tag)
    damage_and_collect(root, CANDIDATE, "ddp-g1-r0")
    return root


@pytest.mark.parametrize("flags", [[], ["--fail-on-regression"], ["--fail-on", "regressions,new-failures"]])
def test_a_damaged_run_in_the_candidate_is_exit_2(tmp_path, flags, damaged_candidate):
    if flags[-1:] == ["regressions,new-failures"]:
        from dpbench.analysis import compare
        flags = ["--fail-on", ",".join(compare.FAIL_ON)]
    shutil.copytree(damaged_candidate, tmp_path, dirs_exist_ok=True)
    proc = cli("dpbench.compare_cli", "--results-dir", str(tmp_path), "--baseline", BASELINE,
               "--candidate", CANDIDATE, *flags)
    _says_damaged(proc, "ddp-g1-r0")


def test_a_damaged_run_in_a_paired_launch_is_exit_2(tmp_path):
    copy_set(tmp_path, PAIRED)
    damage_and_collect(tmp_path, PAIRED, "ddp-g1-envcand-r1")
    proc = cli("dpbench.compare_cli", "--results-dir", str(tmp_path), "--paired", PAIRED, "--fail-on-regression")
    _says_damaged(proc, "ddp-g1-envcand-r1")
