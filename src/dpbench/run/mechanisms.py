"""Whether each knob a run turned did what it claims, read from its profiled step: the record's
`mechanisms`, one verdict per check (docs/records.md).

    accumulate   sync: the micro-batches of one optimizer step that reduced gradients (expected
                 1, the last); gradients: the gradient bytes held after the first micro-batch's
                 backward against what the deferral keeps (ddp, zero1, fsdp: every gradient
                 whole; hsdp: reduced shards awaiting the replicas' all-reduce)
    checkpoint   bytes saved for the backward inside a checkpointed unit (expected: its inputs,
                 which torch.utils.checkpoint keeps to recompute from, and nothing else)
    offload      parameter and optimizer-state bytes left on the CUDA device (expected 0), with
                 the step's host time by phase
    compile      recompilations by the profiled step (expected 0), graphs and graph breaks

A verdict's `held` is true, false, or null where the run could not count it (a compiled
graph hides its collectives; on the CPU nothing leaves the device). Compare treats one that
held in the baseline and fails in the candidate as a regression (analysis.compare.mechanisms).
"""
from __future__ import annotations

from typing import Any

import torch

from dpbench.plan.config import RunConfig
from dpbench.plan.variants.settings import FSDPSettings
from dpbench.run.components import MIB, StepProbe, local_bytes, optimizer_state
from dpbench.run.knobs import dynamo_counts
from dpbench.run.variants import Variant

GRADIENT_TOLERANCE = 0.10   # held gradient bytes within this of the closed form (shard padding)


def verdict(knob: str, check: str, expected: Any, counted: Any, held: bool | None, text: str) -> dict[str, Any]:
    return {"knob": knob, "check": check, "expected": expected, "counted": counted, "held": held, "text": text}


def mesh_shape(variant: Variant) -> tuple[int, ...]:
    """fsdp/hsdp: the parameters' device mesh (replicas, shard) or (shard,); () otherwise."""
    for p in variant.bare.parameters():
        mesh = getattr(p, "device_mesh", None)
        return tuple(mesh.shape) if mesh is not None else ()
    return ()


def replicas(variant: Variant) -> int:
    shape = mesh_shape(variant)
    return shape[0] if len(shape) == 2 else 1


def reductions(variant: Variant, micro: dict[str, Any]) -> int | None:
    """The gradient reductions one micro-batch issued: DDP's bucket all-reduces (the default
    group's collectives in its backward, which also sees the reducer's thread), FSDP2's
    reduce-scatters and all-reduces, HSDP's all-reduces across replicas (its reduce-scatters
    within a shard group run every micro-batch by design); None where nothing counted them."""
    counts = micro["collectives"]
    if variant.spec.wrapper == "DistributedDataParallel":
        ops = micro["backward_group_ops"]
        return ops if ops is not None else counts.get("all_reduce", 0)
    if replicas(variant) > 1:   # hsdp across replicas
        return counts.get("all_reduce", 0)
    return counts.get("reduce_scatter", 0) + counts.get("all_reduce", 0)


def sync_verdict(variant: Variant, probe: StepProbe, k: int) -> dict[str, Any]:
    ddp = variant.spec.wrapper == "DistributedDataParallel"
    op = "all-reduce" if ddp or replicas(variant) > 1 else "reduce-scatter"
    if variant.spec.shards_parameters and not probe.counted:
        return verdict("accumulate", "sync", 1, None, None,
                       "deferred sync: not counted (compiled units run without the collective counter)")
    per_micro = [reductions(variant, m) for m in probe.micro]
    if None in per_micro or len(per_micro) != k:
        return verdict("accumulate", "sync", 1, None, None, "deferred sync: not counted")
    syncing = [i for i, n in enumerate(per_micro) if n]
    if not syncing:
        return verdict("accumulate", "sync", 1, 0, None,
                       f"deferred sync: no gradient {op} at this world size, nothing to defer")
    counted = len(syncing)
    if counted == 1 and syncing[0] == k - 1:
        return verdict("accumulate", "sync", 1, 1, True,
                       f"deferred sync: 1 {op} pass per optimizer step as planned ({per_micro[-1]} {op}(s) "
                       f"in micro-batch {k} of {k}, none before)")
    why = "the knob did nothing" if counted == k else f"micro-batches {[i + 1 for i in syncing]} synchronised"
    return verdict("accumulate", "sync", 1, counted, False,
                   f"deferred sync: expected 1, counted {counted}: {why} ({per_micro} {op}s per micro-batch)")


