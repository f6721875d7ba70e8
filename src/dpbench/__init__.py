"""dpbench: single-device, DataParallel and DistributedDataParallel training, measured side by side."""

VARIANTS = ("single", "dp", "dp_mean", "dp_sum", "ddp")
DP_VARIANTS = ("dp", "dp_mean", "dp_sum")
