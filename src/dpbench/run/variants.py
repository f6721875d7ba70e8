"""How each variant wraps the model and reduces the loss.

Every variant returns, for one global batch, the loss it optimises and the *global* loss: the
mean of the workload's per-sample losses (spec.loss; cross-entropy for the default) over the
whole global batch, computed the same way everywhere, so curves compare step by step whatever
the variant reports.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from dpbench import DISTRIBUTED_VARIANTS, FSDP_VARIANTS
from dpbench.run.sharded import ShardOptions, shard_model
from dpbench.workloads.calls import Inputs, Output, first_tensor, model_output
from dpbench.workloads.resnet_cifar import per_sample_cross_entropy   # a Variant's loss without one


@dataclass
class StepLosses:
    optimised: torch.Tensor   # what backward() is called on
    reported: torch.Tensor    # what the variant reports (detached)
    global_sum: torch.Tensor  # sum of per-sample losses over the rank's/replicas' samples (detached)


PerSampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ReplicaLoss(nn.Module):
    """Computes the loss inside each DataParallel replica, as the article does.

    Returns (this replica's reduced loss, this replica's summed loss). DataParallel gathers the
    scalar losses into a vector with one entry per chunk, and warns that it had to unsqueeze
    them (claim C5). The sum, kept only for the global loss, is returned as a 1-element vector so
    that it adds no second warning per step.
    """

    def __init__(self, model: nn.Module, reduction: str, loss: "PerSampleLoss | None" = None,
                 output: Output = None):
        super().__init__()
        self.model, self.reduction, self.loss = model, reduction, loss or per_sample_cross_entropy
        self.output = output

    def forward(self, x, y):
        per_sample = self.loss(model_output(self.model, x, self.output).float(), y)
        total = per_sample.sum()
        return (per_sample.mean() if self.reduction == "mean" else total), total.detach().unsqueeze(0)


def reduce_replica_losses(name: str, per_replica: torch.Tensor, global_batch: int) -> torch.Tensor:
    """dp_mean: the mean of the replicas' mean losses (the article's way: biased when the batch
    splits unevenly). dp_sum: the replicas' summed losses over the global batch size (the fix)."""
    if name == "dp_mean":
        return per_replica.mean()
    return per_replica.sum() / global_batch


