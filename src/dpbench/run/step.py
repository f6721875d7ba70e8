"""One training step: the variant's losses (under autocast), then zero_grad, backward and the
optimizer's step; with gradient accumulation, k micro-batches' forward and backward before the
one optimizer step, the gradient synchronisation deferred to the last (run.knobs). The engine
trains with it and tools/device/step_profile.py and the step benchmarks time it, so that a
timing is of the step a run takes."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable

import torch

from dpbench.plan.variants.spec import REPLICA_MEANS_MEAN
from dpbench.run.knobs import deferred_sync
from dpbench.run.variants import StepLosses, Variant
from dpbench.workloads.calls import Inputs, batch_size, map_tensors


def micro_batches(x: Inputs, y: torch.Tensor, k: int) -> list[tuple[Inputs, torch.Tensor]]:
    """This rank's batch in k micro-batches, in order (sizes differing by at most one); inputs
    that are a tuple or dict of tensors are split tensor by tensor."""
    if k == 1:
        return [(x, y)]
    if (n := batch_size(x)) < k:
        raise ValueError(f"accumulate={k} micro-batches from a batch of {n} on this rank: "
                         "each micro-batch needs a sample")
    return [(map_tensors(x, lambda t, i=i: t.tensor_split(k)[i]), part) for i, part in enumerate(y.tensor_split(k))]


def train_step(variant: Variant, optimizer: torch.optim.Optimizer, x: Inputs, y: torch.Tensor,
               n_global: int, autocast: Callable[[], AbstractContextManager] = nullcontext,
               zero_grad: bool = True, mark: Callable[[str], None] | None = None,
               accumulate: int = 1) -> StepLosses:
    """One optimizer step on the batch (x, y) of n_global samples in all (x: a tensor, or a tuple
    or dict of tensors, workloads.calls). zero_grad=False
    leaves the gradients to the backward (a CUDA graph's capture writes them anew into its
    pool). mark: called with "forward" and "backward" as each micro-batch's phases end,
    "zero_grad" once the gradients are freed (the backward's memory is measured from there) and
    "step" after the optimizer's (the profiled step's memory and collectives by phase,
    run.components). accumulate: micro-batches per optimizer step. Every micro-batch's loss is
    scaled by the whole step's n_global (the variant's scaling), so their gradients add up to
    the gradient of the global mean exactly; dp_mean's mean of means takes 1/k more."""
    mark = mark or (lambda phase: None)
    chunks = micro_batches(x, y, accumulate)
    step: StepLosses | None = None
    for i, (xm, ym) in enumerate(chunks):
        # DDP decides in its forward whether the backward synchronises: the whole micro-batch
        # runs in the deferral's scope.
        with deferred_sync(variant, last=i == len(chunks) - 1):
            with autocast():
                losses = variant.losses(xm, ym, n_global)
            if len(chunks) > 1 and variant.spec.loss == REPLICA_MEANS_MEAN:   # a mean of means per micro-batch
                losses = StepLosses(losses.optimised / len(chunks), losses.reported / len(chunks),
                                    losses.global_sum)
            mark("forward")
            if i == 0 and zero_grad:
                optimizer.zero_grad(set_to_none=True)
                mark("zero_grad")
            losses.optimised.backward()
            mark("backward")
        step = losses if step is None else StepLosses(
            losses.optimised, step.reported + losses.reported, step.global_sum + losses.global_sum)
    optimizer.step()
    mark("step")
    assert step is not None
    return step
