"""The cluster path for real: the pipeline through SLURM (snakemake-executor-plugin-slurm and the
shipped profile), GPU scheduling with fake GPUs, multi-node DDP through torchrun's c10d
rendezvous, and the multi-node sbatch script.

The SLURM tests bring up a real one-node cluster (slurmctld, slurmd, munge; loopback only, no
accounting database) with the workplace's `local_slurm.sh` from the `shared/` folder beside the
repository, and always take it down again. Without that script, or without root, they are
skipped with the reason.
"""
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fakes import copy_workflow, run_snakemake

from dpbench import results
from dpbench.host import gpu_lease
from dpbench.plan.config import RunConfig
from dpbench.plan.matrix import Plan
from dpbench.plan.pipeline import load_experiment
from dpbench.plan.skips import world_mismatch

REPO = Path(__file__).resolve().parents[2]
LOCAL_SLURM = REPO.parent / "shared" / "tools" / "local_slurm.sh"
FAKE_GPUS = 2

# A few steps of ResNet18 on a handful of synthetic images: cheap on 2 shared cores.
TRAIN = {"dataset": "synthetic", "synthetic_size": 48, "synthetic_test_size": 16, "global_batch": 12,
         "epochs": 1, "max_steps": 3, "warmup_steps": 1, "workers": 0, "log_every": 1000}
# single, ddp on 2 gloo processes, and ddp on 3, which the CPU plan skips (max_ranks 2): a run
# that must not ask a 2-CPU node for 3 CPUs.
EXPERIMENT = {"experiment": "cluster", "variants": ["single", "ddp"], "gpus": [2, 3], "repeats": 1,
              "train": TRAIN, "matrix": [{"name": "cluster"}],
              "cpu_plan": {"repeats": 1, "max_ranks": 2, "train": TRAIN}}
RUNS = ["single-g1-r0", "ddp-g2-r0", "ddp-g3-r0"]


def planned(**overrides) -> dict:
    return load_experiment({**EXPERIMENT, **overrides}, REPO)


# -- resources: what a scheduler is asked for (fast) --------------------------------------------

def test_skipped_runs_ask_for_one_thread_and_no_gpu():
    cpu = Plan(planned(), 0)
    assert {rid: (cpu.threads_for(rid), cpu.gpus_for(rid)) for rid in RUNS} == {
        "single-g1-r0": (1, 0), "ddp-g2-r0": (2, 0), "ddp-g3-r0": (1, 0)}
    gpu = Plan(planned(variants=["single", "ddp", "dp"]), 2)   # 2 GPUs per node planned
    assert {rid: (gpu.threads_for(rid), gpu.gpus_for(rid)) for rid in gpu.runs} == {
        "single-g1-r0": (1, 1), "ddp-g2-r0": (2, 2), "dp-g2-r0": (1, 2),
        "ddp-g3-r0": (1, 0), "dp-g3-r0": (1, 0)}
    # the CPU plan skips DataParallel, and so does any plan under torch.compile
    cpu_dp = Plan(planned(variants=["dp"]), 0)
    assert {cpu_dp.threads_for(r) for r in cpu_dp.runs} == {1}
    compiled = Plan(planned(variants=["dp"], train=dict(TRAIN, compile="default")), 2)
    assert {(compiled.threads_for(r), compiled.gpus_for(r)) for r in compiled.runs} == {(1, 0)}


class Waited(Exception):
    pass


def _no_wait(msg):
    raise Waited(msg)


