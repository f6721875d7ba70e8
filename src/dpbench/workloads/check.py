"""A workload's factory validated on the CPU in seconds, the first part of `dpbench check-workload`
(dpbench.run.check_workload, which then trains it through the engine's own step): it builds the
workload, draws a batch of 2 twice from one seed (the same batch both times), runs one forward
(workloads.calls: inputs a tensor, a tuple or a dict; the output's tensor by its rule) and
backward, and reports the sizes and the batch's shapes; a problem is a WorkloadError of one line.

The loss must be per-sample: a 1-D tensor with one finite loss per sample of the batch (the
engine takes their mean, or DataParallel's sum); a scalar is refused, since neither reduction
can be taken of it."""
from __future__ import annotations

import torch

from dpbench.results.errors import error_text
from dpbench.workloads.calls import InputError, call, equal, output_tensor, tensors
from dpbench.workloads.registry import WorkloadError, resolve
from dpbench.workloads.spec import build

BATCH = 2


def _shape(t) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def _run(what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        raise WorkloadError(f"{what} failed: {error_text(exc)}") from exc


def _inputs_shape(x) -> str:
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_shape(v)}" for k, v in x.items()) + "}"
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(_shape(t) for t in tensors(x)) + ")"
    return _shape(x)


def check(spec, seed: int = 0) -> list[str]:
    """The report's lines; raises WorkloadError naming what is wrong. (`dpbench check-workload`,
    dpbench.run.check_workload, then trains two steps of it through the engine's variants.)"""
    name = resolve(spec)[0]
    w = build(spec)
    drawn = _run("the batch maker", w.batch, torch.Generator().manual_seed(seed), BATCH)
    if not (isinstance(drawn, (tuple, list)) and len(drawn) == 2):
        raise WorkloadError(f"the batch maker returned a {type(drawn).__name__}, not (inputs, targets)")
    inputs, targets = drawn
    try:
        parts = [("inputs", t) for t in tensors(inputs)]
    except InputError as exc:
        raise WorkloadError(f"the batch maker's {exc}") from None
    if not isinstance(targets, torch.Tensor):
        raise WorkloadError(f"the batch maker's targets are a {type(targets).__name__}, not a tensor")
    for role, t in (*parts, ("targets", targets)):
        if t.ndim == 0 or t.shape[0] != BATCH:
            raise WorkloadError(f"the batch maker's {role} have shape {tuple(t.shape)}: asked for {BATCH} "
                                f"samples, it must put them first ({BATCH}, ...)")
    again = w.batch(torch.Generator().manual_seed(seed), BATCH)
    if not (equal(inputs, again[0]) and torch.equal(targets, again[1])):
        raise WorkloadError("the batch maker is not deterministic: one seed gave two batches "
                            "(draw only from the generator it is given)")
    w.model.train()
    raw = _run("the model's forward on the batch (does the batch match the model?)", call, w.model, inputs)
    outputs = _run("taking the loss's tensor from forward's result", output_tensor, raw, w.output)
    if w.batch_first and (outputs.ndim == 0 or outputs.shape[0] != BATCH):
        raise WorkloadError(f"the model's outputs have shape {tuple(outputs.shape)}: batch_first is set "
                            f"but they do not start with the batch ({BATCH})")
    loss = _run("the loss on the model's outputs", w.loss, outputs.float(), targets)
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(f"the loss returned a {type(loss).__name__}, not a tensor")
    if tuple(loss.shape) != (BATCH,):
        raise WorkloadError(f"the loss has shape {tuple(loss.shape)}: it must be per-sample, shape ({BATCH},) "
                            "(e.g. F.cross_entropy(..., reduction='none')); the engine takes the mean or sum")
    if not torch.isfinite(loss).all():
        raise WorkloadError(f"the loss is not finite: {loss.tolist()}")
    _run("backward", loss.mean().backward)
    trainable = [p for p in w.model.parameters() if p.requires_grad]
    if not any(p.grad is not None for p in trainable):
        raise WorkloadError("backward reached no parameter: the loss does not depend on the model")
    sizes = w.sizes()
    return [f"workload {name}: ok",
            f"parameters {sizes['parameters']:,} ({sizes['parameter_bytes'] / 2**20:,.1f} MiB; gradients "
            f"{sizes['gradient_bytes'] / 2**20:,.1f} MiB; SGD momentum {sizes['sgd_state_bytes'] / 2**20:,.1f} MiB, "
            f"Adam {sizes['adam_state_bytes'] / 2**20:,.1f} MiB)",
            f"model FLOPs per sample (forward + backward) {sizes['flops_per_sample']:.4g}; "
            f"throughput counts {w.sample_unit}, {w.units_per_sample} a sample",
            f"batch of {BATCH}: inputs {_inputs_shape(inputs)}, targets {_shape(targets)}; "
            f"loss per sample {[round(v, 4) for v in loss.tolist()]}",
            f"dataset {w.dataset or 'synthetic only'}; batch_first {w.batch_first}; shard_modules "
            f"{', '.join(t.__name__ for t in w.shard_modules) or 'none (the root only)'}"]


