import json
import math
import os
import re
import threading
import types
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import run_engine

from dpbench import results
from dpbench.results import files
from dpbench.host import gpu_lease
from dpbench.run import engine as train
from dpbench.run import hooks, launch, measure, provenance
from dpbench.run.variants import ReplicaLoss, reduce_replica_losses


def _weights(path):
    return torch.load(path, map_location="cpu")


def first_steps(out, ranks: int) -> tuple[dict, dict]:
    """One step of single and of ddp on `ranks` gloo ranks; their records (model.pt beside each)."""
    # Global batch 7 splits unevenly (4/3, 3/3/1); BatchNorm frozen so only the reduction can differ.
    common = dict(max_steps=1, global_batch=7, batchnorm="eval", save_checkpoint=True,
                  eval_each_epoch=False, warmup_steps=0)
    single = run_engine(out / "single", variant="single", **common)
    ddp = run_engine(out / "ddp", variant="ddp", gpus=ranks, max_cpu_ranks=ranks, **common)
    return single, ddp


@pytest.fixture(scope="module")
def two_rank_first_steps(tmp_path_factory):
    """first_steps on 2 ranks in a 2-thread job (what Snakemake sets), made once: the step check
    and the threads check read the same launch (each launch starts torchrun and its ranks)."""
    out = tmp_path_factory.mktemp("first_steps")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            mp.setenv(var, "2")
        return out, *first_steps(out, 2)


@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.slow)])   # 3 ranks: the slow loop
def test_ddp_on_gloo_takes_the_same_first_step_as_single(tmp_path, ranks, request):
    out, single, ddp = (request.getfixturevalue("two_rank_first_steps") if ranks == 2
                        else (tmp_path, *first_steps(tmp_path, ranks)))
    assert single["status"] == ddp["status"] == "ok", ddp["reason"]
    a, b = _weights(out / "single" / "model.pt"), _weights(out / "ddp" / "model.pt")
    moved = max((a[k] - _weights_init()[k]).abs().max().item() for k in a if a[k].is_floating_point())
    assert moved > 1e-3                                     # the step did change the weights
    worst = max((a[k] - b[k]).abs().max().item() for k in a if a[k].is_floating_point())
    assert worst < 1e-5
    s_loss, d_loss = (results.read_json(out / n / results.METRICS)["final_loss"] for n in ("single", "ddp"))
    assert math.isclose(s_loss, d_loss, rel_tol=1e-5)
    # from the launch to the first step: torchrun and its ranks' start-up are in ddp's, not single's
    assert 0 < single["start_s"] < ddp["start_s"] < 300
    for rec in (single, ddp):   # every phase ended, in order, before the first step
        ends = [rec["startup"][p] for p in results.STARTUP_PHASES]
        assert 0 <= ends[0] and ends == sorted(ends) and ends[-1] <= rec["start_s"]
    # single ran in this process, torch imported; ddp's ranks started under torchrun
    assert single["startup"]["imports"] < ddp["startup"]["imports"]


def _weights_init():
    torch.manual_seed(0)
    from dpbench.workloads.resnet import resnet18
    return resnet18().state_dict()


def test_syncbatchnorm_without_cuda_is_a_skipped_record(tmp_path):
    rec = run_engine(tmp_path / "ddp", variant="ddp", gpus=2, batchnorm="sync")
    assert rec["status"] == "skipped" and "SyncBatchNorm" in rec["reason"]


class _FixedLoss(nn.Module):
    """Logits chosen so that sample i's cross-entropy (label 0) is exactly losses[i]."""

    def __init__(self, losses):
        super().__init__()
        self.register_buffer("margin", torch.log(torch.expm1(torch.tensor(losses, dtype=torch.float64))))

    def forward(self, idx):
        return torch.stack([torch.zeros_like(self.margin[idx]), self.margin[idx]], 1)


