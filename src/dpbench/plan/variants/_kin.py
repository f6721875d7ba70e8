"""What kindred variants share: the wrappers' knobs and refusals that more than one spec lists
(not a variant: the registry takes only modules that declare SPEC)."""
from __future__ import annotations

from dpbench.plan.variants.spec import Knob, Refusal

# DistributedDataParallel's knobs (ddp, and zero1: DDP beside ZeroRedundancyOptimizer). Tuning
# only: runs that differ here measure the same setup.
DDP_KNOBS = (Knob("bucket_cap_mb", changes_setup=False), Knob("gradient_as_bucket_view", changes_setup=False),
             Knob("static_graph", changes_setup=False), Knob("broadcast_buffers", changes_setup=False),
             Knob("find_unused_parameters", changes_setup=False, quiet_at_default=True))
# Every variant with a process group: a bounded wait on peers, and ranks rehearsed on one GPU.
PROCESS_GROUP = (Knob("collective_timeout_s", changes_setup=False, quiet_at_default=True),
                 Knob("rehearse", quiet_at_default=True))
# FSDP2's own: resharding after the forward, and parameters and optimizer state on the host.
FSDP_KNOBS = (Knob("reshard_after_forward", changes_setup=False, quiet_at_default=True),
              Knob("offload", quiet_at_default=True))

NO_COMPILE_UNDER_DATAPARALLEL = Refusal(
    "compile", "torch.compile does not support nn.DataParallel (its replicas are made anew every step, "
               "outside the compiled graph); use compile with single or ddp")
# seen on an H200 (torch 2.11): fully_shard raises NotImplementedError on a conv weight
NO_CHANNELS_LAST_UNDER_FSDP2 = Refusal(
    "channels_last", "FSDP2 refuses non-contiguous parameters (NotImplementedError for channels_last "
                     "weights); run fsdp/hsdp with channels_last: false")
