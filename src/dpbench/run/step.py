"""One training step: the variant's losses (under autocast), then zero_grad, backward and the
optimizer's step. The engine trains with it and tools/device/step_profile.py and the step
benchmarks time it, so that a timing is of the step a run takes."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import torch

from dpbench.run.variants import StepLosses, Variant
from dpbench.workloads.calls import Inputs


def train_step(variant: Variant, optimizer: torch.optim.Optimizer, x: Inputs, y: torch.Tensor,
               n_global: int, autocast: Callable[[], AbstractContextManager] = nullcontext,
               zero_grad: bool = True, mark: Callable[[str], None] | None = None) -> StepLosses:
    """One step on the batch (x, y) of n_global samples in all (x: a tensor, or a tuple or dict
    of tensors, workloads.calls). zero_grad=False leaves the
    gradients to the backward (a CUDA graph's capture writes them anew into its pool). mark:
    called with "forward", "backward" and "step" as each phase ends (the profiled step's
    memory by phase, run.components)."""
    mark = mark or (lambda phase: None)
    with autocast():
        losses = variant.losses(x, y, n_global)
    mark("forward")
    if zero_grad:
        optimizer.zero_grad(set_to_none=True)
    losses.optimised.backward()
    mark("backward")
    optimizer.step()
    mark("step")
    return losses
