"""C7's DataParallel step breakdown, its own code on the CPU."""
import copy
import json
import re
import threading
import time

import pytest
import torch
import torch.nn as nn

from dpbench.claims import CONFIRMED, records
from dpbench.claims.c7 import dp_step
from dpbench.claims.c7 import probe as c7_probe
from dpbench.claims.c7 import text as c7_text
from dpbench.claims.c8 import text as c8_text
from dpbench.claims.records import obs

from claims.planted import cpu_only, _probe, fake_gpu_probes, gpu_tag, evidence


class _Broadcast(torch.autograd.Function):
    """replicate's Broadcast on the CPU: a copy of the parameters per replica, whose gradients
    backward sums through comm.reduce_add_coalesced, as torch's Broadcast backward does."""

    @staticmethod
    def forward(ctx, n, *params):
        ctx.n, ctx.k = n, len(params)
        return tuple(p.detach().clone() for _ in range(n) for p in params)

    @staticmethod
    def backward(ctx, *grads):
        from torch.nn.parallel import comm
        per_replica = [list(grads[i * ctx.k:(i + 1) * ctx.k]) for i in range(ctx.n)]
        return (None, *comm.reduce_add_coalesced(per_replica, -1))


class _Replica(nn.Module):
    """A replica: a structural copy of the model (its own, so threads swap no shared parameters)
    run with the broadcast parameters."""

    def __init__(self, shell, params):
        super().__init__()
        self.shell, self.params = shell, params

    def forward(self, x):
        return torch.func.functional_call(self.shell, self.params, (x,))


class CpuDataParallel(nn.Module):
    """nn.DataParallel's calls on the CPU, with PersistentThreadsDataParallel's parallel_apply."""
    parallel_apply = dp_step.PersistentThreadsDataParallel.parallel_apply   # the code under test

    def __init__(self, module, device_ids=(0, 1), **_):
        super().__init__()
        n = len(device_ids)
        self.module, self.device_ids, self.output_device = module, list(range(n)), 0
        self.replica_threads = dp_step.ReplicaThreads(n, "cpu")
        self.shells = [copy.deepcopy(module) for _ in range(n)]

    def scatter(self, inputs, kwargs, device_ids):
        chunks = inputs[0].chunk(len(device_ids))
        return tuple((c,) for c in chunks), tuple({} for _ in chunks)

    def replicate(self, module, device_ids):
        names, params = zip(*module.named_parameters())
        copies = _Broadcast.apply(len(device_ids), *params)
        k = len(params)
        return [_Replica(self.shells[i], dict(zip(names, copies[i * k:(i + 1) * k]))) for i in range(len(device_ids))]

    def gather(self, outputs, output_device):
        return torch.cat(outputs)

    def forward(self, x):   # DataParallel.forward's order
        inputs, kwargs = self.scatter((x,), {}, self.device_ids)
        replicas = self.replicate(self.module, self.device_ids[:len(inputs)])
        return self.gather(self.parallel_apply(replicas, inputs, kwargs), self.output_device)


@pytest.fixture
def cpu_reduce(monkeypatch):
    """comm.reduce_add_coalesced on CPU tensors (torch's needs CUDA), `delay` seconds long."""
    from torch.nn.parallel import comm
    calls = {"n": 0, "delay": 0.0}

    def reduce(inputs, destination=None, buffer_size=None):
        calls["n"] += 1
        time.sleep(calls["delay"])
        return [sum(ts) for ts in zip(*inputs)]

    monkeypatch.setattr(comm, "reduce_add_coalesced", reduce)
    return calls


@pytest.fixture
def one_warmup(monkeypatch):
    """One warm-up step a kind, not three: on the CPU there is no autotuning to wait out, and a
    ResNet18 step is slow (the steps' plumbing is under test, not their number)."""
    monkeypatch.setattr(dp_step, "WARMUP", 1)


@cpu_only
def test_dp_step_breakdown_says_it_needs_cuda(capsys):
    assert dp_step.main(["--benchmark", "off", "--batch", "512"]) == 0
    assert re.findall(r"\d+", json.loads(capsys.readouterr().out)["skipped"]) == ["2", "0"]   # needed, found


