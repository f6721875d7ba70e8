"""Faults and bad input, end to end through the real command lines: every failure names its
cause and the way out, and a crash never reads as a finding.

Each case plants one fault (a damaged file, a wrong install, a mistyped option, a killed
pipeline) and runs what a user runs: `python -m dpbench.run.launch`, `dpbench.analysis.collect`,
`dpbench.compare_cli`, `dpbench.run.cifar_pack`, and Snakemake (dry runs, and tiny synthetic runs).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, write_official_cifar
from fakes import copy_workflow, pids_naming, run_module, run_snakemake
from run.test_cifar_pack import make_pack

from dpbench import results
from dpbench.run import datasets

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
ENV = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           OMP_NUM_THREADS="1")
ENV.pop("DPBENCH_FAULT", None)
TAIL = 3000


def cli(module: str, *args: str, cwd: Path | None = None, env: dict | None = None,
        timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd or REPO, env=env or ENV,
                          capture_output=True, text=True, timeout=timeout)


def train(out: Path, env: dict | None = None, **overrides) -> tuple[subprocess.CompletedProcess, dict]:
    """One run through `python -m dpbench.run.launch`; its process and its metrics.json."""
    cfg = dict(TINY, max_steps=2, eval_each_epoch=False)
    cfg.update(overrides)
    proc = cli("dpbench.run.launch", "--config", json.dumps(cfg), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stdout[-TAIL:] + proc.stderr[-TAIL:]
    return proc, results.read_json(out / results.METRICS)


def first_line(reason: str) -> str:
    return reason.strip().splitlines()[0] if reason.strip() else ""


def says_nothing_outside_the_repo(text: str) -> None:
    """No tool or data file of the project's shared folder (which a clone does not have)."""
    for name in ("shared/tools", "shared/data", "../shared", "cifar10_from_jpeg", "cifar10-jpeg.npz"):
        assert name not in text, f"{name!r} named in: {text[:2000]}"


# -- the workflow copy (Snakemake runs in a temporary folder) --------------------------------

@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("wf"))


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


# A tiny CPU plan: what the pipeline tests may run for real on 2 shared cores.
TINY_CPU_PLAN = {"repeats": 1, "max_ranks": 1,
                 "train": {"dataset": "synthetic", "synthetic_size": 48, "synthetic_test_size": 16,
                           "global_batch": 12, "epochs": 1, "max_steps": 3, "warmup_steps": 1,
                           "workers": 0, "log_every": 1000}}


def write_config(wd: Path, name: str, **keys) -> str:
    import yaml
    (wd / name).write_text(yaml.safe_dump(keys))
    return name


# == item: CIFAR-10 files that are damaged or missing ========================================

def cifar_run(tmp_path: Path, env: dict | None = None, **over) -> tuple[subprocess.CompletedProcess, dict]:
    over = dict(dict(dataset="cifar10", data_root=str(tmp_path / "data"), download=False), **over)
    return train(tmp_path / "run", env=env, **over)


@pytest.mark.parametrize("name, damage", [
    ("data_batch_1", "truncated"), ("data_batch_3", "garbage"), ("test_batch", "truncated")])
@pytest.mark.slow
def test_a_damaged_cifar_file_gives_a_failed_record_naming_it_and_the_way_out(tmp_path, name, damage):
    folder = write_official_cifar(tmp_path / "data")
    path = folder / name
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    else:
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    proc, rec = cifar_run(tmp_path)
    assert rec["status"] == "failed"
    reason = rec["reason"]
    assert str(path) in reason and "damaged" in reason
    assert datasets.ARCHIVE in reason and "dpbench.run.cifar_pack" in reason
    says_nothing_outside_the_repo(reason)
    assert str(path) in proc.stdout + proc.stderr          # the log names it too


