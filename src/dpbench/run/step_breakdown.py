"""Where one training step's time goes: a run's step (the engine's model, Variant, optimizer and
first batch, as its config builds them) profiled with torch.profiler after a warm-up, split into
forward, backward and optimizer (phase windows closed by a device synchronisation, the same
`mark` hook the memory profile uses), with the communication not hidden under computation
(exposed) and the time of each kernel (CUDA) or operator (CPU, self time), per step.

    python -m dpbench.run.step_breakdown --config RUN_JSON --out FILE.json [--warmup 3] [--steps 5]
    torchrun --standalone --nproc-per-node G -m dpbench.run.step_breakdown ...   (ddp and the
        sharded variants; rank 0 writes)

`dpbench bisect` runs it in each environment's own python for the flagged cell; its numbers
are compared by analysis.bisect.profile. A profiled step is slower than a timed one (the
profiler's own cost): its phases are shares, not the run's speed.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.autograd.profiler import record_function

from dpbench.plan import variants
from dpbench.plan.config import RunConfig
from dpbench.plan.variants.spec import AUTOCAST
from dpbench.run import engine
from dpbench.run.data import WorkloadFeed, make_feed
from dpbench.run.datasets import load_dataset
from dpbench.run.intervals import exposed, length, union
from dpbench.run.step import train_step

PHASES = ("forward", "backward", "optimizer")
_MARKS = {"forward": "backward", "backward": "optimizer", "step": None}   # a phase ended -> the next
# Communication as the profiler names it: NCCL's kernels, gloo's and c10d's operators.
COMM = re.compile(r"nccl|gloo|c10d::|all_?reduce|all_?gather|reduce_?scatter|broadcast|alltoall", re.I)
PREFIX = "dpbench::"


class Phases:
    """record_function ranges around each phase of train_step, each closed after a synchronise
    (so a phase's kernels run inside its range), and the phases' host-clock durations."""

    def __init__(self, device: torch.device):
        self.device, self.ms, self._range, self._t = device, {}, None, 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _open(self, phase: str) -> None:
        self._range = record_function(PREFIX + phase)
        self._range.__enter__()
        self._phase, self._t = phase, time.perf_counter()

    def begin(self) -> None:
        self._sync()
        self._open("forward")

    def mark(self, ended: str) -> None:
        if ended not in _MARKS:   # zero_grad: its time stays in the backward's range
            return
        self._sync()
        self.ms[self._phase] = (time.perf_counter() - self._t) * 1e3
        self._range.__exit__(None, None, None)
        if _MARKS[ended]:
            self._open(_MARKS[ended])


def summarise(events, cuda: bool, steps: int) -> dict:
    """Per step: each kernel's (CUDA) or operator's (CPU, self time) ms, and the exposed
    communication in ms, from the profiler's events."""
    ranges = [e for e in events if e.name.startswith(PREFIX)]
    lo = min((e.time_range.start for e in ranges), default=0.0)
    hi = max((e.time_range.end for e in ranges), default=0.0)
    inside = lambda e: lo <= e.time_range.start <= hi
    if cuda:
        # record_function ranges also appear on the GPU's timeline, spanning their kernels: not kernels
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and inside(e)
                   and not getattr(e, "is_user_annotation", False)]
        times = {}
        for e in kernels:
            times[e.name] = times.get(e.name, 0.0) + (e.time_range.end - e.time_range.start) / 1e3
        comm = [(e.time_range.start, e.time_range.end) for e in kernels if COMM.search(e.name)]
        compute = [(e.time_range.start, e.time_range.end) for e in kernels if not COMM.search(e.name)]
    else:
        ops = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and inside(e)
               and not e.name.startswith(PREFIX)]
        times = {}
        for e in ops:
            times[e.name] = times.get(e.name, 0.0) + e.self_cpu_time_total / 1e3
        comm = [(e.time_range.start, e.time_range.end) for e in ops if COMM.search(e.name)]
        # Computation: the operators of the main thread that are not communication.
        main = ranges[0].thread if ranges else None
        compute = [(e.time_range.start, e.time_range.end) for e in ops
                   if e.thread == main and not COMM.search(e.name) and e.cpu_parent is None]
    return {"kernels_ms": {k: v / steps for k, v in sorted(times.items(), key=lambda kv: -kv[1])},
            "exposed_comm_ms": exposed(comm, compute) / 1e3 / steps,
            "comm_ms": length(union(comm)) / 1e3 / steps}


def first_batch(cfg: RunConfig, spec, ctx: engine.Context):
    """The run's first training batch, as the engine's feed gives it."""
    dataset = load_dataset(cfg) if spec.dataset == "cifar10" else None
    if dataset is None:
        feed = WorkloadFeed(spec.batch, cfg.synthetic_size, cfg.global_batch, cfg.seed, ctx.device,
                            ctx.world, ctx.rank, fixed=cfg.feed == "fixed")
    else:
        feed = make_feed(cfg.feed, dataset.train, cfg.global_batch, cfg.seed, ctx.device, ctx.world, ctx.rank,
                         augment=True, workers=cfg.workers)
    x, y, n = next(iter(feed.epoch(0)))
    if cfg.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y, n


def breakdown(cfg: RunConfig, warmup: int, steps: int) -> dict | None:
    """The profiled steps' breakdown (None on ranks other than 0)."""
    with engine.Context(cfg) as ctx:
        engine.set_numerics(cfg)
        spec = engine.build_workload(cfg)
        model = engine.build_model(cfg, ctx, spec)
        bf16 = cfg.precision == "bf16"
        variant, opt = engine.wrap(cfg, spec, model, ctx.devices, ctx.world)
        if cfg.compile != "none":
            variant.compile(cfg.compile)
        autocast = (lambda: torch.autocast(ctx.device.type, dtype=torch.bfloat16)) \
            if bf16 and variant.spec.mixed_precision == AUTOCAST else nullcontext
        x, y, n = first_batch(cfg, spec, ctx)
        for _ in range(warmup + engine.COMPILE_STEPS[cfg.compile]):
            train_step(variant, opt, x, y, n, autocast)
        cuda = ctx.device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        phase_ms = []
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(steps):
                phases = Phases(ctx.device)
                phases.begin()
                train_step(variant, opt, x, y, n, autocast, mark=phases.mark)
                phase_ms.append(phases.ms)
        if not ctx.is_main:
            return None
        summary = summarise(prof.events(), cuda, steps)
        medians = {p: statistics.median(m[p] for m in phase_ms) for p in PHASES}
        return {"variant": cfg.variant, "gpus": cfg.gpus, "device": ctx.device.type, "world": ctx.world,
                "torch": torch.__version__, "steps": steps, "warmup": warmup,
                "phases_ms": medians, "step_ms": sum(medians.values()),
                "distributed": variants.spec(cfg.variant).distributed, **summary}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a run's config as JSON (plan.json's runs hold them)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args(argv)
    data = json.loads(args.config)
    data.pop("environment", None)
    data["options"] = {k: v for k, v in (data.get("options") or {}).items() if k != "environment"}
    doc = breakdown(RunConfig.from_dict(data), args.warmup, args.steps)
    if doc is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