def test_replica_threads_keep_order_threads_grad_mode_and_autocast_dtype():
    pool = dp_step.ReplicaThreads(2, "cpu")
    seen = []

    class Who(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k, self.fc = k, nn.Linear(4, 4)

        def forward(self, x, scale=1.0):
            seen.append(threading.current_thread().name)
            return self.fc(x) * scale, self.k

    mods, xs = [Who(0), Who(1)], [torch.randn(2, 4), (torch.randn(3, 4),)]
    out = pool.apply(mods, xs, [{"scale": 2.0}, {}], [0, 1])
    assert [k for _, k in out] == [0, 1] and out[0][0].shape == (2, 4) and out[1][0].shape == (3, 4)
    assert out[0][0].grad_fn is not None
    first = sorted(seen)
    seen.clear()
    # the caller's dtype, not the CPU's default autocast dtype (bfloat16), as a new thread would take
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        again = pool.apply(mods, xs, None, [0, 1])
    assert sorted(seen) == first == ["replica-0", "replica-1"]   # the same two threads, every step
    assert all(o.dtype == torch.float16 and o.grad_fn is None for o, _ in again)   # the caller's state
    one = pool.apply(mods[:1], xs[:1], None, [0])
    assert len(one) == 1 and one[0][1] == 0
    with pytest.raises(ValueError, match="3 replicas for 2 replica threads"):
        pool.apply([*mods, mods[0]], [*xs, xs[0]], None, [0, 1, 0])
    pool.close()


def test_replica_threads_hand_an_error_back_and_keep_serving():
    pool = dp_step.ReplicaThreads(2, "cpu")

    class Boom(nn.Module):
        def forward(self, x):
            raise RuntimeError("replica failed")

    with pytest.raises(RuntimeError, match="replica failed"):
        pool.apply([nn.Identity(), Boom()], [torch.ones(1), torch.ones(1)], None, [0, 1])
    out = pool.apply([nn.Identity(), nn.Identity()], [torch.ones(1), torch.zeros(1)], None, [0, 1])
    assert [o.item() for o in out] == [1.0, 0.0]   # nothing of the failed step is left in the queue
    pool.close()


def test_dp_bench_steps_through_persistent_threads_on_the_cpu(cpu_reduce, one_warmup, monkeypatch):
    monkeypatch.setattr(dp_step, "SLOW_STEP_MS", float("inf"))   # a CPU step is slow: keep the steps asked for
    bench = dp_step.Bench(4, [0, 1], device_type="cpu")
    dp = CpuDataParallel(bench.model)
    timed = bench.timed(dp, steps=2)
    assert timed["timed_steps"] == 2 and timed["step_ms_min"] <= timed["step_ms"] <= timed["step_ms_max"]
    assert cpu_reduce["n"] == dp_step.WARMUP + 2   # every backward summed the replicas' gradients
    single = bench.staged(bench.staged_single_step, steps=2)
    assert set(single) == {*records.SINGLE_STAGES, "total", "timed_steps"}
    monkeypatch.setattr(dp_step, "SLOW_STEP_MS", 0.0)   # every step slow: the few steps instead
    monkeypatch.setattr(dp_step, "FEW_STEPS", 3)        # (fewer than its 5, still not the 2 asked for)
    stages = bench.staged(lambda: bench.staged_dp_step(dp), steps=2)
    assert set(stages) == {*records.STAGES, "total", "timed_steps"} and stages["timed_steps"] == dp_step.FEW_STEPS
    dp.replica_threads.close()


def test_dp_staged_step_splits_the_gradients_reduce_from_backward(cpu_reduce):
    from torch.nn.parallel import comm
    bench = dp_step.Bench(4, [0, 1], device_type="cpu")
    dp = CpuDataParallel(bench.model)
    bench.staged_dp_step(dp)   # the first step's one-off costs
    cpu_reduce["delay"] = 1.0
    ms = bench.staged_dp_step(dp)
    assert ms["backward_reduce"] >= 1000.0 > ms["backward"]   # the reduce's time, not the replicas' backward
    assert ms["total"] == pytest.approx(sum(ms[s] for s in records.STAGES)) and min(ms.values()) >= 0
    assert comm.reduce_add_coalesced.__name__ == "reduce"   # the timing wrapper is gone again
    assert all(p.grad is not None for p in bench.model.parameters())   # the reduce reached the model
    dp.replica_threads.close()


def test_the_breakdown_process_feeds_the_probe_and_the_ledger_end_to_end(tmp_path, cpu_reduce, one_warmup,
                                                                          monkeypatch):
    # dp_step.measure with DataParallel's CPU stand-in -> its JSON line -> the C7 probe's
    # observations -> the ledger's cause: every key one side writes, the other reads
    monkeypatch.setattr(dp_step, "SLOW_STEP_MS", float("inf"))
    monkeypatch.setattr(nn, "DataParallel", CpuDataParallel)
    monkeypatch.setattr(dp_step, "PersistentThreadsDataParallel", CpuDataParallel)
    lines = {b: dp_step.measure(False, b, steps=1, device_type="cpu") for b in (4, 8)}
    assert lines[4]["replica_autocast_dtype"]["dpbench_dp"] == "torch.bfloat16"
    monkeypatch.setattr(c7_probe, "run_python",
                        lambda code, env=None, args=None: {"rc": 0, **lines[int(args[args.index("--batch") + 1])]})
    steps, parts = c7_probe.dp_step_observations(2, [4, 8])
    assert parts == [] and len(steps) == 3 * 4 + 1
    probes = {**fake_gpu_probes(), "C7": _probe("C7", CONFIRMED, [obs("c7.conv.slowdown", "s", benchmark_on=65.7,
                                                                      benchmark_off=3.9), *steps])}
    f = c8_text.finding(evidence(tmp_path, gpu_tag(), probes))
    assert [b["batch"] for b in f.data["dp_step_batches"]] == [4, 8]
    c = f.data["dp_step"]
    assert set(c["excess"]) == set(records.STAGES) and c["largest_excess_stage"] in records.STAGES
    assert f.data["overhead_growth"]["batches"] == [4, 8]
    assert sum(c7_text.cause_text(b) in e for b in f.data["dp_step_batches"] for e in f.evidence) == 2
    assert c7_text.finding(evidence(tmp_path / "c7", gpu_tag(), probes)).data["dp_step"]["on"]["batch"] == 4


def test_replica_dtype_probe_runs_every_kind_on_the_cpu_and_names_each():
    """It runs and names all three kinds; on the CPU DataParallel is the bare module, so stock DP's
    fp16 fallback in fresh threads cannot show here (the fresh-thread test above drives that)."""
    got = dp_step.replica_autocast_dtype([0, 1], "cpu")
    assert got == {"stock": "torch.bfloat16", "persistent_threads": "torch.bfloat16", "dpbench_dp": "torch.bfloat16"}
