"""WorkloadSpec: what a workload factory returns, and the sizes a record reports of it
(parameters, bytes of parameters, gradients and optimizer state, model FLOPs per sample); build()
imports a workload's factory and calls it (the registry beside it only resolves names, without torch)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dpbench.results.errors import error_text
from dpbench.workloads.calls import Inputs, Output, call, first_tensor, map_tensors
from dpbench.workloads.registry import WorkloadError, load_factory, resolve

# Optimizer state per trainable parameter, in parameter-sized buffers: SGD with momentum (the
# engine's) keeps the momentum, Adam exp_avg and exp_avg_sq (its step counter is a scalar).
STATE_BUFFERS = {"sgd": 1, "adam": 2}
SAMPLE_UNITS = ("images", "tokens")


@dataclass
class WorkloadSpec:
    """model: trains in place. loss(outputs, targets) -> per-sample losses, a 1-D tensor of the
    batch's length: the engine reduces them (mean, or DataParallel's sum), so the loss stays out
    of forward. batch(generator, n) -> (inputs, targets), CPU tensors with the batch first,
    drawn only from the generator (same seed, same batch); inputs a tensor, or a tuple or dict
    of tensors that forward takes as *x or **x (dpbench.workloads.calls). output: which tensor
    of forward's result the loss takes (a key or attribute name such as "logits", a tuple index,
    or a function of the result); None takes it by calls.output_tensor's rule. dataset: a real dataset's name the
    engine knows ("cifar10"), or None for synthetic only. shard_modules: the submodule types a
    sharded variant wraps one by one (then the root). batch_first: forward's outputs have the
    batch first (DataParallel gathers on dim 0). units_per_sample: images or tokens in one
    sample, for throughput in sample_unit. flops_per_sample: forward + backward, analytic where
    the factory knows it; None has flops() count it on one sample."""
    model: nn.Module
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch: Callable[[torch.Generator, int], tuple[Inputs, torch.Tensor]]
    dataset: str | None = None
    shard_modules: tuple[type[nn.Module], ...] = ()
    batch_first: bool = True
    sample_unit: str = "images"
    units_per_sample: int = 1
    flops_per_sample: float | None = None
    output: Output = None

    def __post_init__(self):
        if self.sample_unit not in SAMPLE_UNITS:
            raise ValueError(f"sample_unit {self.sample_unit!r}: one of {', '.join(SAMPLE_UNITS)}")
        if not (self.output is None or callable(self.output) or isinstance(self.output, (str, int))):
            raise ValueError(f"output {self.output!r}: a key or attribute name, a tuple index, or a function")

    def flops(self) -> float:
        """Model FLOPs per sample, forward + backward: the factory's, or counted once."""
        if self.flops_per_sample is None:
            inputs, _ = self.batch(torch.Generator().manual_seed(0), 1)
            self.flops_per_sample = counted_flops(self.model, inputs)
        return self.flops_per_sample

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def parameter_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @property
    def gradient_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)

    def optimizer_state_bytes(self, optimizer: str = "sgd") -> int:
        return STATE_BUFFERS[optimizer] * self.gradient_bytes

    def sizes(self) -> dict:
        """What a record carries of the workload's size."""
        return {"parameters": self.parameters, "parameter_bytes": self.parameter_bytes,
                "gradient_bytes": self.gradient_bytes,
                **{f"{opt}_state_bytes": self.optimizer_state_bytes(opt) for opt in STATE_BUFFERS},
                "flops_per_sample": self.flops(), "sample_unit": self.sample_unit,
                "units_per_sample": self.units_per_sample}


def counted_flops(model: nn.Module, inputs: Inputs) -> float:
    """Forward + backward FLOPs of one sample: the forward counted (matrix products and
    convolutions, as FlopCounterMode sees them) times 3, backward costing about twice forward.
    Counted in eval mode, so BatchNorm's running statistics stay as they were, with autograd on
    (nn.MultiheadAttention's fused inference path is not counted) and attention in the math
    kernel (on the CPU, the fused one is not counted either)."""
    was_training = model.training
    model.eval()
    try:
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            device = next(model.parameters(), first_tensor(inputs)).device
            call(model, map_tensors(inputs, lambda t: t.to(device)))
    finally:
        model.train(was_training)
    return 3.0 * counter.get_total_flops()


def build(spec: str | Mapping[str, Any] | None, **ctx):
    """The workload's WorkloadSpec: its factory imported and called with its args; ctx are
    arguments the run sets over them (a run's num_classes, say)."""
    name, ref, args = resolve(spec)
    factory = load_factory(ref)
    try:
        built = factory(**{**args, **ctx})
    except Exception as exc:
        raise WorkloadError(f"workload {name!r}: its factory failed: {error_text(exc)}") from exc
    if not isinstance(built, WorkloadSpec):
        raise WorkloadError(f"workload {name!r}: its factory returned a {type(built).__name__}, not a "
                            "dpbench.workloads.spec.WorkloadSpec (return WorkloadSpec(model=..., loss=..., batch=...))")
    return built