def ddp_kwargs(options: dict) -> dict:
    """DistributedDataParallel's keyword arguments for the run's knobs.

    Only what differs from PyTorch's default is passed: recent PyTorch deprecates
    `broadcast_buffers` (any value given warns) in favour of `forward_sync_buffers`, and a
    warning on every run would pollute the runs' warning records. Turning buffer syncing off
    uses the new name where it exists; it still syncs buffers once at construction, which every
    rank's identical seeded initialisation makes a no-op here.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP
    kwargs = dict(options)
    if kwargs.pop("broadcast_buffers", True) is False:
        new_name = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
        kwargs["forward_sync_buffers" if new_name else "broadcast_buffers"] = False
    return kwargs


class Autocast(nn.Module):
    """Runs the wrapped module under autocast to `dtype`. DataParallel's replica threads re-enter
    autocast with `enabled` only (torch's parallel_apply does not pass the dtype), and a new
    thread's autocast dtype is the device's default: float16 on CUDA. Without this a bf16
    DataParallel run computes its replicas in float16."""

    def __init__(self, module: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.module, self.dtype = module, dtype

    def forward(self, *args, **kwargs):
        device = first_tensor(args if args else kwargs).device
        with torch.autocast(device.type, dtype=self.dtype):
            return self.module(*args, **kwargs)


class Replica(nn.Module):
    """What each replica of the dp variant runs: the model on its part of the inputs, and the
    tensor the loss takes out of its result (workloads.calls.model_output), so DataParallel
    gathers one tensor whatever forward returns (a dict, a tuple, a ModelOutput)."""

    def __init__(self, model: nn.Module, output: Output = None):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, x):
        return model_output(self.model, x, self.output)


class Variant:
    """Wraps a model (already on its first device) for one variant; `losses` runs a forward.
    `autocast_dtype`: the mixed-precision dtype of the run (None: full precision), which the
    DataParallel replicas must be told themselves (fsdp/hsdp take it as MixedPrecisionPolicy's
    param_dtype instead: the engine then runs them without autocast). `loss`: the workload's
    per-sample loss (outputs, targets) -> one loss per sample (cross-entropy when not given).
    `output`: which tensor of forward's result the loss takes (WorkloadSpec.output). The inputs
    `losses` takes are a tensor, or a tuple or dict of tensors (forward(*x), forward(**x)):
    DataParallel scatters each tensor, DDP and FSDP2 pass them on. `shard`: how fsdp/hsdp wrap (their units and knobs); zero1 wraps as ddp does (its sharding
    is the optimizer's)."""

    def __init__(self, name: str, model: nn.Module, devices: list[torch.device],
                 world: int = 1, ddp_options: dict | None = None,
                 autocast_dtype: torch.dtype | None = None, loss: PerSampleLoss | None = None,
                 shard: ShardOptions | None = None, output: Output = None):
        self.name, self.bare, self.devices, self.world = name, model, devices, world
        self.loss, self.output = loss or per_sample_cross_entropy, output
        self.units: list[nn.Module] = []   # fsdp/hsdp: the fully_shard units, the root last
        self.checkpointed: list[nn.Module] = []   # the units whose activations are recomputed
        self.compiled_units = bool(shard and shard.compile != "none" and name in FSDP_VARIANTS)
        if shard is not None and shard.checkpoint:   # before any wrapping (torchtitan's order)
            from dpbench.run.knobs import checkpoint_units
            self.checkpointed = checkpoint_units(model, shard.units)
        ids = [d.index for d in devices]
        replica = Autocast(model, autocast_dtype) if autocast_dtype is not None else model
        if name == "dp":
            self.module = nn.DataParallel(Replica(replica, output), device_ids=ids)
        elif name in ("dp_mean", "dp_sum"):
            self.module = nn.DataParallel(ReplicaLoss(replica, name.removeprefix("dp_"), self.loss, output),
                                          device_ids=ids)
        elif name in ("ddp", "zero1"):
            from torch.nn.parallel import DistributedDataParallel as DDP
            on_cuda = devices[0].type == "cuda"
            self.module = DDP(model, device_ids=[devices[0].index] if on_cuda else None,
                              **ddp_kwargs(ddp_options or {}))
        elif name in FSDP_VARIANTS:
            opts = dataclasses.replace(shard or ShardOptions(), param_dtype=autocast_dtype)
            self.units = shard_model(name, model, devices[0], world, opts)
            self.module = model   # fully_shard works in place: the model is its own wrapper
        else:
            self.module = model

    def compile(self, mode: str) -> None:
        """torch.compile the module the forward runs through (DDP included: its optimizer
        splits the graph at bucket boundaries so that communication still overlaps).

        dynamic=False: an epoch's short last batch compiles a graph of its own instead of
        turning the full batch's graph into a shape-generic one, so every timed (full) step
        runs the graph specialised for its shape."""
        if self.compiled_units:   # fsdp/hsdp: each unit, before fully_shard (sharded.shard_model)
            return
        if self.name not in ("single", "ddp", "zero1"):
            raise ValueError(f"torch.compile is supported for single, ddp and zero1 (fsdp and hsdp compile "
                             f"each unit through ShardOptions.compile), not {self.name}")
        self.module = torch.compile(self.module, dynamic=False,
                                    **({} if mode == "default" else {"mode": mode}))

    def losses(self, x: Inputs, y: torch.Tensor, global_batch: int) -> StepLosses:
        if self.name in ("dp_mean", "dp_sum"):
            reduced, sums = self.module(x, y)
            loss = reduce_replica_losses(self.name, reduced, global_batch)
            return StepLosses(loss, loss.detach(), sums.sum())

        # dp's replicas take their tensors out (Replica): DataParallel gathers one tensor
        outputs = self.module(x) if self.name == "dp" else model_output(self.module, x, self.output)
        per_sample = self.loss(outputs.float(), y)
        total = per_sample.sum()
        if self.name in DISTRIBUTED_VARIANTS:
            # DDP (and FSDP2, over its replicate x shard ranks) averages gradients over ranks;
            # scaling the local sum by world/N makes that
            # average exactly the gradient of the global mean, even when shards are uneven.
            loss = total * (self.world / global_batch)
            # What it reports is the global loss, known once the ranks' sums are reduced.
            return StepLosses(loss, total.detach() / global_batch, total.detach())
        loss = total / global_batch
        return StepLosses(loss, loss.detach(), total.detach())
