"""Memory by component and traffic by collective, measured on one untimed profiled step.

Memory (one row per rank, the record's `memory_components`): the bytes of the tensors this rank
holds after the step, counted from the tensors themselves (a DTensor's local shard; ZeRO-1's
optimizer state is this rank's partition), so also on the CPU; on CUDA, the allocator's peak
in each phase of the step (forward, backward, optimizer step).

Collectives (the record's `collectives`, rank 0's): a dispatch mode counts the collectives
CommDebugMode knows, as Python dispatch sees them (FSDP2's all-gathers and reduce-scatters, ZeRO-1's broadcasts, DDP's
all-reduces where the reducer runs them on the step's thread, as on the CPU); this module adds
each op's payload bytes. Where DDP's reducer runs its all-reduces on an autograd thread the mode
does not see (CUDA), its buckets say what they reduce (`ddp_buckets`).
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from dpbench.run.step import train_step
from dpbench.run.variants import StepLosses, Variant
from dpbench.workloads.calls import Inputs, first_tensor

MIB = 2 ** 20
PHASES = ("forward", "backward", "step")


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes this rank holds of a tensor: a DTensor's local shard, a plain tensor whole."""
    if t is None:
        return 0
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def _payload(x: Any) -> int:
    """Bytes of every tensor in a (nested) list of op arguments."""
    if isinstance(x, torch.Tensor):
        return local_bytes(x)
    if isinstance(x, (list, tuple)):
        return sum(_payload(v) for v in x)
    return 0


def collective_name(op: str) -> str:
    """c10d's op name as the record names it: allreduce_ -> all_reduce, _allgather_base_ ->
    all_gather, reduce_scatter_tensor -> reduce_scatter, broadcast_ -> broadcast."""
    bare = op.split(".")[-1].strip("_").removesuffix("_coalesced").removesuffix("_into_tensor")
    bare = bare.removesuffix("_base").removesuffix("_tensor")
    return {"allreduce": "all_reduce", "allgather": "all_gather", "all_gather": "all_gather",
            "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce"}.get(bare, bare)


def payload_bytes(name: str, args: tuple) -> int:
    """The op's payload on this rank: the input of all_reduce/broadcast, the gathered output of
    all_gather, the unreduced input of reduce_scatter. c10d's in-place ops take (outputs,
    inputs, ...) for all_gather and reduce_scatter and (tensors, ...) otherwise."""
    if name == "reduce_scatter" and len(args) > 1 and not isinstance(args[1], (int, str)):
        return _payload(args[1])
    return _payload(args[0]) if args else 0


class CollectiveCounter(TorchDispatchMode):
    """Counts the collectives dispatched in its scope, with each one's payload bytes: the ops
    CommDebugMode counts (its c10d and functional-collective lists), without CommDebugMode's
    module tracker, whose full backward hooks break models that modify an activation in place
    (torchvision's ReLU(inplace=True): "Output 0 of BackwardHookFunction is a view ...")."""

    def __init__(self):
        super().__init__()
        from torch.distributed.tensor.debug import _comm_mode as known
        self.ops = (set(known.c10d_collective_ops) | set(known.NATIVE_TO_PY_MAPPING)
                    | set(known.NATIVE_TO_PY_MAPPING.values()))
        self.bytes: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented   # let DTensor desugar into the collectives counted here
        out = func(*args, **(kwargs or {}))
        packet = getattr(func, "_overloadpacket", None)
        if packet in self.ops:
            name = collective_name(str(packet))
            self.counts[name] += 1
            self.bytes[name] += payload_bytes(name, args)
        return out

    def rows(self) -> list[dict[str, Any]]:
        return [{"collective": n, "count": self.counts[n], "bytes": self.bytes[n]} for n in sorted(self.counts)]


