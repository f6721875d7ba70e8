"""ddp and zero1's runtime: DistributedDataParallel with the run's knobs (zero1's sharding is its
optimizer's: run.sharded.make_optimizer)."""
from __future__ import annotations

import inspect

from dpbench.run.variants.base import WrapRequest, Wrapped


def ddp_kwargs(options: dict) -> dict:
    """DistributedDataParallel's keyword arguments for the run's knobs.

    Only what differs from PyTorch's default is passed: recent PyTorch deprecates
    `broadcast_buffers` (any value given warns) in favour of `forward_sync_buffers`, and a
    warning on every run would pollute the runs' warning records. Turning buffer syncing off
    uses the new name where it exists; it still syncs buffers once at construction, which every
    rank's identical seeded initialisation makes a no-op here.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP
    kwargs = dict(options)
    if kwargs.pop("broadcast_buffers", True) is False:
        new_name = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
        kwargs["forward_sync_buffers" if new_name else "broadcast_buffers"] = False
    return kwargs


def wrap(req: WrapRequest) -> Wrapped:
    from torch.nn.parallel import DistributedDataParallel as DDP
    device = req.devices[0]
    module = DDP(req.model, device_ids=[device.index] if device.type == "cuda" else None,
                 **ddp_kwargs(req.settings))
    return Wrapped(module, req.output)
