"""One epoch's per-step values, kept on the device during the epoch and reduced once at its end
into the record's steps and timed steps (no host sync inside the loop)."""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from dpbench.plan import variants
from dpbench.run import measure
from dpbench.run.runlog import log

# The steps a torch.compile mode spends before it runs what it will run from then on: the
# compilation (step 0), and in the modes that use CUDA graphs a warm-up run and the graph's
# recording (steps 1 and 2; seen on an H200 as 47 and 8 ms against 6.7 ms replayed). They are
# never timed and add up to the run's compile_s.
COMPILE_STEPS = {"none": 0, "default": 1, "max-autotune-no-cudagraphs": 1, "reduce-overhead": 3,
                 "max-autotune": 3}



class EpochLog:
    """One epoch's per-step values, kept on the device until the epoch ends."""

    def __init__(self, clock: measure.StepClock):
        self.clock, self.started = clock, time.perf_counter()
        self.sums, self.reported, self.sizes, self.lrs = [], [], [], []
        clock.mark()

    def add(self, losses, n_global: int, lr: float) -> None:
        self.clock.mark()
        self.sums.append(losses.global_sum)
        self.reported.append(losses.reported)
        self.sizes.append(n_global)
        self.lrs.append(lr)


def close_epoch(cfg, ctx, rec, epoch, ep: EpochLog) -> None:
    """Reduce the epoch's per-step values once (no host sync inside the loop) and record them."""
    sums, reported, sizes, lrs = ep.sums, ep.reported, ep.sizes, ep.lrs
    if not sums:
        return
    step_ms = torch.tensor(ep.clock.step_ms(), dtype=torch.float64)
    sums = ctx.all_reduce(torch.stack(sums).double())
    # The slowest rank sets the pace of a synchronous step.
    step_ms = ctx.all_reduce(step_ms.to(ctx.device), dist.ReduceOp.MAX).cpu().tolist()
    loss_global = (sums.cpu() / torch.tensor(sizes, dtype=torch.float64)).tolist()
    # A rank's reported loss is its part of the global one: what the ranks report together is the global.
    ranked = variants.spec(cfg.variant).distributed
    loss_reported = loss_global if ranked else torch.stack(reported).double().cpu().tolist()
    first, timed_before = len(rec.steps), len(rec.timed_ms)
    for i, n in enumerate(sizes):
        step = first + i
        rec.steps.append({"epoch": epoch + 1, "step": step, "loss_global": loss_global[i],
                          "loss_reported": loss_reported[i], "lr": lrs[i], "step_ms": step_ms[i]})
        # Timed: full global batches after the warm-up. An epoch's short last batch is a new
        # shape (with cudnn.benchmark, a new round of autotuning) and would skew the rate. A
        # compiled run's first steps compile (and record CUDA graphs): never timed, whatever
        # the warm-up.
        if step >= max(cfg.warmup_steps, COMPILE_STEPS[cfg.compile]) and n == cfg.global_batch:
            rec.timed_ms.append(step_ms[i])
            rec.timed_batches.append(n)
    bad = [r["step"] for r in rec.steps[first:] if not math.isfinite(r["loss_global"])]
    if bad:
        raise FloatingPointError(f"loss became non-finite at step {bad[0]}")
    if cfg.compile != "none" and first == 0:
        rec.compile_s = sum(step_ms[:COMPILE_STEPS[cfg.compile]]) / 1e3
    n_timed = len(rec.timed_ms) - timed_before
    if n_timed:
        ips = sum(rec.timed_batches[-n_timed:]) / (sum(rec.timed_ms[-n_timed:]) / 1e3)
        log(f"epoch {epoch + 1}: {ips:.0f} images/s over its timed steps (device clock), "
            f"loss {loss_global[-1]:.4f}")
