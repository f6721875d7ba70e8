"""The process layout of one run: the devices this process drives and its place in a DDP group,
with the process group opened and closed around the training."""
from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from dpbench.plan import variants
from dpbench.plan.config import RunConfig
from dpbench.plan.skips import world_mismatch
from dpbench.plan.variants.settings import ProcessGroupSettings
from dpbench.plan.variants.spec import ALL_DEVICES_ONE_PROCESS
from dpbench.run.waits import Waits


def uses_cuda(cfg: RunConfig) -> bool:
    return cfg.device != "cpu" and torch.cuda.is_available()


class Context:
    """Process layout: the devices this process drives, and its place in a DDP group. A context
    manager: the process group is opened on entry and closed on exit, whatever happened."""

    def __init__(self, cfg: RunConfig, waits: Waits | None = None):
        self.cfg, self.waits = cfg, waits or Waits()
        self.distributed = "LOCAL_RANK" in os.environ
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.rank = int(os.environ.get("RANK", 0))
        local = int(os.environ.get("LOCAL_RANK", 0))
        if self.distributed and (mismatch := world_mismatch(cfg, self.world)):
            raise ValueError(mismatch)
        cuda = uses_cuda(cfg)
        # its process group's settings: every variant that runs ranks lists them (None elsewhere)
        self.group = cfg.variant_settings(ProcessGroupSettings)
        if self.distributed and self.group is None:
            raise ValueError(f"{cfg.variant} runs ranks but its spec lists no ProcessGroupSettings (plan.variants)")
        rehearsed = self.group is not None and self.group.rehearse
        if variants.spec(cfg.variant).layout == ALL_DEVICES_ONE_PROCESS:
            self.devices = [torch.device("cuda", i) for i in range(cfg.gpus)]
        elif cuda:   # rehearsed ranks share the visible GPU(s), round-robin
            self.devices = [torch.device("cuda", local % torch.cuda.device_count() if rehearsed else local)]
        else:
            self.devices = [torch.device("cpu")]
        self.device = self.devices[0]

    def __enter__(self) -> "Context":
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)   # before the process group: NCCL binds to it
            cap = self.cfg.memory_cap_gib
            # The same answer on any card (a largest-batch search). A fraction of the device for
            # this process's allocator alone: rehearsed ranks sharing a GPU are capped each.
            for d in self.devices if cap else ():
                total = torch.cuda.get_device_properties(d).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total), d)
        if self.distributed and self.group is not None:
            # NCCL refuses two ranks on one GPU (ncclInvalidUsage): rehearsed ranks use gloo on CUDA tensors.
            nccl = self.device.type == "cuda" and not self.group.rehearse
            self.waits.at("process group set-up (init_process_group)")
            # Every wait on a peer is bounded: a rank that never joins ends the run as a failure.
            dist.init_process_group("nccl" if nccl else "gloo", device_id=self.device if nccl else None,
                                    timeout=timedelta(seconds=self.group.collective_timeout_s))
        return self

    def __exit__(self, *exc) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(t, op=op)
        return t

    def gather(self, obj):
        """Every rank's object, on every rank (one item when not distributed)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out
