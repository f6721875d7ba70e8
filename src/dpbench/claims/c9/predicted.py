"""What the closed forms say of C9: the bytes a rank holds between steps (dpbench.analysis.
memory_model's `state`: parameters, gradients, DDP's gradient buckets and the optimizer's slots,
each divided as the variant shards it), the parameter count at which that state alone fills a
budget, and the largest batch a budget leaves for the activations.

The budgets name real devices: what PyTorch may allocate on such a card, its memory as CUDA
reports it less a CUDA context and cuBLAS's workspaces (~0.5 GiB; measured on the H200 as the
66-74 MiB of workspaces plus the context NVML shows).
"""
from __future__ import annotations

import math
from typing import Any

from dpbench.analysis.memory_model import MIB, Setting, predicted_bytes

GIB = 2 ** 30
# name -> (GiB PyTorch may allocate per rank, the devices it stands for)
BUDGETS = {"24GB": (22.0, "a 24 GB card (RTX 4090, L4, A10G: 22.5-24 GiB to CUDA)"),
           "16GB": (14.0, "a 16 GB card (T4, V100-16GB: 14.6-15.8 GiB to CUDA)")}
BUDGET_GIB = {name: gib for name, (gib, _) in BUDGETS.items()}   # what PyTorch may allocate, by budget


def predicted_state_bytes(variant: str, parameters: int, ranks: int, param_bytes: float = 4.0,
                          optimizer_slots: int = 1) -> float:
    """Per-device bytes of parameters, gradients (and DDP's buckets) and optimizer state."""
    state = predicted_bytes(Setting(variant=variant, parameters=parameters, param_bytes=param_bytes,
                                    optimizer_slots=optimizer_slots, ranks=ranks))["state"]
    assert state is not None
    return float(state)


def bytes_per_parameter(variant: str, ranks: int, **kw: Any) -> float:
    """The state's bytes per parameter on one rank (fp32 SGD with momentum: ddp 16, its buckets
    4 of them; fsdp 12/N)."""
    return predicted_state_bytes(variant, 1, ranks, **kw)


def largest_trainable(variant: str, cap_gib: float, ranks: int, **kw: Any) -> int:
    """The parameter count at which the state alone fills cap_gib per device (no batch fits beyond it)."""
    return int(cap_gib * GIB / bytes_per_parameter(variant, ranks, **kw))


def peak_state_bytes(s: Setting, backward: bool) -> float:
    """What a rank holds beside its activations at its step's peak: the state, less its gradients
    where the peak is the backward's (the step frees them with zero_grad before its backward),
    plus the units it holds unsharded then (memory_model's held_at_peak)."""
    b = predicted_bytes(s)
    return float(b["state"] or 0) - (float(b["gradients"] or 0) if backward else 0.0) + float(b["held_at_peak"] or 0)


def predicted_largest_batch(s: Setting, cap_gib: float, per_sample_mib: float, overhead_mib: float,
                            backward: bool = True) -> int:
    """The largest per-rank batch the model predicts within cap_gib: what the rank holds at its
    peak besides activations (peak_state_bytes; `backward`: the peak is the backward's) leaves
    of the budget, less the overhead (allocator and workspaces, measured at one rank), over the
    activations of one sample (measured at one rank: they do not depend on N at a fixed
    per-rank batch). 0 where the state alone does not fit."""
    left = cap_gib * GIB / MIB - peak_state_bytes(s, backward) / MIB - overhead_mib
    return max(0, math.floor(left / per_sample_mib)) if per_sample_mib > 0 else 0


def prediction(parameters: list[int], cap_gib: float, ranks: int = 2) -> dict[str, Any]:
    """Per swept size the state per device of ddp and fsdp on `ranks` GPUs, and where each stops fitting."""
    return {"ranks": ranks, "cap_gib": cap_gib,
            "ddp_bytes_per_parameter": bytes_per_parameter("ddp", ranks),
            "fsdp_bytes_per_parameter": bytes_per_parameter("fsdp", ranks),
            "ddp_limit": largest_trainable("ddp", cap_gib, ranks),
            "fsdp_limit": largest_trainable("fsdp", cap_gib, ranks),
            "sizes": [{"parameters": p,
                       "ddp_state_gib": predicted_state_bytes("ddp", p, ranks) / GIB,
                       "fsdp_state_gib": predicted_state_bytes("fsdp", p, ranks) / GIB} for p in parameters]}