def test_replica_reductions_on_an_uneven_split():
    # The article's example: losses 0.3, 0.2, 0.8; DataParallel chunks 3 samples on 2 devices as 2 + 1.
    replica = ReplicaLoss(_FixedLoss([0.3, 0.2, 0.8]), "mean")
    chunks = [c for c in torch.arange(3).chunk(2)]
    y = torch.zeros(3, dtype=torch.long)
    means = torch.stack([replica(c, y[c])[0] for c in chunks])
    replica.reduction = "sum"
    sums = torch.stack([replica(c, y[c])[0] for c in chunks])
    assert reduce_replica_losses("mean", means, 3).item() == pytest.approx(0.525)
    assert reduce_replica_losses("sum", sums, 3).item() == pytest.approx(0.43333333)
    one_device = torch.stack([replica(torch.arange(3), y)[0]])
    assert reduce_replica_losses("sum", one_device, 3).item() == pytest.approx(0.43333333)


def test_warnings_are_captured_always_and_counted_with_their_first_step():
    with measure.WarningRecorder() as rec:
        for step in range(5):
            rec.step = step
            if step >= 2:
                warnings.warn("gathered scalars", UserWarning)   # one call site, three times
            rec.drain()
        t = threading.Thread(target=lambda: warnings.warn("from a replica thread", RuntimeWarning))
        t.start()
        t.join()
    rows = {r["message"]: r for r in rec.rows(rank=1)}
    assert rows["gathered scalars"]["count"] == 3 and rows["gathered scalars"]["first_step"] == 2
    assert rows["gathered scalars"]["category"] == "UserWarning" and rows["gathered scalars"]["rank"] == 1
    assert "test_engine.py:" in rows["gathered scalars"]["location"]
    assert rows["from a replica thread"]["count"] == 1


def test_dataparallel_without_cuda_is_a_skipped_record(tmp_path):
    rec = run_engine(tmp_path / "dp", variant="dp", gpus=2)
    assert rec["status"] == "skipped"
    assert rec["reason"].startswith(launch.skip_reason(train.RunConfig.from_dict(rec["config"]), 0))
    assert rec["run_id"] == "dp-g2-r0" and rec["throughput"]["images_per_s"] is None


