"""Where a DataParallel training step's time goes, and DataParallel with persistent replica threads.

    python -m dpbench.claims.c7.dp_step --benchmark off --batch 512 [--steps 15]

Runs in a process of its own (the C7 probe starts one per cudnn.benchmark setting and batch):
cuDNN's autotuning state and the per-thread library handles must start fresh. Prints one JSON line.

One step of stock nn.DataParallel is taken apart into the calls its forward makes (scatter,
replicate, parallel_apply, gather), the loss, the replicas' backward, the sum of their gradients
onto device 0 that ends it (replicate's Broadcast backward, comm.reduce_add_coalesced) and the
optimizer step, each closed by a synchronisation of every device, so a stage's time is its own
(the synchronisations make the staged step a little slower than a plain one, which is timed
separately). One GPU's step is taken apart the same way (forward, loss, backward, optimizer): the
share of each stage that one GPU pays too. `PersistentThreadsDataParallel` is a diagnostic: the
same DataParallel, except that parallel_apply runs the replicas on long-lived threads, one per
device, instead of starting new threads every step. If it closes the gap to one GPU, the cost is
the fresh threads (their per-thread cuDNN/cuBLAS state), not scatter, gather or replication.

The CUDA-only calls (device, stream, synchronize) sit behind a device type, so that the same
code runs on the CPU under tests with a stand-in for torch's CUDA-only scatter/replicate/gather.
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import comm

from dpbench.claims.records import SINGLE_STAGES, STAGES
from dpbench.workloads.resnet import resnet18
from dpbench.run.variants import Variant

WARMUP = 3
# Stock DataParallel with cudnn.benchmark on takes most of a second a step: fewer timed steps.
SLOW_STEP_MS = 200.0
FEW_STEPS = 5


def first_device(device_type: str, devices: Sequence[int]) -> torch.device:
    return torch.device("cpu") if device_type == "cpu" else torch.device(device_type, devices[0])


def _placed(device_type: str, device: int, stream: Any) -> ExitStack:
    """A replica's device and stream, as parallel_apply enters them (nothing to enter on the CPU)."""
    stack = ExitStack()
    if device_type == "cuda":
        stack.enter_context(torch.cuda.device(device))
        stack.enter_context(torch.cuda.stream(stream))
    return stack


