"""What the closed forms say of C9 where it was not measured (fewer than two GPUs): the bytes a
rank holds between steps (dpbench.analysis.memory_model's `state`: parameters, gradients, DDP's
buckets and the optimizer's slots, each divided as the variant shards it), and the parameter
count at which that state alone fills the memory cap.
"""
from __future__ import annotations

from typing import Any

from dpbench.analysis.memory_model import Setting, predicted_bytes

GIB = 2 ** 30


def predicted_state_bytes(variant: str, parameters: int, ranks: int, param_bytes: float = 4.0,
                          optimizer_slots: int = 1) -> float:
    """Per-device bytes of parameters, gradients (and DDP's buckets) and optimizer state."""
    state = predicted_bytes(Setting(variant=variant, parameters=parameters, param_bytes=param_bytes,
                                    optimizer_slots=optimizer_slots, ranks=ranks))["state"]
    assert state is not None
    return float(state)


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
