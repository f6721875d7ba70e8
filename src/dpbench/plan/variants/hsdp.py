"""hsdp: FSDP2 on a 2-D (replicate, shard) mesh: sharded within a shard group of
hsdp_shard_size ranks (one node's by default), replicated across the groups."""
from dpbench.plan.variants._kin import NO_CHANNELS_LAST_UNDER_FSDP2
from dpbench.plan.variants.settings import HSDPSettings, ProcessGroupSettings
from dpbench.plan.variants.spec import PARAM_DTYPE, PROCESS_PER_GPU, RANK_SUM_SCALED, VariantSpec

SPEC = VariantSpec(
    name="hsdp", order=70,
    summary="FSDP2 on a replicate × shard mesh (`hsdp_shard_size` ranks per shard group)",
    layout=PROCESS_PER_GPU, wrapper="fully_shard", runtime="fully_shard", loss=RANK_SUM_SCALED,
    mesh=("replicate", "shard"), shards=("parameters", "gradients", "optimizer state"), compiles="units",
    mixed_precision=PARAM_DTYPE, config=(HSDPSettings, ProcessGroupSettings),
    refuses=(NO_CHANNELS_LAST_UNDER_FSDP2,))
