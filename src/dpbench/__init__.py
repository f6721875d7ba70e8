"""dpbench: single-device, DataParallel and DistributedDataParallel training, measured side by side.

The variant lists below are read off the variant registry (dpbench.plan.variants), for the
modules that only need a name's group; a question about one variant is its spec's.
"""
from dpbench.plan.variants import all_specs as _specs

VARIANTS = tuple(s.name for s in _specs())
DP_VARIANTS = tuple(s.name for s in _specs() if s.wrapper == "nn.DataParallel")
DISTRIBUTED_VARIANTS = tuple(s.name for s in _specs() if s.distributed)   # one process per rank, under torchrun
SHARDED_VARIANTS = tuple(s.name for s in _specs() if s.sharded)           # ZeRO-1's optimizer state, FSDP2's everything
FSDP_VARIANTS = tuple(s.name for s in _specs() if s.shards_parameters)   # torch.distributed.fsdp.fully_shard
