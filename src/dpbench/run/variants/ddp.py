"""ddp and zero1's runtime: DistributedDataParallel with the run's knobs (zero1's sharding is its
optimizer's: run.sharded.make_optimizer)."""
from __future__ import annotations

import inspect

from torch.nn.parallel import DistributedDataParallel as DDP

from dpbench.plan.variants.settings import DDPSettings
from dpbench.run.variants.base import WrapRequest, Wrapped


def ddp_kwargs(settings: DDPSettings | None) -> dict:
    """DistributedDataParallel's keyword arguments for the run's DDP settings (None: PyTorch's
    defaults).

    find_unused_parameters only when asked (PyTorch warns when it finds none unused), and
    bucket_cap_mb only when set (None: PyTorch's size). Buffer syncing only when turned off:
    recent PyTorch deprecates `broadcast_buffers` (any value given warns) in favour of
    `forward_sync_buffers`, and a warning on every run would pollute the runs' warning records.
    Turning it off uses the new name where it exists; it still syncs buffers once at
    construction, which every rank's identical seeded initialisation makes a no-op here.
    """
    if settings is None:
        return {}
    kwargs: dict = {"gradient_as_bucket_view": settings.gradient_as_bucket_view,
                    "static_graph": settings.static_graph}
    if settings.find_unused_parameters:
        kwargs["find_unused_parameters"] = True
    if settings.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = settings.bucket_cap_mb
    if not settings.broadcast_buffers:
        new_name = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
        kwargs["forward_sync_buffers" if new_name else "broadcast_buffers"] = False
    return kwargs


def wrap(req: WrapRequest) -> Wrapped:
    device = req.devices[0]
    module = DDP(req.model, device_ids=[device.index] if device.type == "cuda" else None,
                 **ddp_kwargs(req.ddp))
    return Wrapped(module, req.output)
