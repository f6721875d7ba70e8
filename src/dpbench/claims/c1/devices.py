"""The C1 measurements' devices and steps: which CUDA devices a variant uses in this process, DDP
as one rank of a one-process group, and the two training steps (dpbench.run.step) both measure."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist

from dpbench.claims.c1.verdict import DP_GPUS
from dpbench.run.step import train_step
from dpbench.run.variants import Variant
from dpbench.workloads.resnet import resnet18

STEPS = 2                   # the second step holds the momentum buffers


def devices_for(variant: str) -> int:
    return DP_GPUS if variant in ("dp", "dp_mean", "dp_sum") else 1


def variant_devices(variant: str) -> tuple[list, str | None]:
    """The CUDA devices a variant runs on in this process, or why it cannot ('needs 2 GPUs (found 1)')."""
    n = devices_for(variant)
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < n:
        return [], f"needs {n} GPU{'s' if n > 1 else ''} (found {found})"
    return [torch.device("cuda", i) for i in range(n)], None


@contextmanager
def one_rank(variant: str) -> Iterator[None]:
    """ddp as one rank of a one-process group (its memory is every rank's); nothing for the others."""
    if variant == "ddp":
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def random_batch(batch: int, classes: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels on the first device, where the gpu feed puts a batch."""
    return (torch.randn(batch, 3, 32, 32, device=device),
            torch.randint(0, classes, (batch,), device=device))


def train_steps(variant: str, classes: int, batch: int, devices: list) -> None:
    """STEPS SGD steps with momentum of ResNet18 with `classes` outputs through dpbench's variant
    wrapper and the runs' own step, then every device synchronised. Every tensor is this call's
    own: they are free once it returns or raises."""
    model = resnet18(classes).to(devices[0])
    wrapped = Variant(variant, model, devices, world=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = random_batch(batch, classes, devices[0])
    for _ in range(STEPS):
        train_step(wrapped, opt, x, y, batch)
    for d in devices:
        torch.cuda.synchronize(d)