@pytest.mark.slow
def test_a_missing_test_batch_is_named_not_the_folder(tmp_path):
    folder = write_official_cifar(tmp_path / "data")
    (folder / "test_batch").unlink()
    _, rec = cifar_run(tmp_path)
    assert rec["status"] == "failed"
    reason = rec["reason"]
    assert str(folder) in reason and "test_batch" in reason
    assert not any(name in reason for name in datasets.TRAIN_FILES)   # the missing file, not the folder
    assert "dpbench.run.cifar_pack" in reason
    says_nothing_outside_the_repo(rec["reason"])


@pytest.mark.slow
def test_no_cifar_at_all_names_the_folder_and_only_in_repo_tools(tmp_path):
    _, rec = cifar_run(tmp_path)
    assert rec["status"] == "failed"
    assert str(tmp_path / "data" / datasets.CIFAR_FOLDER) in rec["reason"]
    assert "dpbench.run.cifar_pack" in rec["reason"] and "synthetic" in rec["reason"]
    says_nothing_outside_the_repo(rec["reason"])


# == item: the offline CIFAR-10 path uses only this repository's tools ======================

@pytest.mark.slow
def test_offline_cifar_rebuilt_by_the_in_repo_converter_trains(tmp_path):
    make_pack(tmp_path / "pack.npz", per_split=(40, 20))
    conv = cli("dpbench.run.cifar_pack", str(tmp_path / "pack.npz"), str(tmp_path / "data"))
    assert conv.returncode == 0, conv.stderr
    assert "cifar-10-batches-py" in conv.stdout
    _, rec = cifar_run(tmp_path, global_batch=8, eval_each_epoch=True)
    assert rec["status"] == "ok", rec["reason"]
    dataset = rec["provenance"]["dataset"]
    assert dataset["name"] == "cifar10" and dataset["checksum"] == "mismatch"
    assert dataset["train_size"] == 40 and dataset["test_size"] == 20


def test_the_readme_names_only_in_repo_tools_for_offline_cifar():
    readme = (REPO / "README.md").read_text()
    says_nothing_outside_the_repo(readme)
    section = readme.split("### CIFAR-10 on an offline machine", 1)[1].split("\n## ", 1)[0]
    assert "python -m dpbench.run.cifar_pack" in section
    assert (SRC / "dpbench" / "run" / "cifar_pack.py").exists()


def test_no_error_message_in_the_package_names_a_file_outside_it():
    for path in (SRC / "dpbench").rglob("*.py"):
        says_nothing_outside_the_repo(path.read_text())


# == item: torchvision built for another torch ==============================================

@pytest.fixture
def broken_torchvision(tmp_path) -> dict:
    """An environment whose torchvision fails to import as a wheel for another torch does."""
    pkg = tmp_path / "shadow" / "torchvision"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    return dict(ENV, PYTHONPATH=f"{pkg.parent}{os.pathsep}{ENV['PYTHONPATH']}")


def _says_mismatch(reason: str) -> None:
    from importlib import metadata

    import torch
    assert "\n" not in reason
    assert metadata.version("torchvision") in reason and torch.__version__ in reason
    assert "torchvision==" in reason   # the matching pair to install


@pytest.mark.slow
def test_a_mismatched_torchvision_fails_the_torch_feed_with_one_clear_line(tmp_path, broken_torchvision):
    _, rec = train(tmp_path / "run", env=broken_torchvision, feed="torch", workers=0)
    assert rec["status"] == "failed"
    _says_mismatch(rec["reason"])


@pytest.mark.slow
def test_a_mismatched_torchvision_is_named_when_cifar_must_be_downloaded(tmp_path, broken_torchvision):
    _, rec = cifar_run(tmp_path, env=broken_torchvision, download=True)
    assert rec["status"] == "failed"
    _says_mismatch(rec["reason"])
    assert datasets.CIFAR_FOLDER not in rec["reason"]   # the mismatch, not dressed as a download failure


