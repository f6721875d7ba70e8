"""A variant's own config as typed data: the frozen settings dataclasses that specs own (DDP's,
FSDP2's, a process group's), how their fields become the spec's knobs, and how a run's config
is read into them.

Each field is a run option of the schema's `train` (same name, where its type, default and
meaning live); whether it changes the setup and whether old records lack it are the field's
metadata (`knob(...)`), so a key is declared once. A variant with a config of its own declares
its dataclass beside its SPEC and lists it in `config`. Torch-free (planning reads it); RunConfig
keeps the same keys flat, as the record's format (dpbench.plan.config).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Knob:
    """One key of a variant's own config (a run option of the schema's `train`).

    changes_setup: False where runs that differ only in this key measure the same setup (the
    wrapper's tuning; analysis groups them by setup). quiet_at_default: the key came after the
    first records, so a run's config leaves it out at its default (setup and run ids stay)."""
    key: str
    changes_setup: bool = True
    quiet_at_default: bool = False


def knob(*, changes_setup: bool = True, quiet_at_default: bool = False) -> Any:
    """A settings field: a run option of that name, with its Knob's flags as metadata. No
    default here: the schema's is the one (a settings object is read from a run's config)."""
    return dataclasses.field(metadata={"changes_setup": changes_setup, "quiet_at_default": quiet_at_default})


def knobs_of(settings: type) -> tuple[Knob, ...]:
    """The knobs a settings dataclass declares, one a field, in the fields' order."""
    if not (dataclasses.is_dataclass(settings) and settings.__dataclass_params__.frozen):
        raise TypeError(f"{settings!r}: a variant's settings are a frozen dataclass (plan.variants.settings)")
    return tuple(Knob(f.name, f.metadata.get("changes_setup", True), f.metadata.get("quiet_at_default", False))
                 for f in dataclasses.fields(settings))


def read(settings: type[T], options: Any, defaults: Mapping[str, Any] | None = None) -> T:
    """`settings` with the values a run's config gives: a RunConfig (or any object with the
    keys as attributes), or a mapping such as a record's config, whose keys left out at their
    default (quiet_at_default) take `defaults`' value."""
    if isinstance(options, Mapping):
        merged = {**(defaults or {}), **options}
        missing = [f.name for f in dataclasses.fields(settings) if f.name not in merged]
        if missing:
            raise KeyError(f"{settings.__name__}: no value for {missing} in the options nor their defaults")
        values = {f.name: merged[f.name] for f in dataclasses.fields(settings)}
    else:
        values = {f.name: getattr(options, f.name) for f in dataclasses.fields(settings)}
    return settings(**values)


@dataclass(frozen=True)
class DDPSettings:
    """DistributedDataParallel's knobs (ddp, and zero1: DDP beside ZeroRedundancyOptimizer).
    Tuning only: runs that differ here measure the same setup."""
    bucket_cap_mb: float | None = knob(changes_setup=False)   # None: PyTorch's default size
    gradient_as_bucket_view: bool = knob(changes_setup=False)
    static_graph: bool = knob(changes_setup=False)
    broadcast_buffers: bool = knob(changes_setup=False)
    find_unused_parameters: bool = knob(changes_setup=False, quiet_at_default=True)


@dataclass(frozen=True)
class FSDPSettings:
    """FSDP2's own (fsdp, hsdp): resharding after the forward (false: ZeRO-2-like), and the
    parameters and optimizer state on the host (CPUOffloadPolicy: another setup)."""
    reshard_after_forward: bool = knob(changes_setup=False, quiet_at_default=True)
    offload: bool = knob(quiet_at_default=True)

    @property
    def shard_size(self) -> int | None:
        """Ranks per shard group; None: the mesh's own (fsdp's one dimension: every rank)."""
        return None


@dataclass(frozen=True)
class HSDPSettings(FSDPSettings):
    """hsdp's: FSDP2's, and the ranks of a shard group (None: one node's)."""
    hsdp_shard_size: int | None = knob(changes_setup=False, quiet_at_default=True)

    @property
    def shard_size(self) -> int | None:
        return self.hsdp_shard_size


@dataclass(frozen=True)
class ProcessGroupSettings:
    """Every variant with a process group: a bounded wait on peers, and ranks rehearsed on one
    GPU over gloo (memory per rank, no speed: another setup)."""
    collective_timeout_s: float = knob(changes_setup=False, quiet_at_default=True)
    rehearse: bool = knob(quiet_at_default=True)