def test_gpu_locks_in_a_slurm_job_are_the_jobs_own(tmp_path, monkeypatch):
    """Two SLURM jobs on one node each see their grant as GPU 0: neither waits for the other. Two
    runs inside one allocation (the whole pipeline started in salloc) still share its GPUs."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    with gpu_lease.lease(1, tmp_path, announce=_no_wait) as first:
        monkeypatch.setenv("SLURM_JOB_ID", "102")
        with gpu_lease.lease(1, tmp_path, announce=_no_wait) as second:
            assert first == second == ["0"]
        monkeypatch.setenv("SLURM_JOB_ID", "101")
        with pytest.raises(Waited, match=r"waiting for 1 free GPU"):
            with gpu_lease.lease(1, tmp_path, announce=_no_wait):
                pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slurm-job-101", "slurm-job-102"]
    # outside SLURM: the machine's locks, as before
    monkeypatch.delenv("SLURM_JOB_ID")
    with gpu_lease.lease(1, tmp_path, announce=_no_wait):
        assert (tmp_path / "gpu0.lock").exists()


# -- multi-node DDP: two torchrun agents on loopback (no SLURM needed) ---------------------------

def free_port() -> int:
    """A free port below the kernel's ephemeral range: a port the kernel hands out (bind to 0,
    every outgoing connection of a busy machine, gloo's among them) can be taken by another
    process between this check and torchrun's bind; one below the range only by an explicit bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) \
        if Path("/proc/sys/net/ipv4/ip_local_port_range").exists() else 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def loopback_env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def two_agents(out: Path, gpus: int) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents, one process each, meeting at a c10d rendezvous on 127.0.0.1: what
    two nodes do, on one machine."""
    cfg = json.dumps(dict(TRAIN, variant="ddp", gpus=gpus))
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--rdzv-id", f"test-{port}", "-m", "dpbench.run.launch", "--config", cfg, "--out", str(out)]
    agents = [subprocess.Popen(cmd, env=loopback_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    done = []
    for a in agents:
        stdout, _ = a.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(cmd, a.returncode, stdout))
    return done


@pytest.fixture(scope="module")
def two_node_record(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("two-nodes")
    agents = two_agents(out, gpus=2)
    assert all(a.returncode == 0 for a in agents), agents[0].stdout[-3000:] + agents[1].stdout[-3000:]
    return results.read_json(out / results.METRICS)


@pytest.mark.slow
def test_two_torchrun_agents_make_one_two_node_run(two_node_record):
    rec = two_node_record
    assert rec["status"] == "ok", rec["reason"]
    assert rec["launch"] == {"launcher": "torchrun", "world_size": 2, "nodes": 2, "exclusive": False,
                             "hosts": [socket.gethostname()]}
    assert rec["run_id"] == "ddp-g2-r0" and math.isfinite(rec["final_loss"])


@pytest.mark.slow
def test_gpus_other_than_the_world_size_is_a_failed_record_not_a_mislabel(tmp_path):
    agents = two_agents(tmp_path, gpus=1)
    assert all(a.returncode != 0 for a in agents)   # the job fails too, not only its record
    rec = results.read_json(tmp_path / results.METRICS)
    assert rec["status"] == "failed"
    assert rec["reason"] == world_mismatch(RunConfig.from_dict(rec["config"]), 2), rec["reason"]
    assert rec["launch"]["world_size"] == 2 and rec["final_loss"] is None


def test_any_rank_records_a_world_size_mismatch_before_it_exits(tmp_path, monkeypatch):
    """Rank 1 may be the first to see it, and exit: its agent (which may hold the rendezvous
    store) then ends rank 0 before rank 0 wrote a word. So the rank that sees it records it."""
    from dpbench.run import launch
    monkeypatch.setattr(launch, "die_with_parent", lambda: None)   # not on the test process
    for var, value in {"LOCAL_RANK": "0", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(var, value)
    assert launch.main(["--config", json.dumps(dict(TRAIN, variant="ddp", gpus=1)), "--out", str(tmp_path)]) == 1
    rec = results.read_json(tmp_path / results.METRICS)
    assert rec["status"] == "failed" and rec["reason"] == world_mismatch(RunConfig.from_dict(rec["config"]), 2)
    assert rec["launch"]["world_size"] == 2 and rec["launch"]["nodes"] == 2


# -- SLURM ----------------------------------------------------------------------------------------

def local_slurm(action: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LOCAL_SLURM), action], env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def slurm():
    """A one-node SLURM cluster with FAKE_GPUS fake GPUs (a gres on /dev/null nodes), up for this
    module's SLURM tests and down after them, whatever happened."""
    if not LOCAL_SLURM.exists():
        pytest.skip("no tool for a local SLURM cluster beside this repository (the CI machine has one)")
    if os.geteuid() != 0:
        pytest.skip("a local SLURM cluster needs root")
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        pytest.skip("snakemake-executor-plugin-slurm is not installed (pip install -e '.[test]')")
    started = time.perf_counter()
    try:
        up = local_slurm("up", SLURM_LOCAL_FAKE_GPUS=str(FAKE_GPUS))
        if up.returncode != 0:
            pytest.fail(f"local SLURM cluster did not come up:\n{up.stdout[-2000:]}\n{up.stderr[-3000:]}")
        print(f"\nlocal SLURM cluster up in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        yield
    finally:
        local_slurm("down")


@pytest.fixture
def workflow(tmp_path):
    """A copy of the workflow with the tiny experiment, in a folder the SLURM jobs can reach."""
    wd = copy_workflow(tmp_path / "wf", extra=("profiles",))
    (wd / "experiments" / "cluster.yaml").write_text(yaml.safe_dump(EXPERIMENT))
    (wd / "tmp").mkdir()
    return wd


def workflow_env(wd: Path) -> dict:
    # TMPDIR reaches the jobs too (sbatch --export=ALL): the GPU lock files stay in this test.
    env = dict(os.environ, TMPDIR=str(wd / "tmp"))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def through_slurm(wd: Path, *args: str) -> subprocess.CompletedProcess:
    """The shipped profile as a user runs it (no --cores: the profile sets jobs and threads);
    only the first status check comes sooner."""
    return run_snakemake(wd, *args, "--profile", "profiles/slurm",
                         "--slurm-init-seconds-before-status-checks", "2",
                         cores=None, env=workflow_env(wd), check=True)


def slurm_jobs(wd: Path) -> dict[str, list[dict]]:
    """SLURM's own view of the jobs submitted from this workflow (finished ones stay listed for
    MinJobAge): the plugin's comment (rule_<rule>[_wildcards_<run id>]) -> scontrol's fields."""
    out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True).stdout
    jobs: dict[str, list[dict]] = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if fields.get("WorkDir") == str(wd):
            jobs.setdefault(fields.get("Comment", ""), []).append(fields)
    return jobs


