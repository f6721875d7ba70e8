"""dp, dp_mean and dp_sum's runtime: nn.DataParallel over the process's GPUs, the loss taken on
the gathered outputs (dp) or inside each replica (dp_mean, dp_sum; spec.loss says how the
replicas' losses are combined)."""
from __future__ import annotations

import torch
import torch.nn as nn

from dpbench.plan.variants.spec import GLOBAL_MEAN, REPLICA_MEANS_MEAN
from dpbench.run.variants.base import PerSampleLoss, WrapRequest, Wrapped
from dpbench.workloads.calls import Output, first_tensor, model_output
from dpbench.workloads.resnet_cifar import per_sample_cross_entropy   # a Variant's loss without one


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


def reduce_replica_losses(reduction: str, per_replica: torch.Tensor, global_batch: int) -> torch.Tensor:
    """mean (dp_mean): the mean of the replicas' mean losses (the article's way: biased when the
    batch splits unevenly). sum (dp_sum): the replicas' summed losses over the global batch size
    (the fix)."""
    if reduction == "mean":
        return per_replica.mean()
    return per_replica.sum() / global_batch


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


def replica_reduction(loss: str) -> str:
    """How each replica reduces its samples' losses for a spec's loss: mean or sum."""
    return "mean" if loss == REPLICA_MEANS_MEAN else "sum"


def wrap(req: WrapRequest) -> Wrapped:
    ids = [d.index for d in req.devices]
    replica = Autocast(req.model, req.autocast_dtype) if req.autocast_dtype is not None else req.model
    if req.spec.loss == GLOBAL_MEAN:   # dp: the loss on the gathered outputs
        return Wrapped(nn.DataParallel(Replica(replica, req.output), device_ids=ids), whole_inputs=True)
    return Wrapped(nn.DataParallel(ReplicaLoss(replica, replica_reduction(req.spec.loss), req.loss, req.output),
                                   device_ids=ids))