def ddp_buckets(variant: Variant) -> dict[str, Any] | None:
    """DDP's gradient all-reduce of one step, from its buckets (one all-reduce per bucket of the
    gradients' bytes), for where the counter cannot see the reducer's thread; None otherwise."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = getattr(variant.module, "_orig_mod", variant.module)   # under torch.compile too
    if not isinstance(ddp, DDP):
        return None
    sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))   # "bytes, bytes, ..."
    buckets = [int(b) for b in sizes.split(",") if b.strip()]
    return {"collective": "all_reduce", "count": len(buckets), "bytes": sum(buckets)} if buckets else None


class PhasePeaks:
    """The allocator's peak in each phase of the step (CUDA only: None on the CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device, self.peaks, self.start = device, {}, 0

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self, phase: str) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.peaks[phase] = torch.cuda.max_memory_allocated(self.device)
            self.peaks[f"{phase}_reserved"] = torch.cuda.max_memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    def row(self) -> dict[str, float | None]:
        if not self.cuda:
            return {f"{p}_peak_mib": None for p in PHASES} | {"activation_peak_mib": None, "reserved_peak_mib": None}
        mib = {f"{p}_peak_mib": self.peaks[p] / MIB for p in PHASES}
        activations = max(self.peaks["forward"], self.peaks["backward"]) - self.start
        reserved = max(self.peaks[f"{p}_reserved"] for p in PHASES)
        return mib | {"activation_peak_mib": activations / MIB, "reserved_peak_mib": reserved / MIB}


def largest_unit_bytes(units: list[nn.Module]) -> int | None:
    """The largest fully_shard unit's unsharded parameter bytes: each parameter counted in the
    innermost unit holding it (a unit gathers only the parameters no inner unit manages)."""
    if not units:
        return None
    owned: set[int] = set()
    largest = 0
    for unit in sorted(units, key=lambda u: sum(1 for _ in u.parameters())):
        params = [p for p in unit.parameters() if id(p) not in owned]
        owned.update(id(p) for p in params)
        largest = max(largest, sum(p.numel() * p.element_size() for p in params))
    return largest


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors on this rank (ZeRO-1: its own partition's)."""
    local = getattr(optimizer, "optim", optimizer)   # ZeroRedundancyOptimizer wraps the local one
    return [t for state in local.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def memory_row(variant: Variant, optimizer: torch.optim.Optimizer, peaks: PhasePeaks | None) -> dict[str, Any]:
    params = list(variant.bare.parameters())
    unit = largest_unit_bytes(variant.units)
    return {"parameters_mib": sum(local_bytes(p) for p in params) / MIB,
            "gradients_mib": sum(local_bytes(p.grad) for p in params) / MIB,
            "optimizer_mib": sum(local_bytes(t) for t in optimizer_state(optimizer)) / MIB,
            "largest_unit_mib": None if unit is None else unit / MIB,
            **(peaks or PhasePeaks(torch.device("cpu"))).row()}


def profiled_step(variant: Variant, optimizer: torch.optim.Optimizer, x: Inputs, y: torch.Tensor,
                  n_global: int, autocast, distributed: bool) -> tuple[StepLosses, dict[str, Any], list[dict]]:
    """One training step (the engine's train_step) with its memory by phase and, in a
    distributed run, its collectives: (losses, this rank's memory row, collective rows).
    A compiled module runs without the counter (a dispatch mode around a compiled graph would
    change what runs): its collectives are DDP's buckets alone."""
    peaks = PhasePeaks(first_tensor(x).device)
    compiled = isinstance(variant.module, torch._dynamo.eval_frame.OptimizedModule)
    counter = CollectiveCounter() if distributed and not compiled else None
    peaks.begin()
    with counter if counter is not None else nullcontext():
        losses = train_step(variant, optimizer, x, y, n_global, autocast, mark=peaks.mark)
    rows = counter.rows() if counter is not None else []
    if distributed and "all_reduce" not in {r["collective"] for r in rows} and (bucketed := ddp_buckets(variant)):
        rows = sorted([*rows, bucketed], key=lambda r: r["collective"])
    return losses, memory_row(variant, optimizer, peaks), rows