def train_jobs(wd: Path, tag_runs: list[str]) -> dict[str, dict]:
    """The latest SLURM job of each of these runs."""
    jobs = slurm_jobs(wd)
    return {rid: jobs[f"rule_train_wildcards_{rid}"][-1] for rid in tag_runs
            if f"rule_train_wildcards_{rid}" in jobs}


def records(wd: Path, tag: str) -> dict[str, dict]:
    return {rid: results.read_json(wd / "results" / tag / "runs" / rid / results.METRICS) for rid in RUNS}


def losses(wd: Path, tag: str, rid: str) -> list[str]:
    return [row.split(",")[2] for row in
            (wd / "results" / tag / "runs" / rid / results.STEPS).read_text().splitlines()[1:]]


@pytest.mark.slow
def test_cpu_plan_through_slurm_equals_a_local_run(slurm, workflow):
    wd = workflow
    local = [f"results/local/runs/{rid}/metrics.json" for rid in RUNS]
    # Under a cluster executor the CPU plan's timing limit (cpu_timing) is off: SLURM gives each
    # job its own CPUs and starts it as soon as the node has them.
    started = time.perf_counter()
    run_snakemake(wd, *local, "--config", "experiment=cluster", "tag=local", cores=2,
                  env=workflow_env(wd), check=True)
    print(f"\nlocal run: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    started = time.perf_counter()
    run = through_slurm(wd, "--config", "experiment=cluster", "tag=slurm")
    print(f"through SLURM: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    log = run.stdout + run.stderr

    ran = train_jobs(wd, RUNS)
    assert sorted(ran) == sorted(RUNS), log[-4000:]
    assert {rid: int(job["NumCPUs"]) for rid, job in ran.items()} == {
        "single-g1-r0": 1, "ddp-g2-r0": 2, "ddp-g3-r0": 1}        # the skipped run: 1 CPU
    assert all(job["JobState"] == "COMPLETED" for job in ran.values())
    assert not any("gpu" in job.get("TresPerJob", "") + job.get("TRES", "") for job in ran.values())
    # one SLURM job per run; the helper rules ran here
    assert all(c.startswith("rule_train_wildcards_") for c in slurm_jobs(wd)), sorted(slurm_jobs(wd))
    assert (wd / "results" / "slurm" / "summary.md").exists()

    here, there = records(wd, "local"), records(wd, "slurm")
    for rid in RUNS:
        assert there[rid]["status"] == here[rid]["status"], (rid, there[rid]["reason"])
        assert there[rid]["reason"] == here[rid]["reason"]
        assert there[rid]["config"] == here[rid]["config"]
    assert {rid: r["status"] for rid, r in there.items()} == {
        "single-g1-r0": "ok", "ddp-g2-r0": "ok", "ddp-g3-r0": "skipped"}
    for rid in ("single-g1-r0", "ddp-g2-r0"):
        assert there[rid]["final_loss"] == here[rid]["final_loss"]
        assert losses(wd, "slurm", rid) == losses(wd, "local", rid)
        assert there[rid]["launch"]["world_size"] == here[rid]["launch"]["world_size"]


@pytest.mark.slow
def test_fake_gpus_are_requested_granted_and_seen_by_the_runs(slurm, workflow):
    """gpus_available=2 plans the GPU runs: the jobs ask SLURM for their GPUs, the runs take the
    CUDA_VISIBLE_DEVICES SLURM sets, with locks of their own job. Without CUDA in this torch, the
    GPU run is recorded as skipped (device=cuda) by its ranks, naming what it was given; the run
    the plan skips, with the plan's reason."""
    wd = workflow
    overlay = wd / "fakegpu.yaml"
    overlay.write_text(yaml.safe_dump({"experiment": "cluster", "tag": "fakegpu",
                                       "gpus_available": FAKE_GPUS,
                                       "train": dict(TRAIN, device="cuda")}))
    # ddp-g2 takes both fake GPUs and ddp-g3 none: the two jobs start together.
    wanted = ["ddp-g2-r0", "ddp-g3-r0"]
    started = time.perf_counter()
    run = through_slurm(wd, *[f"results/fakegpu/runs/{rid}/metrics.json" for rid in wanted],
                        "--configfile", str(overlay))
    print(f"\nfake-GPU jobs through SLURM: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    log = run.stdout + run.stderr
    provided = [line for line in log.splitlines() if "Provided resources" in line]
    assert not any("gpu=" in line for line in provided), provided   # no global cap on a cluster

    jobs = train_jobs(wd, wanted)
    assert sorted(jobs) == wanted, log[-4000:]
    asked = {rid: re.search(r"gpu[:=](\d+)", j.get("TresPerJob", "")) for rid, j in jobs.items()}
    assert {rid: int(m.group(1)) if m else 0 for rid, m in asked.items()} == {
        "ddp-g2-r0": 2, "ddp-g3-r0": 0}, jobs             # sbatch --gpus=2; nothing for a skip
    assert {rid: int(j["NumCPUs"]) for rid, j in jobs.items()} == {"ddp-g2-r0": 2, "ddp-g3-r0": 1}

    recs = {rid: results.read_json(wd / "results" / "fakegpu" / "runs" / rid / results.METRICS)
            for rid in wanted}
    assert {rid: r["status"] for rid, r in recs.items()} == dict.fromkeys(wanted, "skipped")
    seen = {rid: r["provenance"]["cuda_visible_devices"] for rid, r in recs.items()}
    assert len(set(seen["ddp-g2-r0"].split(","))) == 2    # the two GPUs SLURM granted
    assert seen["ddp-g3-r0"] is None                        # asked for none, granted none
    # ddp-g2 was given both fake GPUs and its ranks' torch sees none; ddp-g3 the plan skipped
    assert recs["ddp-g2-r0"]["reason"].startswith("device=cuda was asked for but no CUDA device is visible")
    assert "torch sees 0" in recs["ddp-g2-r0"]["reason"], recs["ddp-g2-r0"]["reason"]
    assert recs["ddp-g3-r0"]["reason"].startswith("needs 3 GPUs, 2 visible"), recs["ddp-g3-r0"]["reason"]
    assert "the plan was made for 2 GPU(s)" in recs["ddp-g3-r0"]["reason"]
    text = (wd / "results" / "fakegpu" / "logs" / "ddp-g2-r0.log").read_text()
    assert f"placed on GPU(s) {seen['ddp-g2-r0']}" in text and "waiting" not in text
    locks = wd / "tmp" / f"dpbench-gpu-locks-{os.getuid()}"
    assert not list(locks.glob("gpu*.lock"))              # none of the machine's locks taken
    assert [p.name for p in locks.iterdir()] == [f"slurm-job-{jobs['ddp-g2-r0']['JobId']}"]


@pytest.mark.slow
def test_multinode_sbatch_script_runs_ddp_under_srun_torchrun(slurm, tmp_path, two_node_record):
    """tools/slurm/ddp_multinode.sbatch as a user submits it (on this one node: 1 node x 2
    processes, rendezvous on loopback)."""
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(dict(TRAIN, variant="ddp", gpus=2)))
    out = tmp_path / "ddp-g2-r0"
    env = loopback_env(NPROC_PER_NODE="2", RDZV_HOST="127.0.0.1", RDZV_PORT=str(free_port()),
                       DPBENCH_SRC=str(REPO / "src"), PYTHON=sys.executable)
    job = subprocess.run(["sbatch", "--wait", "--nodes=1", "--cpus-per-task=2", "-t", "10",
                          f"--output={tmp_path}/slurm-%j.out", str(REPO / "tools/slurm/ddp_multinode.sbatch"),
                          str(run_json), str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    job_out = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert job.returncode == 0, job.stdout + job.stderr + job_out[-4000:]
    assert "1 node(s) x 2 process(es), rendezvous 127.0.0.1" in job_out
    rec = results.read_json(out / results.METRICS)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["launch"] == {"launcher": "torchrun", "world_size": 2, "nodes": 1, "exclusive": False,
                             "hosts": [socket.gethostname()]}
    # 1 node x 2 processes computes what 2 nodes x 1 process did
    assert rec["final_loss"] == two_node_record["final_loss"]