class ReplicaThreads:
    """torch.nn.parallel.parallel_apply on long-lived threads: one per device, the same every step."""

    def __init__(self, n: int, device_type: str = "cuda"):
        self.device_type = device_type
        self._jobs: list[queue.Queue] = [queue.Queue() for _ in range(n)]
        self._done: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._serve, args=(q,), daemon=True,
                                          name=f"replica-{i}") for i, q in enumerate(self._jobs)]
        for t in self._threads:
            t.start()

    def _serve(self, jobs: queue.Queue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            i, fn = job
            try:
                self._done.put((i, fn(), None))
            except BaseException as exc:   # handed to the caller, as parallel_apply does
                self._done.put((i, None, exc))

    def apply(self, modules: Sequence[nn.Module], inputs: Sequence[Any], kwargs_tup: Sequence[dict] | None,
              devices: Sequence[int]) -> list[Any]:
        if len(modules) > len(self._jobs):
            raise ValueError(f"{len(modules)} replicas for {len(self._jobs)} replica threads")
        kwargs_tup = kwargs_tup or [{}] * len(modules)
        # The caller's grad mode and autocast state, as parallel_apply passes them on (the
        # autocast dtype too: a new thread would otherwise fall back to float16).
        kind = self.device_type
        grad = torch.is_grad_enabled()
        cast, dtype = torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
        streams = [torch.cuda.current_stream(d) if kind == "cuda" else None for d in devices]

        def job(module, x, kwargs, device, stream) -> Callable[[], Any]:
            def run():
                torch.set_grad_enabled(grad)
                with _placed(kind, device, stream), torch.autocast(kind, dtype=dtype, enabled=cast):
                    return module(*(x if isinstance(x, (list, tuple)) else (x,)), **kwargs)
            return run

        for i, args in enumerate(zip(modules, inputs, kwargs_tup, devices, streams)):
            self._jobs[i].put((i, job(*args)))
        out, error = {}, None
        for _ in modules:
            i, value, exc = self._done.get()
            out[i] = value
            error = error or exc
        if error is not None:
            raise error
        return [out[i] for i in range(len(modules))]

    def close(self) -> None:
        for q in self._jobs:
            q.put(None)


class PersistentThreadsDataParallel(nn.DataParallel):
    """nn.DataParallel whose replicas run on the same threads every step (a diagnostic)."""

    def __init__(self, module: nn.Module, device_ids: list[int] | None = None, **kwargs):
        super().__init__(module, device_ids, **kwargs)
        self.replica_threads = ReplicaThreads(len(self.device_ids))

    def parallel_apply(self, replicas, inputs, kwargs):
        return self.replica_threads.apply(replicas, inputs, kwargs, self.device_ids[:len(replicas)])


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class _Clock:
    """Host milliseconds between marks, each taken after a sync of every device."""

    def __init__(self, sync: Callable[[], None]):
        self.sync, self.ms = sync, {}
        sync()
        self.t = time.perf_counter()

    def mark(self, stage: str) -> None:
        self.sync()
        now = time.perf_counter()
        self.ms[stage], self.t = (now - self.t) * 1e3, now


@contextmanager
def timed_reduce(sync: Callable[[], None], spent: list[float]) -> Iterator[None]:
    """Times DataParallel's sum of the replicas' gradients onto device 0: replicate's Broadcast
    calls comm.reduce_add_coalesced from its backward (autograd's thread for device 0), once a
    step, after every replica's gradient has been computed. Closed by a sync of every device on
    both sides like the stages, so the replicas' backward has finished when the timing starts."""
    original = comm.reduce_add_coalesced

    def timed(*args, **kwargs):
        sync()
        t0 = time.perf_counter()
        out = original(*args, **kwargs)
        sync()
        spent.append((time.perf_counter() - t0) * 1e3)
        return out

    comm.reduce_add_coalesced = timed
    try:
        yield
    finally:
        comm.reduce_add_coalesced = original


class Bench:
    """One model, optimizer and batch; steps of each kind timed on the host after a sync of every device."""

    def __init__(self, batch: int, devices: list[int], seed: int = 0, device_type: str = "cuda"):
        torch.manual_seed(seed)
        self.devices, self.batch, self.device_type = devices, batch, device_type
        first = first_device(device_type, devices)
        self.model = resnet18().to(first).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        g = torch.Generator(device=first).manual_seed(seed)
        self.x = torch.randn(batch, 3, 32, 32, device=first, generator=g)
        self.y = torch.randint(0, 10, (batch,), device=first, generator=g)

    def sync(self) -> None:
        if self.device_type == "cuda":
            for d in self.devices:
                torch.cuda.synchronize(d)

    def step(self, net: nn.Module) -> float:
        clock = _Clock(self.sync)
        loss = F.cross_entropy(net(self.x), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        clock.mark("step")
        return clock.ms["step"]

    def staged_single_step(self) -> dict[str, float]:
        """One GPU's step by the same marks: forward, loss, backward, optimizer."""
        clock = _Clock(self.sync)
        out = self.model(self.x)
        clock.mark("forward")
        loss = F.cross_entropy(out, self.y)
        clock.mark("loss")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        clock.mark("backward")
        self.opt.step()
        clock.mark("optimizer")
        return {**clock.ms, "total": sum(clock.ms[s] for s in SINGLE_STAGES)}

    def staged_dp_step(self, dp: nn.DataParallel) -> dict[str, float]:
        """DataParallel.forward's calls one by one (the order it makes them), then loss, the
        replicas' backward, the reduce of their gradients that ends it, and the optimizer step."""
        clock = _Clock(self.sync)
        inputs, kwargs = dp.scatter((self.x,), {}, dp.device_ids)
        clock.mark("scatter")
        replicas = dp.replicate(dp.module, dp.device_ids[:len(inputs)])
        clock.mark("replicate")
        outputs = dp.parallel_apply(replicas, inputs, kwargs)
        clock.mark("replica_threads")
        out = dp.gather(outputs, dp.output_device)
        clock.mark("gather")
        loss = F.cross_entropy(out, self.y)
        clock.mark("loss")
        self.opt.zero_grad(set_to_none=True)
        reduce_ms: list[float] = []
        with timed_reduce(self.sync, reduce_ms):
            loss.backward()
        clock.mark("backward")
        self.opt.step()
        clock.mark("optimizer")
        ms = clock.ms
        ms["backward_reduce"] = sum(reduce_ms)
        ms["backward"] -= ms["backward_reduce"]
        return {**ms, "total": sum(ms[s] for s in STAGES)}

    def timed(self, net: nn.Module, steps: int) -> dict[str, Any]:
        for _ in range(WARMUP):
            last_warmup = self.step(net)
        n = FEW_STEPS if last_warmup > SLOW_STEP_MS else steps
        times = [self.step(net) for _ in range(n)]
        med = _median(times)
        return {"step_ms": round(med, 3), "images_per_s": round(self.batch / med * 1e3, 1),
                "timed_steps": n, "step_ms_min": round(min(times), 3), "step_ms_max": round(max(times), 3)}

    def staged(self, staged_step: Callable[[], dict[str, float]], steps: int) -> dict[str, Any]:
        """Each stage's median over the timed steps of one kind of staged step."""
        last_warmup = [staged_step() for _ in range(WARMUP)][-1]
        n = FEW_STEPS if last_warmup["total"] > SLOW_STEP_MS else steps
        rows = [staged_step() for _ in range(n)]
        return {**{s: round(_median([r[s] for r in rows]), 3) for s in rows[0]}, "timed_steps": n}


class _Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return self.fc(x)


def replica_autocast_dtype(devices: list[int], device_type: str = "cuda") -> dict[str, str]:
    """The dtype a replica computes in when the caller's autocast asks for bfloat16: stock
    nn.DataParallel, DataParallel on persistent replica threads, and dpbench's dp variant as the
    training runs build it (each replica wrapped in autocast of its own, variants.Autocast)."""
    first = first_device(device_type, devices)
    persistent = PersistentThreadsDataParallel(_Linear().to(first), device_ids=devices)
    nets = {"stock": nn.DataParallel(_Linear().to(first), device_ids=devices),
            "persistent_threads": persistent,
            "dpbench_dp": Variant("dp", _Linear().to(first), [first] if device_type == "cpu" else
                                  [torch.device(device_type, d) for d in devices],
                                  autocast_dtype=torch.bfloat16).module}
    x = torch.randn(8 * len(devices), 64, device=first)
    out = {}
    for name, net in nets.items():
        with torch.autocast(device_type, dtype=torch.bfloat16):
            out[name] = str(net(x).dtype)
    persistent.replica_threads.close()
    return out


def measure(benchmark: bool, batch: int, steps: int, device_type: str = "cuda") -> dict[str, Any]:
    """Every timing of the breakdown on the first two GPUs (device_type "cpu": tests, with a
    stand-in for DataParallel)."""
    torch.backends.cudnn.benchmark = benchmark
    # TF32 as the training runs use it by default (tf32: true)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    devices = list(range(min(torch.cuda.device_count(), 2))) if device_type == "cuda" else [0, 1]
    bench = Bench(batch, devices, device_type=device_type)
    stock = nn.DataParallel(bench.model, device_ids=devices)
    persistent = PersistentThreadsDataParallel(bench.model, device_ids=devices)
    result = {"benchmark": benchmark, "batch": batch, "gpus": len(devices),
              "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
              "timing": "host clock, every device synchronised after each step (and stage)"}
    result["single"] = bench.timed(bench.model, steps)   # first: the main thread's own cuDNN state
    result["dp"] = bench.timed(stock, steps)
    result["dp_persistent_threads"] = bench.timed(persistent, steps)
    result["single_stages"] = bench.staged(bench.staged_single_step, steps)
    result["dp_stages"] = bench.staged(lambda: bench.staged_dp_step(stock), steps)
    result["dp_persistent_threads_stages"] = bench.staged(lambda: bench.staged_dp_step(persistent), steps)
    persistent.replica_threads.close()
    result["replica_autocast_dtype"] = replica_autocast_dtype(devices, device_type)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--benchmark", choices=["on", "off"], required=True, help="cudnn.benchmark")
    ap.add_argument("--batch", type=int, required=True, help="global batch (the C7 probe passes the experiment's)")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per kind (fewer where a step is slow)")
    args = ap.parse_args(argv)
    if torch.cuda.device_count() < 2:
        print(json.dumps({"skipped": f"needs CUDA with 2 GPUs (found {torch.cuda.device_count()})"}))
        return 0
    print(json.dumps(measure(args.benchmark == "on", args.batch, args.steps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
