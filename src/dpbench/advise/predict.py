"""Per setup, the predicted allocated peak, reserved peak and NVML memory per GPU at a per-GPU
batch, and the largest per-GPU batch within a budget: the memory model's closed forms for the
state (analysis.memory_model) plus what the one-rank probe measured (ProbeFacts). Torch-free.

Per GPU, in MiB, at per-GPU batch b with k micro-batches:

    allocated = state + fixed + max(gathered + activations(b / k), step_extra / optimizer_shards)
    reserved  = allocated + reserved_extra
    nvml      = reserved + context + process_group    (process_group: ranks with an NCCL group)

state and gathered are the memory model's (`state`, `unsharded`); fixed is what the probe's
rank held beyond its modelled state (cuBLAS workspaces, the batch); activations(m) is the
straight line through the probe's activation peaks at its two batches (checkpointed units:
their own line); step_extra the optimizer step's temporaries at one rank; reserved_extra and
context the allocator's and the driver's share at the probe's larger batch; process_group NCCL's
own memory at one rank (advise.process_group_probe), for ranks that bring up an NCCL group: each
on a GPU of its own, not rehearsed ranks (gloo, which holds no device memory). Knobs: accumulate
splits the batch (fsdp/hsdp then keep the unsharded gradients between micro-batches);
checkpoint takes the checkpointed line; offload keeps parameters, gradients and optimizer state
on the host, leaving the gathered unit, its prefetch and its gradient on the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dpbench.analysis.memory_model import CONTEXT_BYTES, MIB, Setting, predicted_bytes
from dpbench.plan import variants

GIB = 2 ** 30
BASE_VARIANTS = ("ddp", "zero1", "fsdp", "fsdp-keep", "hsdp")


@dataclass(frozen=True)
class ProbeFacts:
    """What the one-rank probe measured of a workload on the machine at hand (advise.probe)."""
    workload: str
    parameters: int
    param_bytes: float                       # bytes per parameter as stored
    largest_unit_bytes: float | None         # the largest shard unit's own parameters, as stored
    batches: tuple[int, int]                 # the probe's two per-rank batches
    activation_mib: tuple[float, float]      # activation peak (CUDA) or saved-tensor bytes (CPU) at each
    checkpoint_activation_mib: tuple[float, float] | None = None   # the same with checkpointed units
    fixed_mib: float = 0.0                   # held beyond the modelled state at the forward's start
    step_extra_mib: float = 0.0              # the optimizer step's temporaries beyond the state
    reserved_extra_mib: float = 0.0          # reserved peak less allocated peak
    context_mib: float = CONTEXT_BYTES / MIB   # NVML's process memory less reserved (CUDA context)
    # NCCL's own device memory at one rank (advise.process_group_probe), added for ranks that
    # bring up an NCCL group; 0 where not measured (the CPU, no NVML, a failure: `process_group` says)
    process_group_mib: float = 0.0
    step_s: tuple[float, float] | None = None  # seconds per training step at each batch (one rank)
    device: str = "cpu"
    device_name: str = ""
    precision: str = "fp32"
    optimizer_slots: int = 1
    measured: dict[str, Any] = field(default_factory=dict)   # the probe's raw rows, for the record
    process_group: dict[str, Any] = field(default_factory=dict)   # that measurement: NCCL's version, reason

    def line(self, checkpoint: bool = False) -> tuple[float, float]:
        """(intercept, slope) of the activations in the micro-batch, MiB."""
        acts = self.checkpoint_activation_mib if checkpoint and self.checkpoint_activation_mib else self.activation_mib
        (b1, b2), (a1, a2) = self.batches, acts
        slope = (a2 - a1) / (b2 - b1) if b2 != b1 else a2 / b2
        return a2 - slope * b2, max(slope, 0.0)


@dataclass(frozen=True)
class Setup:
    """One data-parallel setup: a variant and its knobs."""
    variant: str                   # ddp, zero1, fsdp, hsdp
    reshard_after_forward: bool = True
    accumulate: int = 1
    checkpoint: bool = False
    offload: bool = False

    @property
    def name(self) -> str:
        base = self.variant + ("-keep" if self.variant in ("fsdp", "hsdp") and not self.reshard_after_forward else "")
        knobs = ([f"accumulate{self.accumulate}"] if self.accumulate > 1 else []) \
            + (["checkpoint"] if self.checkpoint else []) + (["offload"] if self.offload else [])
        return "+".join([base, *knobs])

    def run_options(self) -> dict[str, Any]:
        """The run config's keys for this setup (plan.config.RunConfig)."""
        opts: dict[str, Any] = {"variant": self.variant}
        if self.variant in ("fsdp", "hsdp"):
            opts["reshard_after_forward"] = self.reshard_after_forward
        if self.accumulate > 1:
            opts["accumulate"] = self.accumulate
        if self.checkpoint:
            opts["checkpoint"] = "units"
        if self.offload:
            opts["offload"] = True
        return opts


