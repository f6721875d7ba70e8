"""Memory by component and traffic by collective, measured on one untimed profiled step.

Memory (one row per rank, the record's `memory_components`): the bytes of the tensors this rank
holds after the step, counted from the tensors themselves (a DTensor's local shard; ZeRO-1's
optimizer state is this rank's partition), so also on the CPU; on CUDA, the allocator's peak
in each phase of the step (forward, backward, optimizer step) and what it holds as each
ends; on the CPU, where asked, the same from the live tensors (run.live_memory).

Collectives (the record's `collectives`, rank 0's): a dispatch mode counts the collectives
CommDebugMode knows, as Python dispatch sees them (FSDP2's all-gathers and reduce-scatters, ZeRO-1's broadcasts, DDP's
all-reduces where the reducer runs them on the step's thread, as on the CPU); this module adds
each op's payload bytes. Where DDP's reducer runs its all-reduces on an autograd thread the mode
does not see (CUDA), its buckets say what they reduce (`ddp_buckets`).
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import _comm_mode as known
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

from dpbench.run.live_memory import LiveTensors
from dpbench.run.step import train_step
from dpbench.run.variants import StepLosses, Variant
from dpbench.workloads.calls import Inputs, first_tensor

MIB = 2 ** 20
PHASES = ("forward", "backward", "step")
ZERO_GRAD = "zero_grad"   # marked between the forward and the backward (run.step.train_step)
# marked as the model's forward returns, before the loss (profiled_step): FSDP2 still holds the
# last unit's all-gather output until its root's forward ends, the loss holds none
MODEL_FORWARD = "model_forward"
# marked as the backward writes its first gradient (profiled_step): the peak from zero_grad to
# there is the backward's start, every gradient freed but that first one. Its level rises with N
# where the gradients are sharded (fsdp's start, issue 38), apart from the backward's later peak.
BACKWARD_START = "backward_start"
# marked as each fully_shard unit but the root ends its backward, FSDP2's post-backward (which
# reduce-scatters its gradients into its shard) included (profiled_step): the backward's later
# part split at every unit, so a peak inside the units (the one at N = 4, issue 38) is seen
# apart from the root's part at the end
BACKWARD_UNIT = "backward_unit_"


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
        self.ops = (set(known.c10d_collective_ops) | set(known.NATIVE_TO_PY_MAPPING)
                    | set(known.NATIVE_TO_PY_MAPPING.values()))
        self.bytes: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)
        self.largest: dict[str, int] = defaultdict(int)   # the largest single op's payload
        self.last: dict[str, int] = {}                     # the latest op's payload

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented   # let DTensor desugar into the collectives counted here
        out = func(*args, **(kwargs or {}))
        packet = getattr(func, "_overloadpacket", None)
        if packet in self.ops:
            name = collective_name(str(packet))
            size = payload_bytes(name, args)
            self.counts[name] += 1
            self.bytes[name] += size
            self.largest[name] = max(self.largest[name], size)
            self.last[name] = size
        return out

    def rows(self) -> list[dict[str, Any]]:
        return [{"collective": n, "count": self.counts[n], "bytes": self.bytes[n]} for n in sorted(self.counts)]


def ddp_buckets(variant: Variant) -> dict[str, Any] | None:
    """DDP's gradient all-reduce of one step, from its buckets (one all-reduce per bucket of the
    gradients' bytes), for where the counter cannot see the reducer's thread; None otherwise."""
    ddp = getattr(variant.module, "_orig_mod", variant.module)   # under torch.compile too
    if not isinstance(ddp, DDP):
        return None
    sizes = str(ddp._get_ddp_logging_data().get("bucket_sizes", ""))   # "bytes, bytes, ..."
    buckets = [int(b) for b in sizes.split(",") if b.strip()]
    return {"collective": "all_reduce", "count": len(buckets), "bytes": sum(buckets),
            "source": "buckets"} if buckets else None


class PhasePeaks:
    """The memory of each phase of the step (forward, backward, optimizer step): its peak and
    what is held as it ends (`<phase>_end_mib`). zero_grad, between the forward and the
    backward, is marked too, so the backward's peak is measured from the level zero_grad left
    (`zero_grad_end_mib`): one that peaks below the forward's end is seen, not hidden. On
    CUDA the allocator's; on the CPU, where asked (`live`), the live tensors PyTorch's
    MemTracker counts, with each peak's bytes by kind (`<phase>_peak_by_kind_mib`) and no
    reserved peak (no cache); else None on the CPU, and no ends."""

    def __init__(self, device: torch.device, live: LiveTensors | None = None):
        self.cuda = device.type == "cuda"
        self.live = live   # the CPU's; CUDA asks its allocator
        self.device, self.peaks, self.ends, self.start = device, {}, {}, 0
        self.kinds: dict[str, dict[str, int]] = {}

    def begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.live is not None:
            self.live.restart_peak()
        self.start = self.level() or 0

    def level(self) -> int | None:
        """The bytes held now (CUDA: allocated; the CPU: the live tensors), None where unmeasured."""
        if self.cuda:
            return torch.cuda.memory_allocated(self.device)
        return self.live.level() if self.live is not None else None

    def mark(self, phase: str) -> None:
        """The peak since the last mark and the level now; a phase marked again (each
        micro-batch's forward and backward) keeps its largest of each."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            for key, value in ((phase, torch.cuda.max_memory_allocated(self.device)),
                               (f"{phase}_reserved", torch.cuda.max_memory_reserved(self.device))):
                self.peaks[key] = max(self.peaks.get(key, 0), value)
            self.ends[phase] = max(self.ends.get(phase, 0), torch.cuda.memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.live is not None:
            peak, kinds, now = self.live.mark(phase)
            if peak >= self.peaks.get(phase, 0):
                self.peaks[phase], self.kinds[phase] = peak, kinds
            self.ends[phase] = max(self.ends.get(phase, 0), now)

    def row(self) -> dict[str, Any]:
        if not self.cuda and self.live is None:
            return {f"{p}_peak_mib": None for p in PHASES} | {"activation_peak_mib": None, "reserved_peak_mib": None}
        # the forward phase takes the model's forward in (MODEL_FORWARD, marked inside it where
        # marked: its own peak is reported apart)
        forward = max(self.peaks["forward"], self.peaks.get(MODEL_FORWARD, 0))
        # the backward's too: its start (BACKWARD_START, where marked), each unit's part
        # (BACKWARD_UNIT) and the rest, apart
        units = sorted((int(k[len(BACKWARD_UNIT):]), v) for k, v in self.peaks.items()
                       if k.startswith(BACKWARD_UNIT) and not k.endswith("_reserved"))
        backward = max([self.peaks["backward"], self.peaks.get(BACKWARD_START, 0), *(v for _, v in units)])
        mib = {"forward_peak_mib": forward / MIB, "backward_peak_mib": backward / MIB,
               "step_peak_mib": self.peaks["step"] / MIB}
        if MODEL_FORWARD in self.peaks:
            mib[f"{MODEL_FORWARD}_peak_mib"] = self.peaks[MODEL_FORWARD] / MIB
            # the rest of the forward phase, the loss's, apart: after the root's forward ends a
            # rank keeping its units holds every one of them there (memory_model)
            mib["loss_peak_mib"] = self.peaks["forward"] / MIB
        if BACKWARD_START in self.peaks:
            mib[f"{BACKWARD_START}_peak_mib"] = self.peaks[BACKWARD_START] / MIB
            mib["backward_late_peak_mib"] = max([self.peaks["backward"], *(v for _, v in units)]) / MIB
        if units:
            # each unit's part: from the unit before it (or the backward's start) to its post-backward's end
            mib["backward_unit_peaks_mib"] = {str(i): v / MIB for i, v in units}
            mib["backward_end_part_peak_mib"] = self.peaks["backward"] / MIB
        activations = max(forward, backward) - self.start
        reserved = max(v for k, v in self.peaks.items() if k.endswith("_reserved")) / MIB if self.cuda else None
        ends = {f"{p}_end_mib": self.ends[p] / MIB for p in (*PHASES, ZERO_GRAD) if p in self.ends}
        by_phase = dict(self.kinds)
        if self.peaks.get(MODEL_FORWARD, 0) > self.peaks["forward"] and MODEL_FORWARD in self.kinds:
            by_phase["forward"] = self.kinds[MODEL_FORWARD]   # the forward's peak was the model's
        if BACKWARD_START in self.kinds:
            late = max([("backward", self.peaks["backward"])] + [(k, self.peaks[k]) for k in self.kinds
                                                                if k.startswith(BACKWARD_UNIT)], key=lambda kv: kv[1])[0]
            by_phase["backward_late"] = self.kinds.get(late, {})
            if self.peaks[BACKWARD_START] > self.peaks[late]:
                by_phase["backward"] = self.kinds[BACKWARD_START]   # the backward's peak was its start
            else:
                by_phase["backward"] = by_phase["backward_late"]
        if MODEL_FORWARD in self.peaks and "forward" in self.kinds:
            by_phase["loss"] = self.kinds["forward"]
        kinds = {f"{p}_peak_by_kind_mib": {k: v / MIB for k, v in by_phase[p].items()}
                 for p in (*PHASES, MODEL_FORWARD, "loss", BACKWARD_START, "backward_late") if p in by_phase}
        unit_kinds = {k[len(BACKWARD_UNIT):]: {kind: v / MIB for kind, v in by.items()}
                      for k, by in self.kinds.items() if k.startswith(BACKWARD_UNIT)}
        if unit_kinds:
            kinds["backward_unit_peaks_by_kind_mib"] = unit_kinds
            kinds["backward_end_part_peak_by_kind_mib"] = {k: v / MIB for k, v in self.kinds.get("backward", {}).items()}
        return mib | {"activation_peak_mib": activations / MIB, "reserved_peak_mib": reserved} | ends | kinds


def own_parameters(units: list[nn.Module]) -> list[list[torch.Tensor]]:
    """Each fully_shard unit's own parameters (in the order given), what one all-gather of it brings: FSDP2's own
    list where the unit has one (its parameter group), else each parameter counted in the
    innermost unit holding it (a unit gathers only the parameters no nested unit manages)."""
    owned: set[int] = set()
    out: dict[int, list[torch.Tensor]] = {}
    for i, unit in sorted(enumerate(units), key=lambda iu: sum(1 for _ in iu[1].parameters())):   # nested first
        group = getattr(getattr(unit, "_get_fsdp_state", lambda: None)(), "_fsdp_param_group", False)
        if group is not False:   # a fully_shard unit: exactly what it manages (None: nothing of its own)
            params = [fp.sharded_param for fp in group.fsdp_params] if group is not None else []
        else:
            params = [p for p in unit.parameters() if id(p) not in owned]
        owned.update(id(p) for p in params)
        out[i] = params
    return [out[i] for i in range(len(units))]   # in the order given


def largest_unit_bytes(units: list[nn.Module]) -> int | None:
    """The largest fully_shard unit's own parameters, unsharded, in bytes as stored (a DTensor
    counts whole): the most one all-gather brings (the memory model scales it to the compute
    dtype). None without units."""
    if not units:
        return None
    return max(sum(p.numel() * p.element_size() for p in params) for params in own_parameters(units))


def optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's state tensors on this rank (ZeRO-1: its own partition's)."""
    local = getattr(optimizer, "optim", optimizer)   # ZeroRedundancyOptimizer wraps the local one
    return [t for state in local.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


def memory_row(variant: Variant, optimizer: torch.optim.Optimizer, peaks: PhasePeaks | None,
               counter: CollectiveCounter | None = None) -> dict[str, Any]:
    """This rank's tensors by component, the largest unit (from the module structure) and the
    largest single all-gather its counter saw (measured; None where nothing was counted)."""
    params = list(variant.bare.parameters())
    unit = largest_unit_bytes(variant.units)
    units = {"unit_mib": [sum(p.numel() * p.element_size() for p in own) / MIB
                          for own in own_parameters(variant.units)]} if variant.units else {}
    return {"parameters_mib": sum(local_bytes(p) for p in params) / MIB, **units,
            "gradients_mib": sum(local_bytes(p.grad) for p in params) / MIB,
            "optimizer_mib": sum(local_bytes(t) for t in optimizer_state(optimizer)) / MIB,
            "largest_unit_mib": None if unit is None else unit / MIB,
            "largest_gather_mib": None if counter is None else counter.largest.get("all_gather", 0) / MIB,
            **(peaks or PhasePeaks(torch.device("cpu"))).row()}


def held_gradient_bytes(variant: Variant) -> int:
    """The gradient bytes this rank holds now, wherever the variant keeps them: the parameters'
    .grad (a DTensor's local shard) and, inside FSDP2, the unsharded gradients it accumulates
    while its reduce-scatter is deferred and HSDP's reduced shards awaiting their deferred
    all-reduce (private attributes, read where they exist)."""
    total = sum(local_bytes(p.grad) for p in variant.bare.parameters())
    for m in variant.bare.modules():
        state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
        group = getattr(state, "_fsdp_param_group", None)
        if group is None:
            continue
        total += local_bytes(getattr(group, "_partial_reduce_output", None))
        for fp in group.fsdp_params:
            unsharded = getattr(fp, "_unsharded_param", None)
            total += local_bytes(getattr(fp, "unsharded_accumulated_grad", None))
            total += local_bytes(unsharded.grad if unsharded is not None else None)
    return total


def gradient_leaves(variant: Variant) -> list[torch.Tensor]:
    """The tensors the backward accumulates gradients into: the module's parameters and, inside
    FSDP2, each unit's unsharded parameters (private, read where they exist: FSDP2 swaps them in
    for the forward and reduce-scatters their gradients into the sharded ones)."""
    leaves = {id(p): p for p in variant.bare.parameters() if p.requires_grad}
    for m in variant.bare.modules():
        state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
        for fp in getattr(getattr(state, "_fsdp_param_group", None), "fsdp_params", None) or ():
            unsharded = getattr(fp, "_unsharded_param", None)
            if isinstance(unsharded, torch.Tensor) and unsharded.requires_grad:
                leaves[id(unsharded)] = unsharded
    return [p for p in leaves.values() if not isinstance(p, DTensor)]   # FSDP2 writes a shard's grad itself


def group_ops() -> int | None:
    """The collectives issued on the default process group so far (its sequence number, which
    counts whatever thread issued them: DDP's reducer on CUDA too); None where unknown."""
    try:
        return int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except Exception:   # no process group, or a backend without the count
        return None


class SavedActivations:
    """Bytes the forward saves for the backward (saved_tensors_hooks), and how many of them were
    saved inside a checkpointed unit's call: where checkpointing works, only the unit's inputs
    (torch.utils.checkpoint keeps them to recompute from; its own hooks take over inside and
    keep nothing), counted as `inputs`."""

    def __init__(self, units: list[nn.Module]):
        self.units, self.depth, self.total, self.inside, self.inputs = units, 0, 0, 0, 0
        self.handles: list[Any] = []

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        n = local_bytes(t)
        self.total += n
        self.inside += n if self.depth else 0
        return t

    def _enter(self, module, args) -> None:
        self.depth += 1
        self.inputs += _payload(list(args))

    def _leave(self, *args) -> None:
        self.depth -= 1

    def __enter__(self) -> "SavedActivations":
        for unit in self.units:
            # innermost: after the unit's other pre-hooks (FSDP2's gathering), before its other hooks
            self.handles += [unit.register_forward_pre_hook(self._enter),
                             unit.register_forward_hook(self._leave, prepend=True)]
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)
        for h in self.handles:
            h.remove()


