"""What every runtime module of a variant takes and returns: the request to wrap a model, the
wrapped result, and the losses of one forward."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from dpbench.plan.variants import VariantSpec
from dpbench.plan.variants.settings import DDPSettings
from dpbench.workloads.calls import Output

PerSampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class StepLosses:
    optimised: torch.Tensor   # what backward() is called on
    reported: torch.Tensor    # what the variant reports (detached)
    global_sum: torch.Tensor  # sum of per-sample losses over the rank's/replicas' samples (detached)


@dataclass
class WrapRequest:
    """What a runtime's wrap() needs: the spec, the model (on its first device), the devices of
    this process, the world size, DDP's settings (ddp, zero1; None elsewhere), the
    mixed-precision dtype (None: full precision), the per-sample loss, which tensor of forward's
    result the loss takes, and how fully_shard wraps (run.sharded, with FSDP2's settings)."""
    spec: VariantSpec
    model: nn.Module
    devices: list[torch.device]
    world: int
    ddp: DDPSettings | None
    autocast_dtype: torch.dtype | None
    loss: PerSampleLoss
    output: Output
    shard: object = None   # run.sharded.ShardOptions


@dataclass
class Wrapped:
    """The module the forward runs through, the output selector to apply to what it returns,
    the fully_shard units (the root last; [] elsewhere), and whole_inputs: the module takes the
    inputs as one argument and returns the loss's tensor itself (dp's Replica, which
    DataParallel scatters whatever the inputs' structure)."""
    module: nn.Module
    output: Output = None
    units: list[nn.Module] = field(default_factory=list)
    whole_inputs: bool = False