def setups(has_units: bool, accumulate: int = 1) -> list[Setup]:
    """The setups advise compares: every base variant, each with checkpointing where the workload
    names shard units, fsdp with offload, and each with `accumulate` micro-batches where > 1."""
    base = [Setup("ddp"), Setup("zero1"), Setup("fsdp"), Setup("fsdp", reshard_after_forward=False), Setup("hsdp")]
    out = list(base)
    if has_units:
        out += [replace(s, checkpoint=True) for s in base if s.variant != "hsdp"]
    out += [Setup("fsdp", offload=True)] + ([Setup("fsdp", offload=True, checkpoint=True)] if has_units else [])
    if accumulate > 1:
        out += [replace(s, accumulate=accumulate) for s in list(out)]
    return out


def setting(facts: ProbeFacts, setup: Setup, gpus: int, gpus_per_node: int | None = None,
            param_bytes: float | None = None) -> Setting:
    """The memory model's inputs for this setup on `gpus` GPUs."""
    return Setting(variant=setup.variant, parameters=facts.parameters,
                   param_bytes=facts.param_bytes if param_bytes is None else param_bytes,
                   optimizer_slots=facts.optimizer_slots, ranks=gpus, precision=facts.precision,
                   reshard_after_forward=setup.reshard_after_forward,
                   hsdp_shard_size=(gpus_per_node or gpus) if setup.variant == "hsdp" else None,
                   largest_unit_bytes=facts.largest_unit_bytes)


@dataclass(frozen=True)
class Predicted:
    """One setup's prediction per GPU at a per-GPU batch."""
    setup: Setup
    gpus: int
    batch: int
    state_mib: float
    gathered_mib: float
    activation_mib: float
    allocated_mib: float
    reserved_mib: float
    nvml_mib: float
    process_group_mib: float = 0.0   # NCCL's share of nvml_mib


def nccl_group(facts: ProbeFacts, setup: Setup, rehearsed: bool = False) -> bool:
    """Whether the setup's ranks bring up an NCCL group (run.context's rule): a process per GPU
    (the variant's spec) on CUDA, not rehearsed (rehearsed ranks share a GPU over gloo)."""
    return facts.device == "cuda" and not rehearsed and variants.spec(setup.variant).distributed


def beyond_reserved_mib(facts: ProbeFacts, setup: Setup, rehearsed: bool = False) -> float:
    """What NVML shows of a rank beyond its allocator's reserved memory: the CUDA context, and
    NCCL's own where the rank brings up an NCCL group."""
    return facts.context_mib + (facts.process_group_mib if nccl_group(facts, setup, rehearsed) else 0.0)


def _terms(facts: ProbeFacts, setup: Setup, gpus: int, gpus_per_node: int | None,
           param_bytes: float | None) -> tuple[float, float, float]:
    """(state, gathered, step peak beyond the state) in MiB, the batch left out."""
    s = setting(facts, setup, gpus, gpus_per_node, param_bytes)
    b = predicted_bytes(s)
    unit = (s.largest_unit_bytes or 0.0) * s.compute_bytes / s.param_bytes
    state, gathered = float(b["state"] or 0.0), float(b["unsharded"] or 0.0)
    if b["unsharded"] is None:   # unknown unit: the whole model gathered at worst
        gathered = s.compute_bytes * s.parameters
    if setup.variant in ("fsdp", "hsdp") and setup.accumulate > 1 and s.shard_size > 1:
        state += s.param_bytes * s.parameters * (1 - 1 / s.shard_size)   # unsharded gradients kept
    shards = s.ranks if setup.variant == "zero1" else s.shard_size
    step = facts.step_extra_mib / shards * (s.param_bytes / facts.param_bytes)
    if setup.offload:   # the unit, its prefetch and its gradient on the device; the rest on the host
        state, gathered, step = 0.0, 3 * unit, 0.0
    return state / MIB, gathered / MIB, step


