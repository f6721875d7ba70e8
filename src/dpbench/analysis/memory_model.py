"""What each variant should hold per device, in closed form, beside what a run measured.

Per device, with P parameters of b bytes each as stored (4 in fp32; the record's param_bytes / P),
k optimizer slots of 4 bytes (SGD with momentum 1, without 0, Adam 2), N ranks:

    single, dp*, ddp   parameters b·P, gradients b·P, optimizer 4k·P
    zero1              the optimizer term divided by N (ZeroRedundancyOptimizer's partition)
    fsdp               all three divided by N, plus the largest unit's unsharded parameters while
                       it computes; with reshard_after_forward false every unit's unsharded
                       parameters stay from the forward to the backward
    hsdp               as fsdp, divided by the shard group's size S (hsdp_shard_size, else N)

Unsharded parameters are in the compute dtype: 2 bytes under bf16 (MixedPrecisionPolicy's bf16
parameters, fp32 reduction), b otherwise. The state is what a rank holds between steps: the
three terms plus DDP's gradient buckets (b·P, unless gradient_as_bucket_view), compared with
the allocated bytes as the profiled step's forward began.
Numbers only (torch-free); docs/sharding.md says what each term leaves out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

MIB = 2 ** 20
SLOT_BYTES = 4          # optimizer state is fp32 (the parameters as stored)
BF16_BYTES = 2
TOLERANCE = 0.05        # a component further than this from its prediction is flagged
# What the closed forms predict (the table's predicted_<name>_mib), and which of them a record
# measures too (its <name>_mib; state: measured_state).
PREDICTED = ("parameters", "gradients", "optimizer", "buckets", "state", "unsharded")
COMPARED = ("parameters", "gradients", "optimizer", "state")
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class Setting:
    """What the closed forms need to know of a run."""
    variant: str
    parameters: int
    param_bytes: float = 4.0            # bytes per parameter as stored
    optimizer_slots: int = 1
    ranks: int = 1
    precision: str = "fp32"
    reshard_after_forward: bool = True
    hsdp_shard_size: int | None = None
    largest_unit_bytes: float | None = None     # the largest fully_shard unit, unsharded
    gradient_as_bucket_view: bool = False

    @property
    def shard_size(self) -> int:
        """How many ranks share one copy of the state."""
        if self.variant == "hsdp" and self.hsdp_shard_size:
            return self.hsdp_shard_size
        return self.ranks if self.variant in ("fsdp", "hsdp") else 1

    @property
    def compute_bytes(self) -> float:
        """Bytes per unsharded parameter while a sharded unit computes."""
        return BF16_BYTES if self.precision == "bf16" and self.variant in ("fsdp", "hsdp") else self.param_bytes


def optimizer_slots(config: Mapping[str, Any]) -> int:
    """k: state tensors per parameter of the run's optimizer (SGD keeps momentum only when > 0)."""
    name = str(config.get("optimizer") or "sgd").lower()
    if name == "sgd":
        return 1 if (config.get("momentum") or 0) > 0 else 0
    return OPTIMIZER_SLOTS.get(name, 0)


def predicted_bytes(s: Setting) -> dict[str, float | None]:
    """Bytes per device: parameters, gradients, optimizer state, DDP's gradient buckets, their sum
    (`state`: what a rank holds between steps, the last step's gradients included, since the
    step zeroes them after its forward), and the unsharded parameters a sharded variant adds
    while it computes (`unsharded`; None where the largest unit is not known)."""
    shard = s.shard_size
    params = s.param_bytes * s.parameters / shard
    grads = s.param_bytes * s.parameters / shard
    optimizer = SLOT_BYTES * s.optimizer_slots * s.parameters / (s.ranks if s.variant == "zero1" else shard)
    buckets = 0.0 if s.variant not in ("ddp", "zero1") or s.gradient_as_bucket_view \
        else s.param_bytes * s.parameters   # DDP's flat buckets beside the .grad tensors
    unsharded: float | None = 0.0
    if s.variant in ("fsdp", "hsdp"):
        unsharded = s.compute_bytes * s.parameters if not s.reshard_after_forward else s.largest_unit_bytes
    return {"parameters": params, "gradients": grads, "optimizer": optimizer, "buckets": buckets,
            "state": params + grads + optimizer + buckets, "unsharded": unsharded}


def setting_of(record: Mapping[str, Any], largest_unit_mib: float | None = None) -> Setting | None:
    """The closed forms' inputs from a record (its config and sizes); None without its sizes."""
    cfg = record.get("config") or {}
    parameters, param_bytes = record.get("parameters"), record.get("param_bytes")
    if not parameters or not param_bytes:
        return None
    ranks = int(record.get("gpus") or 1)
    nodes = int((record.get("launch") or {}).get("nodes") or 1)
    return Setting(variant=str(record.get("variant")), parameters=int(parameters),
                   param_bytes=param_bytes / parameters, optimizer_slots=optimizer_slots(cfg),
                   ranks=ranks, precision=str(cfg.get("precision", "fp32")),
                   reshard_after_forward=bool(cfg.get("reshard_after_forward", True)),
                   # hsdp_shard_size null: the ranks of one node
                   hsdp_shard_size=cfg.get("hsdp_shard_size") or max(1, ranks // nodes),
                   largest_unit_bytes=None if largest_unit_mib is None else largest_unit_mib * MIB,
                   gradient_as_bucket_view=bool(cfg.get("gradient_as_bucket_view", False)))


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB


def measured_state(row: Mapping[str, Any]) -> float | None:
    """What the device held as the profiled step's forward began (MiB), the dataset on it left
    out: the forward-backward peak less the activation peak (measured from that start)."""
    peaks = [row.get(k) for k in ("forward_peak_mib", "backward_peak_mib") if is_number(row.get(k))]
    activations = row.get("activation_peak_mib")
    if not peaks or not is_number(activations):
        return None
    data = row.get("data_mib")
    return max(peaks) - activations - (data if is_number(data) else 0.0)


def predicted_row(record: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, float | None]:
    """One device's predicted components in MiB (the table's predicted_<component>_mib); None
    where the record lacks the sizes the closed forms need."""
    s = setting_of(record, row.get("largest_unit_mib"))
    b = predicted_bytes(s) if s is not None else {}
    return {f"predicted_{c}_mib": _mib(b.get(c)) for c in PREDICTED}


def comparison(rows: list[Mapping[str, Any]], tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """Measured against predicted per run, device and component (rows of memory_components.csv):
    the relative difference (measured / predicted - 1) and whether it lies beyond the tolerance.
    A component either side lacks is left out; a zero prediction compares by equality."""
    out = []
    for row in rows:
        for c in COMPARED:
            measured, predicted = row.get(f"{c}_mib"), row.get(f"predicted_{c}_mib")
            if not is_number(measured) or not is_number(predicted):
                continue
            rel = (measured / predicted - 1.0) if predicted else (0.0 if measured == 0 else float("inf"))
            out.append({**{k: row.get(k) for k in ("run_id", "variant", "gpus", "options", "device")},
                        "component": c, "measured_mib": measured, "predicted_mib": predicted,
                        "relative_difference": rel, "beyond_tolerance": abs(rel) > tolerance})
    return out


def is_number(value: Any) -> bool:
    """A measured number (not None, a flag or NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
