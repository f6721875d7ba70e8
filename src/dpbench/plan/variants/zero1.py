"""zero1: ddp with ZeroRedundancyOptimizer, the optimizer state sharded over the ranks (ZeRO-1)."""
from dpbench.plan.variants.settings import DDPSettings, ProcessGroupSettings
from dpbench.plan.variants.spec import PROCESS_PER_GPU, RANK_SUM_SCALED, VariantSpec

SPEC = VariantSpec(
    name="zero1", order=50,
    summary="`ddp` with `ZeroRedundancyOptimizer`: the optimizer state sharded over the ranks",
    layout=PROCESS_PER_GPU, wrapper="DistributedDataParallel", runtime="ddp", loss=RANK_SUM_SCALED,
    optimizer="ZeroRedundancyOptimizer", shards=("optimizer state",), config=(DDPSettings, ProcessGroupSettings))