def test_more_gpus_than_visible_names_both_numbers(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    visible = launch.visible_gpus(None)
    cfg = train.RunConfig(variant="ddp", gpus=4)
    assert re.findall(r"\d+", launch.skip_reason(cfg, visible)) == ["4", "2"]   # needed, visible
    assert launch.skip_reason(train.RunConfig(variant="dp", gpus=2), visible) is None


def test_skip_counts_no_more_gpus_than_the_plan_and_none_without_cuda(monkeypatch):
    monkeypatch.setattr(launch, "cuda_devices", lambda: 2)
    assert (launch.visible_gpus(None), launch.visible_gpus(1), launch.visible_gpus(4)) == (2, 1, 2)
    monkeypatch.setattr(launch, "cuda_devices", lambda: 0)   # GPUs on the machine, a CPU-only torch
    assert launch.visible_gpus(2) == 0
    assert launch.skip_reason(train.RunConfig(variant="dp", gpus=2), 0) is not None
    monkeypatch.setattr(launch, "cuda_devices", lambda: pytest.fail("the CPU plan asks torch nothing"))
    assert launch.visible_gpus(0) == 0


def test_a_leased_ddp_run_is_counted_without_torch(monkeypatch):
    """The launcher of a ddp run with leased GPUs and a CUDA build of torch counts the lease:
    importing torch there costs every DDP run seconds its ranks pay again."""
    monkeypatch.setattr(launch, "torch_is_cuda_build", lambda: True)
    ddp, single = train.RunConfig(variant="ddp", gpus=2), train.RunConfig(variant="single")
    assert launch.counted_lease(ddp, 2) == 2
    assert launch.counted_lease(single, 1) is None and launch.counted_lease(ddp, None) is None
    monkeypatch.setattr(launch, "cuda_devices", lambda: pytest.fail("asked torch for a counted lease"))
    assert launch.visible_gpus(2, 2) == 2 and launch.visible_gpus(1, 2) == 1   # never more than planned
    monkeypatch.setattr(launch, "torch_is_cuda_build", lambda: False)   # a CPU-only torch: ask it
    assert launch.counted_lease(ddp, 2) is None


def test_the_lease_reaches_the_ranks_environment_and_no_other_process(tmp_path, monkeypatch):
    """main -> lease -> torchrun: the ranks get the counted lease; the launcher's own environment
    does not keep it (a later run in the same process would inherit it)."""
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", gpu_lease.LEASED_ENV):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setattr(gpu_lease, "pool", lambda: ["0", "1"])
    monkeypatch.setattr(gpu_lease, "LOCK_DIR", tmp_path / "locks")
    monkeypatch.setattr(launch, "stop_with_pipeline", lambda: None)
    monkeypatch.setattr(launch, "torch_is_cuda_build", lambda: True)
    started = []

    class Torchrun:
        pid = os.getpid()

        def __init__(self, cmd, env, **kwargs):
            started.append(env)

        def wait(self):
            return 0

    monkeypatch.setattr(launch, "subprocess", types.SimpleNamespace(Popen=Torchrun))
    cfg = json.dumps({"variant": "ddp", "gpus": 2, "dataset": "synthetic"})
    assert launch.main(["--config", cfg, "--out", str(tmp_path / "run"), "--lease", "--planned-gpus", "2"]) == 0
    (env,) = started
    assert env[gpu_lease.LEASED_ENV] == "2" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert gpu_lease.LEASED_ENV not in os.environ
    # torch counted the GPUs (a CPU-only torch): the ranks are told nothing to check
    started.clear()
    monkeypatch.setattr(launch, "torch_is_cuda_build", lambda: False)
    monkeypatch.setattr(launch, "cuda_devices", lambda: 2)
    monkeypatch.setenv(gpu_lease.LEASED_ENV, "2")   # even if an outer launcher left one
    assert launch.main(["--config", cfg, "--out", str(tmp_path / "run"), "--lease", "--planned-gpus", "2"]) == 0
    assert gpu_lease.LEASED_ENV not in started[0]



@pytest.mark.parametrize("exclusive", [True, False])
def test_a_run_records_whether_it_held_every_gpu(tmp_path, monkeypatch, exclusive):
    """Exclusive timing is part of how a number was measured: the record says so, and the
    launcher's environment forgets it once the run is done."""
    monkeypatch.delenv(gpu_lease.EXCLUSIVE_ENV, raising=False)
    for var in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setattr(gpu_lease, "pool", lambda: ["0", "1"])
    monkeypatch.setattr(gpu_lease, "LOCK_DIR", tmp_path / "locks")
    monkeypatch.setattr(launch, "stop_with_pipeline", lambda: None)
    monkeypatch.setattr(launch, "run", lambda cfg, out, planned, leased=None: results.write_json(
        out / results.METRICS, {"launch": provenance.launch_facts([])}) or 0)
    cfg = json.dumps({"variant": "single", "gpus": 1, "dataset": "synthetic"})
    argv = ["--config", cfg, "--out", str(tmp_path / "run"), "--lease", "--planned-gpus", "2"]
    assert launch.main(argv + (["--exclusive"] if exclusive else [])) == 0
    assert results.read_json(tmp_path / "run" / results.METRICS)["launch"]["exclusive"] is exclusive
    assert gpu_lease.EXCLUSIVE_ENV not in os.environ

@pytest.mark.parametrize("config, seen, reason", [
    ({"gpus": 2, "device": "cuda"}, 0, "device=cuda was asked for but no CUDA device is visible"),
    ({"gpus": 2}, 1, "needs 2 GPUs, 1 visible"),
])
def test_a_rank_whose_torch_sees_fewer_gpus_than_leased_records_the_launchers_skip(
        tmp_path, monkeypatch, config, seen, reason):
    """The launcher counted the lease without torch; the ranks' torch sees fewer devices (a
    driver too old for it, a scheduler's fake GPUs): the run is the skip the launcher would
    have recorded, written once, and every rank stops before any collective."""
    monkeypatch.setenv(gpu_lease.LEASED_ENV, "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: seen)
    monkeypatch.setattr(launch, "die_with_parent", lambda: None)   # not on the test process
    monkeypatch.setattr(train.Context, "__enter__", lambda self: pytest.fail("set up a process group"))
    for var, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(var, value)
    cfg = json.dumps({"variant": "ddp", "dataset": "synthetic", **config})
    assert launch.main(["--config", cfg, "--out", str(tmp_path)]) == 0
    rec = results.read_json(tmp_path / results.METRICS)
    assert rec["status"] == "skipped"
    assert rec["reason"] == f"{reason} (CUDA_VISIBLE_DEVICES=3,5; torch sees {seen})"
    # rank 1 stops as well, and leaves rank 0's record as it is
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    (tmp_path / results.METRICS).write_text("{}")
    assert launch.main(["--config", cfg, "--out", str(tmp_path)]) == 0
    assert (tmp_path / results.METRICS).read_text() == "{}"


def test_a_skipped_run_is_recorded_without_torch_in_the_same_layout(tmp_path):
    """Every skipped run would otherwise pay a torch import (seconds, beside timed runs)."""
    import subprocess
    import sys
    code = ("import json, sys; from dpbench.run import launch; "
            "launch.main(['--config', json.dumps({'variant': 'dp', 'gpus': 2, 'dataset': 'synthetic'}), "
            f"'--out', {str(tmp_path / 'dp')!r}, '--planned-gpus', '0']); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "False", done.stderr
    skipped = results.read_json(tmp_path / "dp" / results.METRICS)
    ran = run_engine(tmp_path / "single", variant="single", max_steps=1)
    assert skipped["status"] == "skipped"
    assert skipped["reason"].startswith(launch.skip_reason(train.RunConfig.from_dict(skipped["config"]), 0))
    assert sorted(skipped) == sorted(ran) and skipped["throughput"] == results.NO_THROUGHPUT
    assert sorted(results.NO_THROUGHPUT) == sorted(ran["throughput"])
    assert dict(measure.throughput([], []), compile_s=None) == results.NO_THROUGHPUT
    facts = ("torch", "torch_git", "git_sha", "hostname", "python", "compile")
    assert {k: skipped["provenance"][k] for k in facts} == {k: ran["provenance"][k] for k in facts}
    assert skipped["launch"] == ran["launch"] and skipped["device_type"] == "cpu"


def test_a_run_the_plan_skips_is_skipped_on_a_machine_with_more_gpus(tmp_path, monkeypatch):
    """Planned for 1 GPU (gpus_available=1), ddp on 2 is skipped and given no GPU; on a machine
    with 2 GPUs the launcher must not train it anyway."""
    monkeypatch.setattr(launch, "cuda_devices", lambda: 2)
    monkeypatch.setattr(launch, "launch_ddp", lambda *a: pytest.fail("trained a run its plan skips"))
    cfg = json.dumps({"variant": "ddp", "gpus": 2, "dataset": "synthetic"})
    assert launch.main(["--config", cfg, "--out", str(tmp_path), "--planned-gpus", "1"]) == 0
    rec = results.read_json(tmp_path / results.METRICS)
    assert rec["status"] == "skipped"
    assert rec["reason"].startswith(launch.skip_reason(train.RunConfig.from_dict(rec["config"]), 1))
    assert launch.where(1) in rec["reason"]   # and the plan's count, which limited it


def test_a_failure_mid_run_keeps_what_was_measured(tmp_path, monkeypatch):
    monkeypatch.setenv(hooks.FAULT_ENV, "0:3")
    rec = run_engine(tmp_path / "single", variant="single", max_steps=6, global_batch=6)
    assert rec["status"] == "failed" and hooks.FAULT_ENV in rec["reason"]
    assert rec["steps"] == 3                                   # steps 0, 1, 2 completed
    assert len((tmp_path / "single" / results.STEPS).read_text().splitlines()) == 4


def test_a_crashed_ddp_rank_leaves_a_failed_record_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(hooks.FAULT_ENV, "1:1")
    rec = run_engine(tmp_path / "ddp", variant="ddp", gpus=2, max_steps=3, global_batch=6)
    assert rec["status"] == "failed"
    assert "rank1" in rec["reason"] and hooks.FAULT_ENV in rec["reason"]


def test_a_successful_run_records_everything(tmp_path):
    rec = run_engine(tmp_path / "single", variant="single", max_steps=4, global_batch=8)
    assert rec["status"] == "ok" and rec["steps"] == 4
    assert rec["throughput"]["timed_steps"] == 3 and rec["throughput"]["images_per_s"] > 0
    assert rec["accuracy"][0]["epoch"] == 1 and 0 <= rec["accuracy"][0]["test_acc"] <= 1
    assert rec["provenance"]["torch"] == torch.__version__
    assert rec["provenance"]["dataset"]["name"] == "synthetic"
    rows = (tmp_path / "single" / results.STEPS).read_text().splitlines()
    assert rows[0].split(",") == results.STEP_COLUMNS and len(rows) == 5


def test_writes_are_atomic(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    results.write_json(target, {"status": "ok"})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError):
        results.write_json(target, {"status": "failed"})
    assert results.read_json(target) == {"status": "ok"}            # the old file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temporary left behind


def test_metrics_is_written_after_the_step_table(tmp_path, monkeypatch):
    order = []
    real = files.write_atomic
    monkeypatch.setattr(files, "write_atomic", lambda p, t: (order.append(p.name), real(p, t)))
    run_engine(tmp_path / "single", variant="single", max_steps=2, global_batch=6, eval_each_epoch=False)
    assert order[-1] == results.METRICS and results.STEPS in order


def test_bad_run_config_names_the_key(tmp_path, capsys):
    with pytest.raises(SystemExit):
        launch.main(["--config", '{"variant": "dpp"}', "--out", str(tmp_path)])
    assert "variant='dpp'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch.main(["--config", '{"global_bach": 64}', "--out", str(tmp_path)])
    assert "global_bach" in capsys.readouterr().err


def test_engine_warnings_carry_the_step_they_first_fired_at(tmp_path):
    from conftest import write_official_cifar
    write_official_cifar(tmp_path / "data", per_batch=4)
    rec = run_engine(tmp_path / "run", variant="single", dataset="cifar10",
                     data_root=str(tmp_path / "data"), download=False, max_steps=3, global_batch=6)
    mismatch = [w for w in rec["warnings"] if "md5 differs" in w["message"]]
    assert len(mismatch) == 1 and mismatch[0]["first_step"] == -1      # raised during set-up
    assert rec["provenance"]["dataset"]["checksum"] == "mismatch"


def test_a_rerun_that_fails_early_leaves_no_old_curve(tmp_path, monkeypatch):
    out = tmp_path / "single"
    assert run_engine(out, variant="single", max_steps=3, global_batch=6)["status"] == "ok"
    assert (out / results.STEPS).exists()
    monkeypatch.setenv(hooks.FAULT_ENV, "0:0")
    rec = run_engine(out, variant="single", max_steps=3, global_batch=6)
    assert rec["status"] == "failed" and rec["steps"] == 0
    assert not (out / results.STEPS).exists()


def test_gloo_ranks_share_the_jobs_threads(two_rank_first_steps):
    _, _, rec = two_rank_first_steps   # ddp on 2 ranks under OMP_NUM_THREADS=2
    assert rec["status"] == "ok" and rec["provenance"]["cpu_threads"] == 1


class FakeAllocator:
    """torch.cuda's peak counters for one device, driven by hand."""

    def __init__(self, monkeypatch):
        self.current = self.peak = 0.0
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: setattr(self, "peak", self.current))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: self.peak * measure.MIB)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 2 * self.peak * measure.MIB)

    def spike(self, mib):
        self.peak = max(self.peak, self.current + mib)


