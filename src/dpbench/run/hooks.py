"""What runs beside the training step without being the step: fault injection, the stall guard,
and the choice of which warm-up step is profiled or times the host. The engine's loop calls
each at its place (before the step, after it), so the loop reads as the step's order.
"""
from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager
from typing import Callable

import torch

from dpbench.run import components, mechanisms
from dpbench.run.faults import FAULT_ENV
from dpbench.run.step import train_step
from dpbench.run.variants import StepLosses, Variant
from dpbench.run.waits import Waits
from dpbench.workloads.calls import Inputs


class FaultInjection:
    """The failure FAULT_ENV asks for on this rank: an exception at its step, or (":hang") a rank
    that never joins its peers' next collective, which the collective timeout must end."""

    def __init__(self, rank: int, waits: Waits):
        self.rank, self.waits, self.step, self.hang = rank, waits, None, False
        spec = os.environ.get(FAULT_ENV)
        if spec and not spec.endswith(":exit"):
            at_rank, at_step = (int(v) for v in spec.split(":")[:2])
            self.step = at_step if at_rank == rank else None
            self.hang = spec.endswith(":hang")

    def before_step(self, step: int) -> None:
        if step != self.step:
            return
        if self.hang:
            self.waits.at(f"a hang injected by {FAULT_ENV} at step {step}")
            while True:
                time.sleep(60)
        raise RuntimeError(f"fault injected by {FAULT_ENV} at step {step} on rank {self.rank}")


class StallGuard:
    """Each step after the compiling ones must end within twice the collective timeout, or the
    run ends as a failure naming where it waited (run.waits); compiling is not a stall."""

    def __init__(self, waits: Waits, compile_steps: int, timeout_s: float):
        self.waits, self.compile_steps, self.timeout_s = waits, compile_steps, timeout_s

    def before_step(self, step: int) -> None:
        if step >= self.compile_steps:
            self.waits.arm(2 * self.timeout_s)

    def after_step(self) -> None:
        self.waits.beat()

    def after_epoch(self) -> None:
        self.waits.disarm()   # evaluation and the rest wait only in timed-out collectives


class WarmupProbes:
    """Which untimed steps look inside: one after the first (the first where warm-up leaves only
    one) is profiled (memory by component, collectives, the knobs' mechanisms); up to three later
    ones start from an idle device, timing how long the host takes to issue a step against the
    device's step time (host- or device-bound). Every other step is train_step as it is."""

    def __init__(self, rec, cfg, variant: Variant, optimizer: torch.optim.Optimizer,
                 autocast: Callable[[], AbstractContextManager], device: torch.device, rank: int,
                 distributed: bool, untimed: range):
        self.rec, self.cfg, self.variant, self.opt, self.autocast = rec, cfg, variant, optimizer, autocast
        self.device, self.rank, self.distributed = device, rank, distributed
        self.profile_at = untimed[min(1, len(untimed) - 1)] if untimed else None
        self.host_probes = (set([s for s in untimed if s not in (0, self.profile_at)][-3:])
                            if device.type == "cuda" else set())

    def step(self, step: int, x: Inputs, y: torch.Tensor, n_global: int) -> StepLosses:
        cfg, rec = self.cfg, self.rec
        if step == self.profile_at:
            probe = components.StepProbe()
            losses, row, rec.collectives = components.profiled_step(
                self.variant, self.opt, x, y, n_global, self.autocast, self.distributed, cfg.accumulate, probe)
            rec.memory_components = [dict(row, device=self.rank)]
            rec.mechanisms = mechanisms.check(cfg, self.variant, self.opt, probe, row, self.device)
            return losses
        if step in self.host_probes:
            torch.cuda.synchronize(self.device)
            issued = time.perf_counter()
            losses = train_step(self.variant, self.opt, x, y, n_global, self.autocast, accumulate=cfg.accumulate)
            rec.host_ms.append((time.perf_counter() - issued) * 1e3)
            return losses
        return train_step(self.variant, self.opt, x, y, n_global, self.autocast, accumulate=cfg.accumulate)