def gradient_verdict(variant: Variant, probe: StepProbe) -> dict[str, Any]:
    """The gradient bytes held mid-accumulation against what the deferral keeps."""
    params = list(variant.bare.parameters())
    sharded = variant.spec.shards_parameters
    whole = sum(p.numel() * (4 if sharded else p.element_size()) for p in params)   # FSDP2 reduces in fp32
    keep_shards = replicas(variant) > 1   # hsdp across replicas
    expected = whole / mesh_shape(variant)[-1] if keep_shards else whole
    measured = probe.micro[0]["gradient_bytes"]
    held = abs(measured - expected) <= GRADIENT_TOLERANCE * expected
    form = f"reduced shards (1/{mesh_shape(variant)[-1]})" if keep_shards else "unsharded"
    text = (f"gradients during accumulation: {measured / MIB:.3f} MiB held, {form} as planned "
            f"({expected / MIB:.3f} MiB)")
    if not held:
        text = (f"gradients during accumulation: expected {form} {expected / MIB:.3f} MiB, held "
                f"{measured / MIB:.3f} MiB: the deferral did not keep them as planned")
    return verdict("accumulate", "gradients", round(expected / MIB, 6), round(measured / MIB, 6), held, text)


def checkpoint_verdict(variant: Variant, probe: StepProbe, row: dict[str, Any]) -> dict[str, Any]:
    saved = probe.saved
    units = len(variant.checkpointed)
    if saved is None:
        return verdict("checkpoint", "saved_inside_units", 0, None, None,
                       "activation checkpointing: not counted (compiled units run without the hooks)")
    peak = row.get("activation_peak_mib")
    where = f", activation peak {peak:.1f} MiB" if isinstance(peak, (int, float)) else ""
    outside = (saved.total - saved.inside) / MIB
    expected = round(saved.inputs / MIB, 6)   # checkpoint keeps each unit's inputs, nothing else
    counted = round(saved.inside / MIB, 6)
    if saved.inside <= saved.inputs:
        return verdict("checkpoint", "saved_inside_units", expected, counted, True,
                       f"activation checkpointing: the {units} checkpointed unit(s) kept only their inputs "
                       f"({counted:.3f} MiB; {outside:.3f} MiB saved outside them{where})")
    return verdict("checkpoint", "saved_inside_units", expected, counted, False,
                   f"activation checkpointing: expected the {units} unit(s) to keep only their inputs "
                   f"({expected:.3f} MiB), counted {counted:.3f} MiB saved inside them: the wrapper saved no memory")


def offload_verdict(variant: Variant, optimizer: torch.optim.Optimizer, probe: StepProbe,
                    device: torch.device) -> dict[str, Any]:
    phases = ", ".join(f"{p} {ms:.1f} ms" for p, ms in probe.phase_ms.items())
    if device.type != "cuda":
        return verdict("offload", "device_bytes", 0, None, None,
                       f"offload: the run's device is the CPU, nothing to offload from (step host time: {phases})")
    tensors = [*variant.bare.parameters(), *optimizer_state(optimizer)]
    on_device = sum(local_bytes(t) for t in tensors if t.device.type == "cuda")
    held = on_device == 0
    text = (f"offload: parameters and optimizer state on the host, 0 B on {device}" if held else
            f"offload: expected 0 B of parameters and optimizer state on {device}, counted {on_device / MIB:.1f} MiB")
    return verdict("offload", "device_bytes", 0, round(on_device / MIB, 6), held, f"{text} (step host time: {phases})")


def compile_verdict(cfg: RunConfig, variant: Variant) -> dict[str, Any]:
    counts = dynamo_counts()
    where = "each unit before fully_shard" if variant.compiled_units else "the model"
    held = counts["recompiles"] == 0
    text = (f"compile ({cfg.compile}, {where}): {counts['unique_graphs']} graph(s), {counts['graph_breaks']} "
            f"graph break(s), {counts['recompiles']} recompile(s) by the profiled step")
    return verdict("compile", "recompiles", 0, counts["recompiles"], held,
                   text + ("" if held else ": expected none after the first compile"))


def check(cfg: RunConfig, variant: Variant, optimizer: torch.optim.Optimizer, probe: StepProbe,
          row: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """The verdicts of every knob the run turned ([] where it turned none)."""
    out = []
    if cfg.accumulate > 1 and variant.spec.distributed:
        out += [sync_verdict(variant, probe, cfg.accumulate), gradient_verdict(variant, probe)]
    if cfg.checkpoint == "units":
        out.append(checkpoint_verdict(variant, probe, row))
    if (fsdp := cfg.variant_settings(FSDPSettings)) and fsdp.offload:
        out.append(offload_verdict(variant, optimizer, probe, device))
    if cfg.compile != "none":
        out.append(compile_verdict(cfg, variant))
    return out