class StepProbe:
    """What the mechanism checks (run.mechanisms) read of the profiled step, micro-batch by
    micro-batch: the collectives counted in each (forward and backward), the default group's
    collectives in each backward (DDP's gradient all-reduces), the gradient bytes held after
    each backward; the optimizer step's collectives; each phase's host time (synchronised on
    CUDA); the activations saved for the backward."""

    def __init__(self):
        self.micro: list[dict[str, Any]] = []
        self.step: dict[str, int] = {}
        self.phase_ms: dict[str, float] = defaultdict(float)
        self.saved: SavedActivations | None = None
        self.counted = False   # whether the dispatch counter ran
        self._counts: dict[str, int] = {}
        self._forward_ops: int | None = None

    def start(self, counter: CollectiveCounter | None) -> None:
        self.counter, self.counted = counter, counter is not None
        self._counts, self._clock = {}, _now()

    def _since(self) -> dict[str, int]:
        now = dict(self.counter.counts) if self.counter is not None else {}
        diff = {k: v - self._counts.get(k, 0) for k, v in now.items() if v - self._counts.get(k, 0)}
        self._counts = now
        return diff

    def mark(self, phase: str, variant: Variant, device: torch.device) -> None:
        if phase not in PHASES:   # zero_grad: its time and collectives stay in the backward's
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        clock = _now()
        self.phase_ms[phase] += (clock - self._clock) * 1e3
        self._clock = clock
        if phase == "forward":
            self._forward_ops = group_ops()
        elif phase == "backward":
            ops = group_ops()
            self.micro.append({"collectives": self._since(), "gradient_bytes": held_gradient_bytes(variant),
                               "backward_group_ops": None if ops is None or self._forward_ops is None
                               else ops - self._forward_ops})
        elif phase == "step":
            self.step = self._since()


