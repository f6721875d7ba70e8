"""fsdp: FSDP2 (fully_shard per block, then the root) over a 1-D mesh of every rank; parameters,
gradients and optimizer state sharded. reshard_after_forward: false is ZeRO-2-like."""
from dpbench.plan.variants._kin import NO_CHANNELS_LAST_UNDER_FSDP2
from dpbench.plan.variants.settings import FSDPSettings, ProcessGroupSettings
from dpbench.plan.variants.spec import PARAM_DTYPE, PROCESS_PER_GPU, RANK_SUM_SCALED, VariantSpec

SPEC = VariantSpec(
    name="fsdp", order=60,
    summary="FSDP2 (`fully_shard` per block, then the root); `reshard_after_forward: false` is ZeRO-2-like",
    layout=PROCESS_PER_GPU, wrapper="fully_shard", runtime="fully_shard", loss=RANK_SUM_SCALED,
    mesh=("shard",), shards=("parameters", "gradients", "optimizer state"), compiles="units",
    mixed_precision=PARAM_DTYPE, config=(FSDPSettings, ProcessGroupSettings), refuses=(NO_CHANNELS_LAST_UNDER_FSDP2,))
