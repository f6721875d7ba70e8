"""What the closed forms say of C9 where it was not measured (fewer than two GPUs).

`predicted_state_bytes` stands in for dpbench.analysis.memory_model.predicted_bytes(Setting(...))
["state"] (being written on the sharded-tables branch): the bytes a rank holds between steps,

    ddp, zero1   parameters b·P + gradients b·P + DDP's buckets b·P + optimizer 4k·P (zero1: / N)
    fsdp         (parameters + gradients) b·P / N + optimizer 4k·P / N

with k optimizer slots (SGD with momentum: 1). The merge points it at the memory model.
"""
from __future__ import annotations

from typing import Any

GIB = 2 ** 30
SLOT_BYTES = 4


def predicted_state_bytes(variant: str, parameters: int, ranks: int, param_bytes: float = 4.0,
                          optimizer_slots: int = 1) -> float:
    """Per-device bytes of parameters, gradients (and DDP's buckets) and optimizer state."""
    shard = ranks if variant in ("fsdp", "hsdp") else 1
    weights = 2 * param_bytes * parameters / shard
    buckets = param_bytes * parameters if variant in ("ddp", "zero1") else 0.0
    optimizer = SLOT_BYTES * optimizer_slots * parameters / (ranks if variant in ("zero1", "fsdp", "hsdp") else 1)
    return weights + buckets + optimizer


def largest_trainable(variant: str, cap_gib: float, ranks: int, **kw: Any) -> int:
    """The parameter count at which the state alone fills cap_gib per device (no batch fits beyond it)."""
    return int(cap_gib * GIB / predicted_state_bytes(variant, 1, ranks, **kw))


def prediction(parameters: list[int], cap_gib: float, ranks: int = 2) -> dict[str, Any]:
    """Per swept size the state per device of ddp and fsdp on `ranks` GPUs, and where each stops fitting."""
    return {"ranks": ranks, "cap_gib": cap_gib,
            "ddp_limit": largest_trainable("ddp", cap_gib, ranks),
            "fsdp_limit": largest_trainable("fsdp", cap_gib, ranks),
            "sizes": [{"parameters": p,
                       "ddp_state_gib": predicted_state_bytes("ddp", p, ranks) / GIB,
                       "fsdp_state_gib": predicted_state_bytes("fsdp", p, ranks) / GIB} for p in parameters]}
