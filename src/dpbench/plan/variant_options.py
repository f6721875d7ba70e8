"""Which variant takes which run option: the one table (torch-free), the seed of the variant
registry (DESIGN: one spec per variant, the options it takes and refuses).

Most run options (data, batch, precision, the workload...) apply to every variant. The options
below are one wrapper's knobs: a variant that does not list one ignores it. The plan refuses
such an option where it would only mislabel runs (plan.matrix: a group's options name its runs,
so `hsdp_shard_size: 2` on a ddp run would make a ddp cell that differs from another by nothing);
set in `train:` (an experiment's or a recipe's settings of every run) some variant of the
experiment must take it. experiments/schema.yaml says what each option does; this table is the
only place that says which variants take it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# DistributedDataParallel's knobs: ddp's, and zero1's (DDP beside ZeroRedundancyOptimizer).
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers", "find_unused_parameters")
# A bounded wait on peers, and ranks rehearsed on one GPU: every variant with a process group.
PROCESS_GROUP = ("collective_timeout_s", "rehearse")
# FSDP2's own: resharding after the forward, and parameters and optimizer state on the host.
FSDP_KNOBS = ("reshard_after_forward", "offload")


@dataclass(frozen=True)
class VariantOptions:
    """A variant's own options: the wrapper knobs it takes (every other variant ignores them)."""
    name: str
    takes: tuple[str, ...] = ()


VARIANT_OPTIONS: dict[str, VariantOptions] = {v.name: v for v in (
    VariantOptions("single"),
    VariantOptions("dp"),
    VariantOptions("dp_mean"),
    VariantOptions("dp_sum"),
    VariantOptions("ddp", DDP_KNOBS + PROCESS_GROUP),
    VariantOptions("zero1", DDP_KNOBS + PROCESS_GROUP),
    VariantOptions("fsdp", FSDP_KNOBS + PROCESS_GROUP),
    VariantOptions("hsdp", FSDP_KNOBS + ("hsdp_shard_size",) + PROCESS_GROUP),
)}

# The options some variants take and the others ignore.
SPECIFIC = tuple(dict.fromkeys(o for v in VARIANT_OPTIONS.values() for o in v.takes))


def takers(option: str) -> tuple[str, ...]:
    """The variants that take `option` (every variant for an option no wrapper owns)."""
    if option not in SPECIFIC:
        return tuple(VARIANT_OPTIONS)
    return tuple(v.name for v in VARIANT_OPTIONS.values() if option in v.takes)


def takes(variant: str, option: str) -> bool:
    return variant in takers(option)


def ignored(variant: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """The options `variant` ignores that `options` set to other than their default."""
    return [k for k in SPECIFIC if k in options and options[k] != defaults.get(k) and not takes(variant, k)]


def refusal(where: str, option: str, value: Any, variants: Iterable[str]) -> str:
    """One line: the option, the variants that would ignore it, the variants that take it, the way out."""
    ignoring, taking = list(variants), takers(option)
    return (f"{where} sets {option}={value!r} for {', '.join(ignoring)}, which "
            f"{'ignores' if len(ignoring) == 1 else 'ignore'} it (it is {' and '.join(taking)}'s: "
            f"dpbench/plan/variant_options.py); give it to a group of variants [{', '.join(taking)}], "
            f"or leave it out")
