#!/usr/bin/env python3
"""Where dpbench's one-rank distributed step loses time against a bare loop (issue 35's probe).

    torchrun --standalone --nproc-per-node=1 tools/device/harness_profile.py --out DIR [--tiny]

In one rank process: a bare DDP/ZeRO-1/FSDP2 loop (CUDA events), then dpbench's engine
(engine.run_process, as a rank runs it) on the same workload, as is and with each piece of the
harness switched off in turn (NVML sampler, stall guard, warning recorder, profiled step). The
engine's train_step is wrapped to split host time per step into inside the step and between
steps; one run of each is profiled for 5 steps (torch.profiler: op counts, kernels a step).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tools" / "device")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from dpbench.plan.config import RunConfig  # noqa: E402
from dpbench.run import components, engine, hooks, measure, waits  # noqa: E402

STEPS, WARMUP = 40, 10


BATCH = 128


def config(variant: str, tiny: bool, workload) -> RunConfig:
    batch = 8 if tiny else BATCH
    return RunConfig.from_dict({
        "variant": variant, "gpus": 1, "workload": workload, "global_batch": batch,
        "precision": "fp32" if tiny else "bf16", "feed": "fixed", "dataset": "synthetic",
        "synthetic_size": batch * STEPS, "synthetic_test_size": batch, "eval_samples": batch,
        "epochs": 1, "max_steps": STEPS, "warmup_steps": WARMUP, "workers": 0, "momentum": 0.9,
        "lr_schedule": "constant", "lr": 0.01, "device": "cpu" if tiny else "auto", "log_every": 1000})


class StepTimes:
    """Wraps a train_step: host ms inside each call and between calls."""

    def __init__(self, fn, profile_at: range | None = None, trace: Path | None = None):
        self.fn, self.inside, self.between, self.last = fn, [], [], None
        self.calls, self.profile_at, self.trace, self.prof = 0, profile_at, trace, None

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        if self.last is not None:
            self.between.append((t0 - self.last) * 1e3)
        if self.profile_at is not None and self.calls == self.profile_at.start:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                           torch.profiler.ProfilerActivity.CUDA])
            self.prof.__enter__()
        out = self.fn(*a, **k)
        self.calls += 1
        if self.prof is not None and self.calls == self.profile_at.stop:
            self.prof.__exit__(None, None, None)
            dump(self.prof, self.trace, len(self.profile_at))
            self.prof = None
        self.last = time.perf_counter()
        self.inside.append((self.last - t0) * 1e3)
        return out

    def summary(self) -> dict:
        med = lambda v: sorted(v[WARMUP:])[len(v[WARMUP:]) // 2] if len(v) > WARMUP else None
        return {"host_inside_ms": med(self.inside), "host_between_ms": med(self.between)}


def dump(prof, path: Path, steps: int) -> None:
    events = prof.key_averages()
    kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                           "cuLaunchKernelEx"))
    rows = sorted(({"op": e.key, "count_per_step": e.count / steps, "cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps}
                   for e in events), key=lambda r: -r["cpu_ms_per_step"])
    path.write_text(json.dumps({"kernels_per_step": kernels / steps, "launches_per_step": launches / steps,
                                "ops": rows[:60], "all_counts": {r["op"]: r["count_per_step"] for r in rows}}, indent=1))


def bare(variant: str, cfg: RunConfig, out: Path) -> dict:
    """The plain loop a user writes, in this rank, with its own process group."""
    from dpbench.workloads.spec import build
    dev = torch.device("cuda", 0) if cfg.device != "cpu" and torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    torch.manual_seed(cfg.seed)
    spec = build(cfg.workload)
    model = spec.model.to(dev).train()
    bf16 = cfg.precision == "bf16"
    if variant in ("ddp", "zero1"):
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0] if dev.type == "cuda" else None)
    if variant == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
        for m in [m for m in model.modules() if isinstance(m, spec.shard_modules)]:
            fully_shard(m, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    kw = dict(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if variant == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.SGD, **kw)
    else:
        opt = torch.optim.SGD(model.parameters(), **kw)
    x, y = spec.batch(torch.Generator().manual_seed(cfg.seed), cfg.global_batch)
    x, y = x.to(dev), y.to(dev)
    autocast = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if bf16 and variant != "fsdp" else nullcontext

    def step():
        with autocast():
            loss = spec.loss(model(x).float(), y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    timer = StepTimes(step, range(20, 25), out / f"bare-{variant}.prof.json")
    cuda = dev.type == "cuda"
    events = []
    for _ in range(STEPS):
        timer()
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            events.append(ev)
        else:
            events.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in zip(events, events[1:])]
    else:
        ms = [(b - a) * 1e3 for a, b in zip(events, events[1:])]
    timed = sorted(ms[WARMUP - 1:])
    dist.destroy_process_group()
    if cuda:
        torch.cuda.empty_cache()
    return {"step_ms_p50": timed[len(timed) // 2], **timer.summary()}


class NoNvml:
    def __init__(self, ids):
        self.peak_mib, self.error = dict.fromkeys(ids), "off for the probe"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def dpbench_run(variant: str, cfg: RunConfig, out: Path, off: set[str], profile: bool) -> dict:
    saved = (measure.NvmlSampler, waits.Waits.arm, measure.WarningRecorder.__enter__, components.profiled_step,
             hooks.train_step)
    if "nvml" in off:
        engine.measure.NvmlSampler = NoNvml
    if "guard" in off:
        waits.Waits.arm = lambda self, *a, **k: None
    if "warnings" in off:
        def enter(self):
            import warnings
            self._ctx = warnings.catch_warnings(record=True)
            self._log = self._ctx.__enter__()
            return self
        measure.WarningRecorder.__enter__ = enter
    if "profiled" in off:
        def plain(variant_, opt, x, y, n, autocast, distributed):
            return hooks.train_step(variant_, opt, x, y, n, autocast), {}, []
        hooks.components.profiled_step = plain
    name = f"{variant}-{'-'.join(sorted(off)) or 'asis'}{'-prof' if profile else ''}"
    timer = StepTimes(saved[4], range(20, 25) if profile else None, out / f"dpbench-{name}.prof.json")
    hooks.train_step = timer
    run_out = out / "runs" / name
    run_out.mkdir(parents=True, exist_ok=True)
    try:
        engine.run_process(cfg, run_out)
    finally:
        measure.NvmlSampler, waits.Waits.arm, measure.WarningRecorder.__enter__, components.profiled_step, \
            hooks.train_step = saved
        engine.measure.NvmlSampler = saved[0]
        hooks.components.profiled_step = saved[3]
    rec = json.loads((run_out / "metrics.json").read_text())
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"name": name, "status": rec["status"], "reason": rec.get("reason", ""),
            "step_ms_p50": (rec.get("throughput") or {}).get("step_ms_p50"), **timer.summary()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--workload", default=None, help="JSON workload (default: timm ViT-S/16, --tiny a small LM)")
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    global BATCH
    BATCH = args.batch
    args.out.mkdir(parents=True, exist_ok=True)
    workload = json.loads(args.workload) if args.workload else (
        {"name": "transformer-lm", "args": {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 64}}
        if args.tiny else "tools/device/outside_models.py:vit_small")
    rows = []
    plan = [("ddp", set(), False), ("ddp", set(), True), ("ddp", {"nvml"}, False), ("ddp", {"guard"}, False),
            ("ddp", {"warnings"}, False), ("ddp", {"profiled"}, False),
            ("ddp", {"nvml", "guard", "warnings", "profiled"}, False),
            ("zero1", set(), False), ("zero1", {"nvml", "guard", "warnings", "profiled"}, False),
            ("fsdp", set(), False), ("fsdp", {"nvml", "guard", "warnings", "profiled"}, False)]
    for variant in ("ddp", "zero1", "fsdp"):
        t0 = time.perf_counter()
        row = {"name": f"bare-{variant}", **bare(variant, config(variant, args.tiny, workload), args.out)}
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        for v, off, prof in [r for r in plan if r[0] == variant]:
            t0 = time.perf_counter()
            row = dpbench_run(v, config(v, args.tiny, workload), args.out, off, prof)
            row["wall_s"] = round(time.perf_counter() - t0, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "harness_profile.json").write_text(json.dumps(rows, indent=1))
    print("| run | step ms p50 | host ms inside step | host ms between steps |")
    for r in rows:
        print(f"| {r['name']} | {r.get('step_ms_p50')} | {r.get('host_inside_ms')} | {r.get('host_between_ms')} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