def _now() -> float:
    return time.perf_counter()


def profiled_step(variant: Variant, optimizer: torch.optim.Optimizer, x: Inputs, y: torch.Tensor,
                  n_global: int, autocast, distributed: bool, accumulate: int = 1,
                  probe: StepProbe | None = None, track_cpu: bool = False
                  ) -> tuple[StepLosses, dict[str, Any], list[dict]]:
    """One training step (the engine's train_step, with its micro-batches) with its memory by
    phase and, in a distributed run, its collectives: (losses, this rank's memory row,
    collective rows); `probe`, where given, gets what the mechanism checks read. A compiled
    module (or compiled units) runs without the counter and the saved-activation hooks (a
    dispatch mode around a compiled graph would change what runs): its collectives are DDP's
    buckets alone. `track_cpu`: on the CPU, the memory by phase from the live tensors
    (run.live_memory) in place of None (rehearsed ranks; not with a compiled module)."""
    device = first_tensor(x).device
    compiled = isinstance(variant.module, torch._dynamo.eval_frame.OptimizedModule) or variant.compiled_units
    tracked = track_cpu and device.type == "cpu" and not compiled
    live = LiveTensors(variant, optimizer, (x, y), device) if tracked else None
    peaks = PhasePeaks(device, live)
    counter = CollectiveCounter() if distributed and not compiled else None
    probe = probe or StepProbe()
    saved = SavedActivations(variant.checkpointed) if variant.checkpointed and not compiled else None
    probe.saved = saved

    backward_running: list[bool] = [False]   # from a micro-batch's forward's end to its backward's

    def mark(phase: str) -> None:
        peaks.mark(phase)
        probe.mark(phase, variant, device)
        backward_running[0] = phase in ("forward", ZERO_GRAD)

    kept: dict[str, float] = {}
    unit_start: dict[str, int] = {}
    started: list[bool] = []   # whether the backward wrote its first gradient
    watched: list[bool] = []   # whether the leaves it writes to are hooked

    def unit_begins(*_) -> None:
        # before FSDP2's own pre-forward (prepended to it; not the root, first to run): what the
        # forward holds as the unit starts to gather, the unit before it kept (memory_model)
        if (level := peaks.level()) is not None:
            unit_start["now"] = level

    def first_gradient(_) -> None:
        if not started:
            started.append(True)
            peaks.mark(BACKWARD_START)

    def unit_done(index: int):
        def mark_part(_grad) -> None:
            if started:   # this step's backward, after zero_grad
                peaks.mark(f"{BACKWARD_UNIT}{index}")

        def watch_input(_module, args) -> None:
            # a hook on the input as the unit's caller passes it (prepended: before FSDP2's
            # pre-forward wraps it in the autograd function that runs its post-backward): it
            # fires once the unit's input gradient has passed that post-backward, which wrote
            # the unit's gradient shard, and holds no tensor (a full backward hook would keep
            # the unit's output gradient through its backward)
            if backward_running[0]:   # a checkpointed unit's recompute: its forward's call is watched
                return
            first = next((a for a in args if isinstance(a, torch.Tensor) and a.requires_grad), None)
            if first is not None:
                first.register_hook(mark_part)
        return watch_input

    def model_forward_ended(*_) -> None:
        # after FSDP2's own post-forward hooks: the peak since the step began is the model's
        # forward's; the last all-gather then is the unit whose output FSDP2 kept through it
        peaks.mark(MODEL_FORWARD)
        if not watched:   # once a step: the first micro-batch's backward is the one after zero_grad
            watched.append(True)
            hooks.extend(p.register_post_accumulate_grad_hook(first_gradient) for p in gradient_leaves(variant))
        if counter is not None and "all_gather" in counter.last:
            kept["mib"] = max(kept.get("mib", 0.0), counter.last["all_gather"] / MIB)
        if "now" in unit_start:   # the last unit's start (each micro-batch's: the largest)
            unit_start["last"] = max(unit_start.get("last", 0), unit_start.pop("now"))

    hooks: list[Any] = []
    try:
        with (counter if counter is not None else nullcontext(), saved if saved is not None else nullcontext(),
              live if live is not None else nullcontext()):
            if not compiled:   # once inside the tracker, which registers FSDP2's hooks again as it enters
                hooks += [variant.module.register_forward_hook(model_forward_ended)] + [
                    unit.register_forward_pre_hook(unit_begins, prepend=True) for unit in variant.units[:-1]]
                if variant.units and variant.units[-1] is variant.module:   # fully_shard units, root last
                    hooks += [unit.register_forward_pre_hook(unit_done(i), prepend=True)
                              for i, unit in enumerate(variant.units[:-1])]
            peaks.begin()   # inside the tracker: FSDPMemTracker counts the sharded state as it is entered
            probe.start(counter)
            losses = train_step(variant, optimizer, x, y, n_global, autocast, mark=mark, accumulate=accumulate)
    finally:
        for hook in hooks:
            hook.remove()
    rows = [dict(r, source="counted") for r in counter.rows()] if counter is not None else []
    if distributed and "all_reduce" not in {r["collective"] for r in rows} and (bucketed := ddp_buckets(variant)):
        # as many bucket passes as backwards that issued their all-reduces (one where the
        # deferred sync held), where the group counts them
        ops = [m["backward_group_ops"] for m in probe.micro]
        if ops and None not in ops and len(ops) > 1:
            passes = sum(1 for n in ops if n)
            bucketed = dict(bucketed, count=sum(ops), bytes=bucketed["bytes"] * passes)
        rows = sorted([*rows, bucketed], key=lambda r: r["collective"])
    row = memory_row(variant, optimizer, peaks, counter)
    if counter is not None and not compiled:
        row["forward_last_gather_mib"] = kept.get("mib", 0.0)
    if "last" in unit_start:
        row["forward_last_unit_start_mib"] = unit_start["last"] / MIB
    return losses, row, rows