def test_training_peaks_leave_the_evaluation_out(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    peaks = measure.TrainingPeaks([0])
    alloc.spike(100.0)              # a training step
    with peaks.left_out():
        alloc.spike(500.0)          # the test pass, on device 0 alone at its own batch
    alloc.spike(120.0)              # training goes on (eval_each_epoch)
    row, = measure.memory_rows(peaks, None)
    assert row["allocated_mib"] == 120.0 and row["reserved_mib"] == 240.0
    alloc.spike(700.0)
    assert measure.memory_rows(peaks, None)[0]["allocated_mib"] == 700.0  # training's own peaks still count


def test_training_peaks_of_a_run_that_failed_in_evaluation_keep_the_training(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    peaks = measure.TrainingPeaks([0])
    alloc.spike(100.0)
    with pytest.raises(RuntimeError), peaks.left_out():
        alloc.spike(900.0)
        raise RuntimeError("out of memory in the test pass")
    assert measure.memory_rows(peaks, None)[0]["allocated_mib"] == 100.0


def test_an_explicit_git_sha_wins_over_the_trees_own(monkeypatch):
    from dpbench.host import source as provenance
    monkeypatch.delenv("DPBENCH_GIT_SHA", raising=False)
    own = provenance.git_sha()
    monkeypatch.setenv("DPBENCH_GIT_SHA", "c0ffee")   # what tools/device/*.sh export for a copied tree
    assert provenance.git_sha() == "c0ffee" != own


def _losses(run_dir):
    """The curve of a run without its timings: what a bit-reproducibility check compares."""
    import csv
    with open(run_dir / results.STEPS) as f:
        return [(r["step"], r["loss_global"], r["loss_reported"]) for r in csv.DictReader(f)]


def test_deterministic_reruns_are_bit_identical_and_say_so(tmp_path, monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        a = run_engine(tmp_path / "a", deterministic=True, seed=3, max_steps=3)
        b = run_engine(tmp_path / "b", deterministic=True, seed=3, max_steps=3)
    finally:
        torch.use_deterministic_algorithms(False)   # in-process runs: leave the switch as found
    assert a["status"] == b["status"] == "ok"
    assert _losses(tmp_path / "a") == _losses(tmp_path / "b")
    assert a["deterministic"] is True and a["seed"] == 3
    assert a["provenance"]["deterministic_algorithms"] is True
    assert a["provenance"]["cublas_workspace_config"] == launch.CUBLAS_WORKSPACE


def test_another_seed_gives_another_curve(tmp_path):
    a = run_engine(tmp_path / "a", seed=0, max_steps=2)
    b = run_engine(tmp_path / "b", seed=1, max_steps=2)
    assert _losses(tmp_path / "a") != _losses(tmp_path / "b")
    assert (a["seed"], b["seed"]) == (0, 1)


def test_records_say_how_the_run_was_started_and_scaled(tmp_path):
    rec = run_engine(tmp_path / "r", max_steps=1)
    assert rec["launch"] == {"launcher": "local", "world_size": 1, "nodes": 1, "exclusive": False,
                             "hosts": rec["launch"]["hosts"]} and rec["launch"]["hosts"]
    assert rec["scaling"] == "strong" and rec["per_gpu_batch"] == rec["config"]["global_batch"]


def test_weak_scaling_fixes_the_per_gpu_batch():
    from dpbench.plan.matrix import resolve_run
    run = resolve_run({"per_gpu_batch": 256, "seed": 5}, "ddp", 2, 1, {}, "distinct")
    cfg = train.RunConfig.from_dict(run)
    assert (cfg.global_batch, cfg.scaling, cfg.seed) == (512, "weak", 6)
    assert resolve_run({"seed": 5}, "ddp", 2, 1, {}, "fixed")["seed"] == 5
    with pytest.raises(ValueError, match="per_gpu_batch x gpus"):
        train.RunConfig.from_dict({"variant": "ddp", "gpus": 2, "per_gpu_batch": 256, "global_batch": 256})


def test_only_full_global_batches_are_timed(tmp_path):
    # 50 images in batches of 12: four full steps and a short one of 2 at the epoch's end.
    rec = run_engine(tmp_path / "r", synthetic_size=50, warmup_steps=1, eval_each_epoch=False)
    assert rec["steps"] == 5
    assert rec["throughput"]["timed_steps"] == 3   # steps 1-3; step 0 warms up, step 4 is short



def test_each_epoch_is_set_up_before_its_step_clock_starts(tmp_path, monkeypatch):
    """The feed's per-epoch work (order, crops, their copies to the device, a loader's
    workers) must not fall into the first step of the epoch, which is timed from epoch 2 on."""
    events = []
    real_make_feed, real_mark = train.make_feed, measure.StepClock.mark

    def make_feed(*args, **kwargs):
        feed = real_make_feed(*args, **kwargs)
        if not events or "feed" not in events:   # the training feed comes first, the test feed second
            events.append("feed")
            real_epoch = feed.epoch
            feed.epoch = lambda epoch: events.append("epoch") or real_epoch(epoch)
        return feed

    monkeypatch.setattr(train, "make_feed", make_feed)
    monkeypatch.setattr(measure.StepClock, "mark", lambda self: events.append("mark") or real_mark(self))
    rec = run_engine(tmp_path / "r", epochs=2, eval_each_epoch=True, synthetic_size=24)   # batch 12: 2 steps an epoch
    assert rec["status"] == "ok", rec["reason"]
    segments = " ".join(events[1:]).split("epoch")
    assert segments[0].strip() == "", "the first epoch's clock started before the epoch was set up"
    assert [seg.split().count("mark") for seg in segments[1:]] == [3, 3]   # the start mark and one a step


def test_a_watchdog_stops_a_run_whose_starter_is_gone(tmp_path):
    """kill -9 of the pipeline leaves the job's shell behind; the run must not train on."""
    import subprocess
    import sys
    import time
    script = tmp_path / "starter.sh"
    # starter -> shell -> run: killing the starter re-parents the shell, as with Snakemake.
    script.write_text(f"{sys.executable} -c 'import time, dpbench.run.launch as l; l.stop_with_pipeline(0.2); "
                      f"time.sleep(60)' & echo $! > {tmp_path}/pid; wait\n")
    starter = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run(['bash', '{script}'])"])
    for _ in range(100):
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip():
            break
        time.sleep(0.1)
    run_pid = int((tmp_path / "pid").read_text())
    time.sleep(1.0)   # the run is up and watching
    starter.kill()
    starter.wait()
    for _ in range(100):
        try:
            os.kill(run_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(run_pid, 9)
        pytest.fail("the run outlived the process that started it")


def test_a_cpu_plan_run_hides_the_machines_gpus(tmp_path, monkeypatch):
    """gpus_available=0 plans the CPU run: its runs must not find CUDA devices either."""
    seen = {}
    monkeypatch.setattr(launch, "run", lambda cfg, out, planned=None: seen.update(
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"), planned=planned) or 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert launch.main(["--config", '{"variant": "single"}', "--out", str(tmp_path), "--planned-gpus", "0"]) == 0
    assert seen == {"visible": "", "planned": 0}


def test_fsdp_with_channels_last_is_refused_before_fully_shard_fails():
    from dpbench.plan.config import RunConfig
    from dpbench.run import engine
    for variant in ("fsdp", "hsdp"):
        assert "channels_last" in engine.refused(RunConfig(variant=variant, channels_last=True))
        assert engine.refused(RunConfig(variant=variant)) is None
    assert engine.refused(RunConfig(variant="ddp", channels_last=True)) is None


def test_wrap_takes_every_knob_of_the_config_for_each_caller():
    """engine.wrap is the one recipe the engine, its profiled steps, the rehearsal and the workload
    check build a variant and optimizer by: the config's checkpointing, SGD settings and fused
    update reach them (the profiled steps once left checkpointing out)."""
    import sharded_ranks
    from dpbench.plan.config import RunConfig
    spec = sharded_ranks.tiny_cnn()
    cfg = RunConfig(variant="single", device="cpu", checkpoint="units", lr=0.03, momentum=0.5,
                    weight_decay=1e-3, fused_sgd=True)
    variant, opt = train.wrap(cfg, spec, spec.model, [torch.device("cpu")], 1)
    assert len(variant.checkpointed) == 2   # both BasicBlocks
    group = opt.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["fused"]) == (0.03, 0.5, 1e-3, True)
    plain, _ = train.wrap(RunConfig(variant="single", device="cpu"), spec, sharded_ranks.tiny_cnn().model,
                          [torch.device("cpu")], 1)
    assert plain.checkpointed == []
