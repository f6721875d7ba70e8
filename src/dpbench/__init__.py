"""dpbench: single-device, DataParallel and DistributedDataParallel training, measured side by side."""

VARIANTS = ("single", "dp", "dp_mean", "dp_sum", "ddp", "zero1", "fsdp", "hsdp")
DP_VARIANTS = ("dp", "dp_mean", "dp_sum")
DISTRIBUTED_VARIANTS = ("ddp", "zero1", "fsdp", "hsdp")   # one process per rank, under torchrun
SHARDED_VARIANTS = ("zero1", "fsdp", "hsdp")               # ZeRO-1's optimizer state, FSDP2's everything
FSDP_VARIANTS = ("fsdp", "hsdp")                           # torch.distributed.fsdp.fully_shard
