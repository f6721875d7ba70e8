"""Bare training loops, one per variant, written as a user would write them: the model, the
wrapper, SGD, one fixed batch on the device, forward + mean loss + backward + step, CUDA events.
Nothing of dpbench's harness runs around them (no record, no sampler, no guard, no profiled step).

Only the model, its batch and its loss come from the workload (so both loops train the same
thing), and the fixed batch is the one dpbench's `feed: fixed` serves (global step 0's batch,
this rank's shard), so a bare loop and a dpbench run of the same config compute the same losses.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer

try:   # public from torch 2.6; torch 2.4 and 2.5 have it under _composable
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # type: ignore

from dpbench.plan.config import RunConfig
from dpbench.run.data import WorkloadFeed, shard
from dpbench.workloads import registry
from dpbench.workloads.spec import build

DISTRIBUTED = ("ddp", "zero1", "fsdp", "hsdp")


@dataclass
class BareResult:
    step_ms: list[float] = field(default_factory=list)   # device clock, every step after the first
    losses: list[float] = field(default_factory=list)    # the global batch's mean loss, every step
    host_ms: float | None = None                         # host time to issue one step from an idle device


def _batch(cfg: RunConfig, spec, world: int, rank: int):
    """Global step 0's batch, this rank's shard: what `feed: fixed` serves."""
    feed = WorkloadFeed(spec.batch, cfg.global_batch, cfg.global_batch, cfg.seed, torch.device("cpu"), world, rank)
    x, y = feed.global_batch(0, cfg.global_batch)
    part = shard(len(x), world, rank)
    return x[part], y[part]


def _fsdp(model: nn.Module, spec, variant: str, world: int, bf16: bool, reshard: bool) -> None:
    device = "cuda" if torch.cuda.is_available() and next(model.parameters()).is_cuda else "cpu"
    mesh = (init_device_mesh(device, (world,)) if variant == "fsdp"
            else init_device_mesh(device, (1, world), mesh_dim_names=("replicate", "shard")))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    if bf16:   # batch norm keeps fp32 weights beside its fp32 running statistics
        for norm in [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]:
            fully_shard(norm, mesh=mesh, reshard_after_forward=reshard,
                        mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                                       output_dtype=torch.bfloat16))
    for block in [m for m in model.modules() if spec.shard_modules and isinstance(m, spec.shard_modules)
                  and m is not model]:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    if device == "cuda":   # as run.sharded.shard_model: the whole model's freed segments go
        torch.cuda.empty_cache()


def run(cfg: RunConfig, steps: int | None = None) -> BareResult:
    """cfg's variant as a bare loop in this process (a rank under torchrun for the distributed
    ones, which opens and closes its own process group)."""
    variant, steps = cfg.variant, steps or cfg.max_steps
    cuda = cfg.device != "cpu" and torch.cuda.is_available()
    distributed = variant in DISTRIBUTED
    if distributed:
        local = int(__import__("os").environ.get("LOCAL_RANK", 0))
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        # Bounded as dpbench's own set-up is: a peer that never joins fails the loop, not hangs it.
        dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=cfg.collective_timeout_s))
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        device, world, rank = torch.device("cuda", 0) if cuda else torch.device("cpu"), 1, 0
    try:
        return _loop(cfg, variant, steps, device, world, rank, distributed)
    finally:
        if distributed:
            dist.destroy_process_group()


def _loop(cfg: RunConfig, variant: str, steps: int, device: torch.device, world: int, rank: int,
          distributed: bool) -> BareResult:
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    name, _, args = registry.resolve(cfg.workload)
    extra = {"num_classes": cfg.num_classes} if name == registry.DEFAULT and "num_classes" not in args else {}
    torch.manual_seed(cfg.seed)
    spec = build(cfg.workload, **extra)
    bf16 = cfg.precision == "bf16"
    model = spec.model.to(device).train()
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    x, y = _batch(cfg, spec, world, rank)
    x, y = x.to(device), y.to(device)
    if cfg.channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)

    if variant in ("ddp", "zero1"):
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    elif variant in ("fsdp", "hsdp"):
        _fsdp(model, spec, variant, world, bf16, cfg.reshard_after_forward)
    elif variant == "dp":
        model = nn.DataParallel(model, device_ids=[device.index])
    sgd = dict(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if variant == "zero1":
        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.SGD, **sgd)
    else:
        opt = torch.optim.SGD(model.parameters(), **sgd)
    # fsdp/hsdp compute in bf16 through their MixedPrecisionPolicy, the others under autocast
    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16))
                if bf16 and variant not in ("fsdp", "hsdp") else nullcontext)

    def step() -> torch.Tensor:
        with autocast():
            loss = spec.loss(model(x).float(), y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    out, marks, losses = BareResult(), [], []
    cuda = device.type == "cuda"
    for i in range(steps):
        if i == min(2, steps - 1) and cuda:   # one step issued from an idle device: the host's own time
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            losses.append(step())
            out.host_ms = (time.perf_counter() - t0) * 1e3
        else:
            losses.append(step())
        if cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            marks.append(ev)
        else:
            marks.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
        out.step_ms = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    else:
        out.step_ms = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
    mean = torch.stack(losses).double()
    if distributed:   # equal shards: the global mean is the mean of the ranks' means
        dist.all_reduce(mean)
        mean /= world
    out.losses = mean.cpu().tolist()
    return out
