"""fsdp and hsdp's runtime: FSDP2's fully_shard per unit, then the root, in place, on the spec's
mesh (run.sharded); bf16 through MixedPrecisionPolicy's param_dtype instead of autocast."""
from __future__ import annotations

import dataclasses

from dpbench.run.sharded import ShardOptions, shard_model
from dpbench.run.variants.base import WrapRequest, Wrapped


def wrap(req: WrapRequest) -> Wrapped:
    opts = dataclasses.replace(req.shard or ShardOptions(), param_dtype=req.autocast_dtype)
    units = shard_model(req.spec.name, req.model, req.devices[0], req.world, opts)
    return Wrapped(req.model, req.output, units)   # fully_shard works in place: the model is its own wrapper
