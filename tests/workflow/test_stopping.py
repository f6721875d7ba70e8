"""Stopping a pipeline and resuming it, through a real `snakemake` on a tiny CPU experiment
(docs/stopping.md): SIGINT to Snakemake stops the running training within seconds with a
failed record, on one process and under torchrun; after `kill -9` of Snakemake, the same
command with `--rerun-incomplete` resumes (no LockException)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fakes import copy_workflow, pids_naming, run_snakemake

from dpbench import results
from dpbench.plan import pipeline

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           OMP_NUM_THREADS="1")
ENV.pop("DPBENCH_FAULT", None)
ENV.pop("DPBENCH_OUTLIVE_STARTER", None)
TAIL = 3000
LINUX = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


def long_experiment(wd: Path, tag: str, variant: str, ranks: int, max_steps: int = 100_000) -> str:
    """A CPU plan whose one run trains far longer than any test waits."""
    train = {"dataset": "synthetic", "synthetic_size": 48, "synthetic_test_size": 16, "global_batch": 12,
             "epochs": 10_000, "max_steps": max_steps, "warmup_steps": 1, "workers": 0, "log_every": 1000,
             "eval_each_epoch": False}
    name = f"{tag}.yaml"
    (wd / name).write_text(yaml.safe_dump(dict(
        experiment="smoke", tag=tag, repeats=1, variants=[variant], gpus=[ranks],
        cpu_plan={"repeats": 1, "max_ranks": ranks, "train": train})))
    return name


def start(wd: Path, configfile: str, tag: str) -> tuple[subprocess.Popen, Path]:
    out = wd / f"{tag}.out"
    with open(out, "w") as sink:
        snk = subprocess.Popen([sys.executable, "-m", "snakemake", f"results/{tag}/summary.csv", "--cores", "2",
                                "--configfile", configfile], cwd=wd, env=ENV, stdout=sink,
                               stderr=subprocess.STDOUT, start_new_session=True)
    return snk, out


def wait_training(log: Path, snk: subprocess.Popen, out: Path, seconds: float = 180) -> None:
    """Until the run's log shows training steps (start-up and torchrun's rendezvous done)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and snk.poll() is None:
        if log.exists() and "first step" in log.read_text():
            time.sleep(2)
            return
        time.sleep(0.5)
    raise AssertionError(f"the run never started training:\n{out.read_text()[-TAIL:]}\n"
                         f"{log.read_text()[-TAIL:] if log.exists() else ''}")


def kill_left(snk: subprocess.Popen, marker: str) -> None:
    """Only the processes this test started."""
    if snk.poll() is None:
        os.killpg(snk.pid, signal.SIGKILL)
        snk.wait()
    for pid in pids_naming(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("stopping"))


@LINUX
@pytest.mark.slow
@pytest.mark.parametrize("variant, ranks, how", [
    ("single", 1, "pid"),     # `kill -INT <snakemake>`: Snakemake alone gets it
    ("single", 1, "group"),   # Ctrl-C in a terminal: the whole foreground group gets it
    ("ddp", 2, "pid"),        # under torchrun, 2 gloo ranks
])
def test_sigint_to_snakemake_stops_the_training_within_seconds_with_a_failed_record(workflow, variant, ranks, how):
    tag = f"int-{variant}-{how}-{os.getpid()}"
    snk, out = start(workflow, long_experiment(workflow, tag, variant, ranks), tag)
    run_id = f"{variant}-g{ranks}-r0"
    rs = results.ResultSet(workflow / "results", tag)
    marker = f"results/{tag}/"
    try:
        wait_training(rs.log_path(run_id), snk, out)
        sent = time.monotonic()
        if how == "group":
            os.killpg(snk.pid, signal.SIGINT)
        else:
            snk.send_signal(signal.SIGINT)
        try:
            code = snk.wait(timeout=40)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"Snakemake still runs 40 s after SIGINT:\n{out.read_text()[-TAIL:]}") from None
        took = time.monotonic() - sent
        deadline = time.monotonic() + 15
        while pids_naming(marker) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not pids_naming(marker), "processes of the run outlived Snakemake"
        assert code != 0
        assert took < 30, took
        rec = results.read_metrics(rs.run_dir(run_id))
        assert rec is not None, out.read_text()[-TAIL:]
        assert rec["status"] == results.STATUS_FAILED
        assert "SIGINT" in rec["reason"], rec["reason"]
    finally:
        kill_left(snk, marker)


@LINUX
@pytest.mark.slow
def test_after_kill_9_the_same_command_with_rerun_incomplete_resumes(workflow):
    tag = f"k9-{os.getpid()}"
    name = long_experiment(workflow, tag, "single", 1, max_steps=6)
    # A first, long run to kill: the same tag, another configfile with a long budget.
    long_name = long_experiment(workflow, f"{tag}-long", "single", 1)
    cfg = yaml.safe_load((workflow / long_name).read_text())
    cfg["tag"] = tag
    (workflow / long_name).write_text(yaml.safe_dump(cfg))
    snk, out = start(workflow, long_name, tag)
    rs = results.ResultSet(workflow / "results", tag)
    marker = f"results/{tag}/"
    try:
        wait_training(rs.log_path("single-g1-r0"), snk, out)
        assert list((workflow / ".snakemake" / "locks").glob("*.lock")), "Snakemake holds no lock"
        os.killpg(snk.pid, signal.SIGKILL)   # Snakemake and its job shell, at once
        snk.wait()
        deadline = time.monotonic() + 30
        while pids_naming(marker) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not pids_naming(marker)
        # As the README prints it: the same command, --rerun-incomplete added.
        proc = run_snakemake(workflow, f"results/{tag}/summary.csv", "--configfile", name, "--rerun-incomplete",
                             env=ENV)
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-TAIL:]
        assert "LockException" not in text and "cannot be locked" not in text
        rec = results.read_metrics(rs.run_dir("single-g1-r0"))
        assert rec is not None and rec["status"] == results.STATUS_OK, text[:TAIL]
    finally:
        kill_left(snk, marker)


def test_a_stale_lock_goes_only_when_no_live_pipeline_holds_its_result_sets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (tmp_path / "results" / "a").mkdir(parents=True)
    (tmp_path / "results" / "b").mkdir(parents=True)
    (locks / "0.input.lock").write_text("results/a/runs/x/metrics.json\n")
    (locks / "0.output.lock").write_text("results/a/summary.csv\nresults/a/plan.json\n")
    (locks / "1.output.lock").write_text("results/b/summary.csv\n")
    (locks / "2.output.lock").write_text("elsewhere/file.txt\n")
    # b is held by a live pipeline (another process holds its flock)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open('results/b/.pipeline.lock', os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        removed = pipeline.clear_stale_snakemake_locks("results")
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in removed) == ["0.input.lock", "0.output.lock"]
    assert sorted(p.name for p in locks.iterdir()) == ["1.output.lock", "2.output.lock"]
    # the holder is gone: b's lock is stale now, the foreign one stays
    assert [p.name for p in pipeline.clear_stale_snakemake_locks("results")] == ["1.output.lock"]
    assert [p.name for p in locks.iterdir()] == ["2.output.lock"]