def test_the_readme_pins_torch_and_torchvision_as_a_pair():
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set up and run", 1)[1].split("\n### ", 1)[0]
    assert "torchvision==" in setup and "torch==" in setup
    # The test commands stay the ones CI runs.
    ci = (REPO / ".ci" / "run").read_text()
    for command in ('pip install -e ".[test]"', "python -m pytest"):
        assert command in ci and command in setup


# == item: result files are readable by the group ===========================================

def _umask(mask):
    return lambda: os.umask(mask)


def _group_readable(root: Path) -> None:
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    for p in files:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode & 0o044 == 0o044, f"{p} is {oct(mode)}"


@pytest.fixture
def fake_results(tmp_path) -> Path:
    """Two run records as the engine writes them (tests/fakes.py), not yet collected."""
    from fakes import write_fake_run
    root = tmp_path / "results"
    for repeat in (0, 1):
        write_fake_run(results.runs_dir(root, "t"), variant="single", repeat=repeat)
    return root


def collect(root: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpbench.analysis.collect", "--results-dir", str(root),
                           "--tag", "t"], env=ENV, capture_output=True, text=True, timeout=300, **kw)


def test_collected_tables_are_readable_by_the_group(fake_results):
    proc = collect(fake_results, preexec_fn=_umask(0o022))
    assert proc.returncode == 0, proc.stderr[-TAIL:]
    assert results.table_path(fake_results, "t", "summary").exists()
    _group_readable(fake_results)


@pytest.mark.slow
def test_a_runs_files_are_readable_by_the_group(tmp_path):
    out = tmp_path / "run"
    cfg = dict(TINY, max_steps=2, eval_each_epoch=False)
    proc = subprocess.run([sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg),
                           "--out", str(out)], env=ENV, capture_output=True, text=True,
                          preexec_fn=_umask(0o022), timeout=300)
    assert proc.returncode == 0, proc.stderr[-TAIL:]
    assert {"metrics.json", "steps.csv"} <= {p.name for p in out.iterdir()}
    _group_readable(out)


def test_a_strict_umask_is_respected(tmp_path):
    code = ("import sys; from dpbench import results; "
            "results.write_json(sys.argv[1], {'a': 1})")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.json")], env=ENV, check=True,
                   preexec_fn=_umask(0o077))
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o600


# == item: a damaged run record (collect) ===================================================

