"""The sharded variants' pieces: FSDP2's wrapping (fsdp, hsdp), the optimizer of every variant
(ZeRO-1's sharded one for zero1, the plain one built after fully_shard for FSDP2), and a full
state dict for the checkpoint. The loss scaling is the DDP variant's (`variants.Variant`): FSDP2
averages gradients over its replicate x shard ranks as DDP does over its ranks. Which variant
shards what, on which mesh, with which optimizer, is its spec's (dpbench.plan.variants).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.optim import ZeroRedundancyOptimizer

from dpbench.analysis.memory_model import rehearsal_misfit as misfit
from dpbench.analysis.memory_model import setting_of
from dpbench.plan import variants
from dpbench.plan.variants.settings import FSDPSettings
from dpbench.run.knobs import compile_units

try:   # public from torch 2.6; torch 2.4 and 2.5 have it under _composable
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - older torch
    from torch.distributed._composable.fsdp import (  # type: ignore
        CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard)


@dataclass
class ShardOptions:
    """How fsdp/hsdp wrap a model. units: the submodule types fully_shard wraps one by one
    (spec.shard_modules), before the root; fsdp: the variant's own settings (resharding after
    the forward, offload to FSDP2's CPUOffloadPolicy, hsdp's shard group: spec.setting(
    FSDPSettings, cfg); None: fully_shard's defaults, the shard group one node's); param_dtype:
    bf16 under MixedPrecisionPolicy (reductions stay fp32), None for fp32. The knobs every
    variant takes (run.knobs): checkpoint each unit's activations (before any wrapping);
    compile: a torch.compile mode for each unit before fully_shard ("none": eager)."""
    units: tuple[type[nn.Module], ...] = ()
    fsdp: FSDPSettings | None = None
    param_dtype: torch.dtype | None = None
    checkpoint: bool = False
    compile: str = "none"


def mesh_shape(variant: str, world: int, shard_size: int | None) -> tuple[int, ...]:
    """A 1-D mesh (fsdp): every rank; a 2-D one (hsdp: replicate, shard): (replicas, shard size),
    the shard group being the ranks of one node unless given."""
    if len(variants.spec(variant).mesh) == 1:
        return (world,)
    shard = shard_size or int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % shard:
        raise ValueError(f"hsdp_shard_size={shard} does not divide the world size {world}")
    return (world // shard, shard)


def shard_model(variant: str, model: nn.Module, device: torch.device, world: int,
                options: ShardOptions) -> list[nn.Module]:
    """fully_shard each unit, then the root, in place; returns the units (the root last). Each
    unit is compiled first where options.compile asks (torchtitan's order: activation
    checkpointing, compile, fully_shard; the Variant checkpointed them already)."""
    own = options.fsdp
    shape = mesh_shape(variant, world, own.shard_size if own else None)
    # made outside FakeTensorMode where one is on (claims.c9.fake): the mesh reads its ranks' values
    with unset_fake_temporarily():
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=variants.spec(variant).mesh)
    policy = (MixedPrecisionPolicy(param_dtype=options.param_dtype, reduce_dtype=torch.float32)
              if options.param_dtype is not None else MixedPrecisionPolicy())
    kwargs = {"mesh": mesh, "reshard_after_forward": own.reshard_after_forward if own else True, "mp_policy": policy}
    if own and own.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    norms = []
    if options.param_dtype is not None:
        # BatchNorm's running statistics stay fp32, and PyTorch's batch norm refuses bf16 weights
        # beside them ("expected scalar type BFloat16 but found Float", seen on the CPU): each
        # norm is a unit of its own that computes in fp32 and hands bf16 on.
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        fp32_norm = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32,
                                         output_dtype=options.param_dtype)
        for norm in norms:
            fully_shard(norm, **{**kwargs, "mp_policy": fp32_norm})
    units = [m for m in model.modules() if options.units and isinstance(m, options.units) and m is not model]
    if options.compile != "none":
        compile_units(model, options.units, options.compile)
    # Nested units from the inside out: fully_shard takes the parameters no unit already manages,
    # so an inner unit wrapped after its outer one would gather what the outer one also gathers.
    for unit in reversed(units):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    if device.type == "cuda":
        # The model came whole onto the device; sharding freed its full parameters, whose cache
        # segments the allocator would keep all run (a segment per large weight, reused only by
        # blocks no larger): memory a model built on the meta device never holds. Where a rank's
        # step is small beside the whole model (large models, many ranks) the step does not
        # reuse them (docs/sharding.md, the allocator replayed: "Reserved without a GPU").
        torch.cuda.empty_cache()
    return [*norms, *units, model]


def rehearsal_misfit(cfg, sizes: dict, device: torch.device) -> str | None:
    """Why the run's rehearsed ranks cannot share their GPU (None when they fit, or not
    rehearsed on CUDA): the ranks on this device times the memory model's per-rank estimate
    (its memory cap where set) against the device's memory."""
    if not cfg.rehearse or device.type != "cuda":
        return None
    s = setting_of({"variant": cfg.variant, "gpus": cfg.gpus, "config": cfg.to_dict(), **sizes})
    if s is None:
        return None
    here = -(-cfg.gpus // torch.cuda.device_count())   # round-robin: the most ranks on one device
    cap = cfg.memory_cap_gib * 2 ** 30 if cfg.memory_cap_gib else None
    return misfit(s, here, torch.cuda.get_device_properties(device).total_memory, cap)


def make_optimizer(variant: str, params, lr: float, momentum: float, weight_decay: float,
                   fused: bool) -> torch.optim.Optimizer:
    """SGD with momentum for every variant; zero1 shards its state over the ranks
    (ZeroRedundancyOptimizer), fsdp/hsdp get it over their DTensor shards (built after
    fully_shard). fused needs the parameters on a device with the fused kernel."""
    kwargs = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, **({"fused": True} if fused else {}))
    if variants.spec(variant).optimizer == "ZeroRedundancyOptimizer":
        return ZeroRedundancyOptimizer(list(params), optimizer_class=torch.optim.SGD, **kwargs)
    return torch.optim.SGD(params, **kwargs)


def full_state_dict(variant: str, model: nn.Module) -> dict | None:
    """The model's weights as whole tensors on the CPU, for the checkpoint. Called on every rank:
    under fsdp/hsdp gathering the shards is a collective; the dict is rank 0's (None elsewhere)."""
    if not variants.spec(variant).shards_parameters:
        return model.state_dict()
    # lazy: about 0.2 s of every run's start-up, for the runs that save a checkpoint
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)) or None

