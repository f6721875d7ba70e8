"""A variant at run time: wraps a model as its spec (dpbench.plan.variants) says and returns the
losses of one forward.

The spec is the declarative half (torch-free, where planning can read it); the module it names
(`spec.runtime`: plain, data_parallel, ddp, fully_shard) wraps the model. Variant joins the two:
it asks the spec, never the variant's name.

Every variant returns, for one global batch, the loss it optimises and the *global* loss: the
mean of the workload's per-sample losses (spec.loss; cross-entropy for the default) over the
whole global batch, computed the same way everywhere, so curves compare step by step whatever
the variant reports.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn as nn

from dpbench.plan import variants as registry
from dpbench.plan.variants.settings import DDPSettings
from dpbench.plan.variants.spec import RANK_SUM_SCALED, REPLICA_MEANS_MEAN, REPLICA_SUMS_OVER_BATCH
from dpbench.run.knobs import checkpoint_units
from dpbench.run.sharded import ShardOptions
from dpbench.run.variants.base import PerSampleLoss, StepLosses, WrapRequest
from dpbench.run.variants.data_parallel import (Autocast, Replica, ReplicaLoss, reduce_replica_losses,
                                                replica_reduction)
from dpbench.run.variants.ddp import ddp_kwargs
from dpbench.workloads.calls import Inputs, Output, model_output
from dpbench.workloads.resnet_cifar import per_sample_cross_entropy   # a Variant's loss without one

__all__ = ["Variant", "StepLosses", "PerSampleLoss", "ReplicaLoss", "Replica", "Autocast",
           "reduce_replica_losses", "ddp_kwargs"]

REPLICA_LOSSES = (REPLICA_MEANS_MEAN, REPLICA_SUMS_OVER_BATCH)   # the loss is taken inside each replica


class Variant:
    """Wraps a model (already on its first device) for one variant; `losses` runs a forward.
    `autocast_dtype`: the mixed-precision dtype of the run (None: full precision), which the
    DataParallel replicas must be told themselves (fsdp/hsdp take it as MixedPrecisionPolicy's
    param_dtype instead: the engine then runs them without autocast). `loss`: the workload's
    per-sample loss (outputs, targets) -> one loss per sample (cross-entropy when not given).
    `output`: which tensor of forward's result the loss takes (WorkloadSpec.output). The inputs
    `losses` takes are a tensor, or a tuple or dict of tensors (forward(*x), forward(**x)):
    DataParallel scatters each tensor, DDP and FSDP2 pass them on. `ddp`: DDP's settings (ddp,
    zero1: spec.setting(DDPSettings, cfg); None: PyTorch's defaults). `shard`: how fully_shard
    wraps (fsdp, hsdp: their units and FSDP2's settings); activation checkpointing of its units
    applies to every variant."""

    def __init__(self, name: str, model: nn.Module, devices: list[torch.device],
                 world: int = 1, ddp: DDPSettings | None = None,
                 autocast_dtype: torch.dtype | None = None, loss: PerSampleLoss | None = None,
                 shard: ShardOptions | None = None, output: Output = None):
        self.spec = registry.spec(name)
        self.name, self.bare, self.devices, self.world = name, model, devices, world
        self.loss = loss or per_sample_cross_entropy
        self.checkpointed: list[nn.Module] = []   # the units whose activations are recomputed
        self.compiled_units = bool(shard and shard.compile != "none" and self.spec.compiles == "units")
        if shard is not None and shard.checkpoint:   # before any wrapping (torchtitan's order)
            self.checkpointed = checkpoint_units(model, shard.units)
        runtime = importlib.import_module(f"{__name__}.{self.spec.runtime}")
        wrapped = runtime.wrap(WrapRequest(self.spec, model, devices, world, ddp,
                                           autocast_dtype, self.loss, output, shard))
        self.module, self.output, self.whole_inputs = wrapped.module, wrapped.output, wrapped.whole_inputs
        self.units: list[nn.Module] = wrapped.units   # fully_shard's units, the root last

    def compile(self, mode: str) -> None:
        """torch.compile the module the forward runs through (DDP included: its optimizer
        splits the graph at bucket boundaries so that communication still overlaps).

        dynamic=False: an epoch's short last batch compiles a graph of its own instead of
        turning the full batch's graph into a shape-generic one, so every timed (full) step
        runs the graph specialised for its shape."""
        if self.compiled_units:   # each unit, before fully_shard (sharded.shard_model)
            return
        if self.spec.compiles != "module":
            takers = [s.name for s in registry.all_specs() if s.compiles == "module"]
            raise ValueError(f"torch.compile compiles the model of {', '.join(takers)} (the sharded variants "
                             f"compile each unit through ShardOptions.compile), not {self.name}")
        self.module = torch.compile(self.module, dynamic=False,
                                    **({} if mode == "default" else {"mode": mode}))

    def losses(self, x: Inputs, y: torch.Tensor, global_batch: int) -> StepLosses:
        if self.spec.loss in REPLICA_LOSSES:
            reduced, sums = self.module(x, y)
            loss = reduce_replica_losses(replica_reduction(self.spec.loss), reduced, global_batch)
            return StepLosses(loss, loss.detach(), sums.sum())

        outputs = self.module(x) if self.whole_inputs else model_output(self.module, x, self.output)
        per_sample = self.loss(outputs.float(), y)
        total = per_sample.sum()
        if self.spec.loss == RANK_SUM_SCALED:
            # DDP (and FSDP2, over its replicate x shard ranks) averages gradients over ranks;
            # scaling the local sum by world/N makes that
            # average exactly the gradient of the global mean, even when shards are uneven.
            loss = total * (self.world / global_batch)
            # What it reports is the global loss, known once the ranks' sums are reduced.
            return StepLosses(loss, total.detach() / global_batch, total.detach())
        loss = total / global_batch
        return StepLosses(loss, loss.detach(), total.detach())