@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_run_record_is_a_failed_row_naming_the_file(fake_results, damage):
    bad = results.runs_dir(fake_results, "t") / "single-g1-r1" / results.METRICS
    text = bad.read_text()
    bad.write_text({"truncated": text[: len(text) // 2], "garbage": "\x00\x17 not json", "empty": ""}[damage])
    # the command line in this process: its start in a process of its own is the group test's above
    proc = run_module("dpbench.analysis.collect", "--results-dir", str(fake_results), "--tag", "t")
    assert proc.returncode == 0, proc.stderr[-TAIL:]
    assert "Traceback" not in proc.stderr
    import pandas as pd
    summary = pd.read_csv(results.table_path(fake_results, "t", "summary"), keep_default_na=False)
    by_run = summary.set_index("run_id")
    assert by_run.loc["single-g1-r0", "status"] == "ok"          # the rest is collected
    assert by_run.loc["single-g1-r1", "status"] == "failed"
    assert "single-g1-r1/metrics.json" in by_run.loc["single-g1-r1", "reason"]


# == item: compare on damaged input exits 2 with one line, never 1 ===========================

BASELINE, CANDIDATE = "cpu_check-torch-2.13.0+cpu", "cpu_check-torch-2.14.1+cu130"


@pytest.fixture
def two_tags(tmp_path) -> Path:
    """The committed cpu_check reference tables of two torch versions, in a scratch folder."""
    root = tmp_path / "results"
    for tag in (BASELINE, CANDIDATE):
        (root / tag).mkdir(parents=True)
        for f in (REPO / "results" / "reference" / tag).iterdir():
            if f.is_file() and f.suffix in (".csv", ".json"):
                shutil.copy(f, root / tag / f.name)
    return root


def compare(root: Path, *extra: str, in_process: bool = False) -> subprocess.CompletedProcess:
    """dpbench.compare_cli on the two tags, in a process of its own or (in_process) as
    `python -m` runs it in this one."""
    args = ("--results-dir", str(root), "--baseline", BASELINE, "--candidate", CANDIDATE, "--fail-on-regression",
            *extra)
    return run_module("dpbench.compare_cli", *args) if in_process else cli("dpbench.compare_cli", *args)


def test_compare_of_intact_tables_exits_0_or_1(two_tags):
    proc = compare(two_tags)
    assert proc.returncode in (0, 1), output(proc)[-TAIL:]


def _damage_summary(root: Path, how: str) -> tuple[Path, str]:
    import pandas as pd
    path = root / CANDIDATE / "summary.csv"
    if how == "missing column":
        pd.read_csv(path).drop(columns=["images_per_s"]).to_csv(path, index=False)
        return path, "images_per_s"
    if how == "empty":
        path.write_text("")
        return path, ""
    if how == "non-numeric":
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
        table.loc[0, "images_per_s"] = "fast"
        table.to_csv(path, index=False)
        return path, "images_per_s"
    path = root / CANDIDATE / "provenance.json"
    path.write_text("{garbage")
    return path, ""


@pytest.mark.parametrize("how", ["missing column", "empty", "non-numeric", "garbage provenance"])
def test_compare_on_damaged_input_exits_2_with_one_line(two_tags, how):
    path, column = _damage_summary(two_tags, how)
    proc = compare(two_tags, in_process=True)   # its start in a process: the intact case's test above
    assert proc.returncode == 2, output(proc)[-TAIL:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-TAIL:]
    assert str(path) in lines[0] and column in lines[0]


# == items: command-line config, typos, the CPU plan (Snakemake dry runs) ===================

@pytest.mark.parametrize("override", [
    ["repeats=1", "gpus=[1,2]", "tag=quick"],            # the README's own example
    ["gpus=[8]"],                                        # more than visible: skipped records
    ["train={max_steps: 3}"],
    ["train={dataset: synthetic, max_steps: 3}"],
])
def test_command_line_lists_and_numbers_are_accepted(workflow, override):
    proc = run_snakemake(workflow, "-n", "--config", "experiment=smoke", *override, env=ENV)
    assert proc.returncode == 0, output(proc)[-TAIL:]
    assert "rule train" in proc.stdout or "train" in proc.stdout


def test_zero_gpus_is_rejected_naming_the_key(workflow):
    proc = run_snakemake(workflow, "-n", "--config", "experiment=smoke", "gpus=[0]", env=ENV)
    assert proc.returncode != 0
    text = output(proc)
    assert "gpus" in text and "is not of type" not in text and "Traceback" not in text


def test_the_readme_quotes_nested_config_values():
    # Snakemake parses --config before dpbench sees anything: an unquoted value with a space
    # (train={dataset: synthetic}) is split by the shell and ends in Snakemake's own traceback.
    # So every such example is quoted, and the quoted form is what the dry runs above use.
    import re
    readme = (REPO / "README.md").read_text()
    for m in re.finditer(r"(\S?)\w+=\{([^}]*)\}", readme):
        if " " in m.group(2):
            assert m.group(1) in ("'", '"'), f"unquoted: {m.group(0)}"


def test_a_mistyped_top_level_key_is_named_first_and_short(workflow):
    proc = run_snakemake(workflow, "-n", "--config", "experiment=smoke", "repets=1", env=ENV)
    assert proc.returncode != 0
    lines = [line for line in output(proc).splitlines() if line.strip()]
    named = [i for i, line in enumerate(lines) if "repets" in line]
    assert named and named[0] <= 3, "\n".join(lines[:40])
    assert "repeats" in lines[named[0]]                     # the closest known key
    # Not after (or before) a dump of the schema and the config.
    assert len(lines) <= 25, f"{len(lines)} lines:\n" + "\n".join(lines[:40])


def _train_configs(dry_run_output: str) -> list[dict]:
    out = []
    for line in dry_run_output.splitlines():
        if ("-m dpbench.run.engine" in line or "-m dpbench.run.launch" in line) and "--config '" in line:
            out.append(json.loads(line.split("--config '", 1)[1].split("'", 1)[0]))
    return out


def test_the_cpu_plan_honours_an_explicit_dataset_with_an_eval_budget(workflow):
    proc = run_snakemake(workflow, "-n", "-p", "--config", "experiment=smoke", "train={dataset: cifar10}",
                         env=ENV)
    assert proc.returncode == 0, output(proc)[-TAIL:]
    configs = _train_configs(proc.stdout)
    assert configs and all(c["dataset"] == "cifar10" for c in configs)
    assert all(c["eval_samples"] is not None and c["eval_samples"] <= 1000 for c in configs)


# == items: the CPU plan in a tiny real pipeline: what it replaced, timed runs one at a time ===

@pytest.fixture(scope="module")
def cpu_pipeline(workflow) -> tuple[Path, subprocess.CompletedProcess]:
    """smoke's matrix on the CPU plan, tiny: single and ddp on 1 and 2 gloo ranks."""
    name = write_config(workflow, "serial.yaml", experiment="smoke", tag="serial", repeats=1,
                        variants=["single", "ddp"], gpus=[1, 2], cpu_plan=dict(TINY_CPU_PLAN, max_ranks=2))
    proc = run_snakemake(workflow, "results/serial/summary.csv", "--configfile", name, cores=2, env=ENV)
    assert proc.returncode == 0, output(proc)[-TAIL:]
    return workflow / "results" / "serial", proc


@pytest.mark.slow
def test_the_cpu_plan_says_what_it_replaced(cpu_pipeline):
    # smoke asks for global_batch 128, max_steps 12 on 2048 images; the CPU plan runs its own.
    _, proc = cpu_pipeline
    banner = [l for l in output(proc).splitlines() if "CPU plan" in l]
    assert banner, output(proc)[-TAIL:]
    text = "\n".join(banner)
    assert any(key in text for key in ("global_batch", "max_steps", "synthetic_size")), text


@pytest.mark.slow
def test_timed_cpu_runs_do_not_overlap(cpu_pipeline):
    base, _ = cpu_pipeline
    spans = []
    for rec, folder in results.iter_runs(base / "runs"):
        if rec["status"] == "ok":
            end = (folder / results.METRICS).stat().st_mtime
            spans.append((end - rec["wall_s"], end, rec["run_id"]))
    assert len(spans) >= 2
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        assert start >= end - 0.05, f"{a} and {b} ran at the same time"


# == item: a killed pipeline takes its training processes with it ===========================

def _train_pids(marker: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(l for l in (proc / "status").read_text().splitlines() if l.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if ("dpbench.run.engine" in cmd or "dpbench.run.launch" in cmd) and marker in cmd and " Z " not in f" {state.split()[1]} ":
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads processes from /proc")
def test_killing_snakemake_stops_its_training_processes(workflow):
    long_plan = dict(TINY_CPU_PLAN, train=dict(TINY_CPU_PLAN["train"], max_steps=100_000))
    tag = f"killed{os.getpid()}"   # the run's paths in its command line are relative
    name = write_config(workflow, "long.yaml", experiment="smoke", tag=tag, repeats=1,
                        variants=["single"], gpus=[1], cpu_plan=long_plan)
    marker = f"results/{tag}/"
    log = workflow / f"{tag}.out"
    with open(log, "w") as sink:
        snk = subprocess.Popen([sys.executable, "-m", "snakemake", f"results/{tag}/summary.csv",
                                "--cores", "1", "--configfile", name], cwd=workflow, env=ENV,
                               stdout=sink, stderr=subprocess.STDOUT)
    left: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not _train_pids(marker) and time.monotonic() < deadline and snk.poll() is None:
            time.sleep(0.5)
        assert _train_pids(marker), f"the training run never started:\n{log.read_text()[-TAIL:]}"
        time.sleep(2)
        snk.send_signal(signal.SIGKILL)
        snk.wait()
        deadline = time.monotonic() + 30
        while _train_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _train_pids(marker)
        assert not left, f"training processes {left} run on after Snakemake was killed"
    finally:
        if snk.poll() is None:
            snk.kill()
            snk.wait()
        for pid in _train_pids(marker):   # only the processes this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# == item: a run stops with whatever started it, however it was started (issue 28, row 1) =====

def _kill_all(pids: list[int]) -> None:
    for pid in pids:   # only the processes this test started
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _detached_starter(cmd: list[str], tmp_path: Path) -> int:
    """A Python starter that runs `cmd` as its direct child, itself detached (its parent is init,
    as for a Snakemake started with setsid or nohup): its pid."""
    pidfile = tmp_path / "starter.pid"
    starter = f"import subprocess; subprocess.run({cmd!r})"
    spawn = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', {starter!r}]); "
             f"open({str(pidfile)!r}, 'w').write(str(p.pid))")
    subprocess.run([sys.executable, "-c", spawn], env=ENV, check=True, timeout=60)
    return int(pidfile.read_text())


def _wait_gone(marker: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := pids_naming(marker)) and time.monotonic() < deadline:
        time.sleep(0.3)
    return left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_a_watchdog_stops_a_run_that_is_its_starters_direct_child(tmp_path):
    """No shell between: the starter (Snakemake where bash execs, or any Python starter) is the
    run's parent; killing it -9 must stop the run (the old watchdog watched the grandparent)."""
    marker = f"watched-run-{tmp_path.name}"
    child = (f"import time, dpbench.run.watchdog as l; l.stop_with_pipeline(0.2); "
             f"time.sleep(60)  # {marker}")
    starter = _detached_starter([sys.executable, "-c", child], tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not pids_naming(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids_naming(marker), "the run never started"
        time.sleep(1.0)   # the run is up and watching
        assert pids_naming(marker)
        os.kill(starter, signal.SIGKILL)
        assert not _wait_gone(marker, 15), "the run outlived the process that started it"
    finally:
        _kill_all([starter, *pids_naming(marker)])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_the_watchdog_watches_the_parent_the_shell_s_parent_and_the_named_pipeline(tmp_path):
    from dpbench.run import watchdog
    show = ("import json, os, dpbench.run.watchdog as l; "
            "print(json.dumps([[w.pid, w.child] for w in l.starters()]))")
    direct = subprocess.run([sys.executable, "-c", show], env=ENV, capture_output=True, text=True, check=True)
    assert [pid for pid, _ in json.loads(direct.stdout)] == [os.getpid()]   # no shell: the parent alone
    via_shell = subprocess.run(["sh", "-c", f"{sys.executable} -c '{show}'; true"], env=ENV,
                               capture_output=True, text=True, check=True)
    (shell, shell_child), (up, up_child) = json.loads(via_shell.stdout)
    assert up == os.getpid() and up_child == shell   # the shell must stay the pipeline's child
    named = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True,
                           env=dict(ENV, **{watchdog.PIPELINE_PID_ENV: str(os.getppid())}))
    assert [pid for pid, _ in json.loads(named.stdout)] == [os.getpid(), os.getppid()]
    gone = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True,
                          env=dict(ENV, **{watchdog.PIPELINE_PID_ENV: "999999999"}))
    assert [pid for pid, _ in json.loads(gone.stdout)] == [os.getpid()]   # no such process: not watched


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_killing_the_direct_starter_of_a_ddp_run_stops_torchrun_and_its_ranks(tmp_path):
    """A Python starter runs the launcher as the pipeline does (no shell between, as on the GPU
    machine) for DDP on 2 gloo ranks, and is killed -9: no launcher, torchrun or rank is left
    within 30 s, and the record is failed, naming the lost starter."""
    out = tmp_path / "ddp-run"
    cfg = dict(TINY, variant="ddp", gpus=2, device="cpu", synthetic_size=4800, max_steps=100_000,
               workers=0, log_every=1)
    cmd = [sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg), "--out", str(out),
           "--lease", "--planned-gpus", "0", "--log", str(tmp_path / "run.log")]
    starter = _detached_starter(cmd, tmp_path)
    marker = str(out)
    try:
        deadline = time.monotonic() + 180
        log = tmp_path / "run.log"
        trained = re.compile(r"rank 1\] epoch 1/\d+ step 2/")
        while time.monotonic() < deadline and not (log.exists() and trained.search(log.read_text())):
            time.sleep(0.5)
        assert trained.search(log.read_text()), log.read_text()[-TAIL:]
        os.kill(starter, signal.SIGKILL)
        left = _wait_gone(marker, 30)
        assert not left, f"processes {left} of the run outlived its starter:\n{log.read_text()[-TAIL:]}"
        rec = results.read_json(out / results.METRICS)
        assert rec["status"] == "failed"
        assert f"pid {starter}" in rec["reason"] and "gone" in rec["reason"], rec["reason"]
    finally:
        _kill_all([starter, *pids_naming(marker)])


# == item: one rank's line per line of the log (issue 28, row 10) ===========================

def _glued(text: str) -> list[str]:
    """Lines that are not one dpbench line each: two lines' text on one, or a line's tail."""
    return [line for line in text.splitlines()
            if line.count("[dpbench ") > 1 or ("[dpbench " in line and not line.startswith("[dpbench "))]


def test_two_processes_logging_at_once_never_glue_their_lines(tmp_path):
    """Unbuffered output (PYTHONUNBUFFERED=1, as on many GPU machines) used to write a line's text
    and its newline apart: two ranks on one log file glued their lines."""
    go = tmp_path / "go"
    code = ("import os, sys, time; from dpbench.run.runlog import log\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"   # both at once
            "for i in range(20000): log(f'line {i} of a rank, long enough to be seen whole ' + 'x' * 40)")
    path = tmp_path / "run.log"
    with open(path, "ab") as sink:   # one file shared by both, as the ranks share the run's log
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=sink, stderr=sink,
                                  env=dict(ENV, PYTHONUNBUFFERED="1", RANK=str(r))) for r in (0, 1)]
        time.sleep(1.0)
        go.touch()
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lines = path.read_text().splitlines()
    assert not _glued(path.read_text()) and "" not in lines
    assert sum(" rank 0] " in line for line in lines) == sum(" rank 1] " in line for line in lines) == 20000


@pytest.mark.slow
def test_a_two_rank_ddp_log_has_one_ranks_line_per_line(tmp_path):
    out = tmp_path / "run"
    cfg = dict(TINY, variant="ddp", gpus=2, device="cpu", synthetic_size=480, max_steps=40,
               workers=0, log_every=1, eval_each_epoch=False)
    proc = cli("dpbench.run.launch", "--config", json.dumps(cfg), "--out", str(out),
               "--planned-gpus", "0", "--log", str(tmp_path / "run.log"),
               env=dict(ENV, PYTHONUNBUFFERED="1"))
    text = (tmp_path / "run.log").read_text()
    assert proc.returncode == 0, text[-TAIL:]
    assert results.read_json(out / results.METRICS)["status"] == "ok", text[-TAIL:]
    assert not _glued(text), _glued(text)[:5]
    for rank in (0, 1):
        steps = [line for line in text.splitlines() if f" rank {rank}] epoch 1/1 step " in line]
        assert len(steps) == 40
