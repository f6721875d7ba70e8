"""ddp: DistributedDataParallel, one process per GPU under torchrun; its bucket knobs its own."""
from dpbench.plan.variants.settings import DDPSettings, ProcessGroupSettings
from dpbench.plan.variants.spec import PROCESS_PER_GPU, RANK_SUM_SCALED, VariantSpec

SPEC = VariantSpec(
    name="ddp", order=40, summary="`DistributedDataParallel`, one process per GPU, under `torchrun`",
    layout=PROCESS_PER_GPU, wrapper="DistributedDataParallel", runtime="ddp", loss=RANK_SUM_SCALED,
    sync_batchnorm=True, config=(DDPSettings, ProcessGroupSettings))
