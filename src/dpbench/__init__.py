"""dpbench: single-device, DataParallel and DistributedDataParallel training, measured side by side."""

VARIANTS = ("single", "dp", "dp_mean", "dp_sum", "ddp", "zero1", "fsdp", "hsdp")
DP_VARIANTS = ("dp", "dp_mean", "dp_sum")
DISTRIBUTED_VARIANTS = ("ddp", "zero1", "fsdp", "hsdp")   # run under torchrun, one process per rank
SHARDED_VARIANTS = ("zero1", "fsdp", "hsdp")