def predict(facts: ProbeFacts, setup: Setup, gpus: int, batch: int, gpus_per_node: int | None = None,
            param_bytes: float | None = None, rehearsed: bool = False) -> Predicted:
    """The setup's allocated, reserved and NVML memory per GPU at per-GPU batch `batch` (`rehearsed`:
    its ranks share a GPU over gloo, so no NCCL group)."""
    state, gathered, step = _terms(facts, setup, gpus, gpus_per_node, param_bytes)
    a0, a1 = facts.line(setup.checkpoint)
    micro = batch / setup.accumulate
    acts = max(0.0, a0 + a1 * micro)
    allocated = state + facts.fixed_mib + max(gathered + acts, step)
    reserved = allocated + facts.reserved_extra_mib
    beyond = beyond_reserved_mib(facts, setup, rehearsed)
    return Predicted(setup, gpus, batch, state, gathered, acts, allocated, reserved, reserved + beyond,
                     beyond - facts.context_mib)


def largest_batch(facts: ProbeFacts, setup: Setup, gpus: int, limit_mib: float, what: str = "nvml",
                  gpus_per_node: int | None = None, param_bytes: float | None = None, rehearsed: bool = False) -> int:
    """The largest per-GPU batch (a multiple of accumulate) whose predicted `what` (nvml,
    reserved or allocated) stays within limit_mib; 0 where not even one micro-batch per step fits."""
    k = setup.accumulate
    state, gathered, step = _terms(facts, setup, gpus, gpus_per_node, param_bytes)
    over = {"allocated": 0.0, "reserved": facts.reserved_extra_mib,
            "nvml": facts.reserved_extra_mib + beyond_reserved_mib(facts, setup, rehearsed)}[what]
    a0, a1 = facts.line(setup.checkpoint)
    base = state + facts.fixed_mib + over
    if base + max(gathered + max(0.0, a0 + a1), step) > limit_mib:
        return 0
    if a1 <= 0:
        return 1 << 20
    micro = math.floor((limit_mib - base - gathered - a0) / a1)
    return max(0, micro) * k


def what_would_fit(facts: ProbeFacts, gpus: int, limit_mib: float, gpus_per_node: int | None = None,
                   max_gpus: int = 4096) -> dict[str, Any]:
    """Where no setup fits one sample: the leanest setup's need, and what would fit instead:
    2 bytes per parameter (bf16 weights), the fewest GPUs fully sharded training fits on, offload."""
    ck = facts.checkpoint_activation_mib is not None
    lean = Setup("fsdp", checkpoint=ck)
    need = predict(facts, lean, gpus, 1, gpus_per_node).nvml_mib
    more = next((n for n in (2 ** i for i in range(1, 13)) if n > gpus and n <= max_gpus
                 and largest_batch(facts, lean, n, limit_mib, gpus_per_node=n) >= 1), None)
    return {"setup": lean.name, "need_mib": need, "limit_mib": limit_mib,
            "bf16_fits": largest_batch(facts, lean, gpus, limit_mib, gpus_per_node=gpus_per_node, param_bytes=2.0) >= 1,
            "bf16_need_mib": predict(facts, lean, gpus, 1, gpus_per_node, param_bytes=2.0).nvml_mib,
            "gpus_needed": more,
            "offload_fits": largest_batch(facts, Setup("fsdp", offload=True, checkpoint=ck), gpus, limit_mib,
                                          gpus_per_node=gpus_per_node) >= 1,
            "offload_need_mib": predict(facts, Setup("fsdp", offload=True, checkpoint=ck), gpus, 1).nvml_mib}
