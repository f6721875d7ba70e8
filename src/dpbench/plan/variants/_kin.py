"""What kindred variants share: the refusals that more than one spec lists (their shared configs
are settings.py's classes). Not a variant: the registry takes only modules that declare SPEC."""
from __future__ import annotations

from dpbench.plan.variants.spec import Refusal

NO_COMPILE_UNDER_DATAPARALLEL = Refusal(
    "compile", "torch.compile does not support nn.DataParallel (its replicas are made anew every step, "
               "outside the compiled graph); use compile with single or ddp")
# seen on an H200 (torch 2.11): fully_shard raises NotImplementedError on a conv weight
NO_CHANNELS_LAST_UNDER_FSDP2 = Refusal(
    "channels_last", "FSDP2 refuses non-contiguous parameters (NotImplementedError for channels_last "
                     "weights); run fsdp/hsdp with channels_last: false")
