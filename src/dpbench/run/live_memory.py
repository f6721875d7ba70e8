"""The bytes of the live tensors during a step, by phase, from PyTorch's own MemTracker: where
there is no caching allocator to ask (the CPU), the peak since the last mark and the level at
each mark, with the tracker's breakdown by kind at the peak (run.components.PhasePeaks reads it).

What the tracker counts: every tensor storage an op allocates under its dispatch mode on the
step's thread, and those registered before the step (the module's parameters, buffers and
gradients, the optimizer's state, the step's inputs); a DTensor by its local shard. What it
misses (gloo ranks, a tiny transformer LM, torch 2.14): DDP's (and ZeRO-1's) flat gradient
buckets, which its reducer allocates in C++ before the tracker is entered, unless
gradient_as_bucket_view makes them the gradients' storage. On DDP's second step (the rehearsal's
profiled one) the reducer rebuilds them in the forward: the new buckets are counted from there
(as "Activation"), the old ones never were, so the step's start is their bytes short and the
activation peak their bytes long. On a later step the buckets stay unseen and a tensor of their
size appears in each backward (as "Temp") and outlives the step. FSDP2 and HSDP (1-D and 2-D
meshes): the step's start is exactly the counted shards and inputs; the all-gather outputs and
unsharded parameters are counted by kind; no "Reduce Scatter" kind shows on gloo (the backward's
buffers fall under "Temp"). A backend's own buffers (gloo's) are no tensors and unseen.
"""
from __future__ import annotations

from enum import Enum
from typing import Any

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule

from dpbench.run.variants import Variant

TOTAL = "Total"   # MemTracker's key of the sum over kinds in a device's snapshot
# MemTracker keeps its overall peak here and resets it only on entering; a peak per phase needs
# the same reset at each mark, and there is no public method for it.
PEAK_ATTRIBUTES = ("_peak_mem", "_peak_mem_snap")


def tracker_for(variant: Variant, optimizer: torch.optim.Optimizer, inputs: tuple) -> MemTracker:
    """FSDPMemTracker over a fully_shard root (it tells sharded from unsharded parameters and
    gradients, and the all-gather outputs), else a MemTracker over the
    module, the optimizer's state and the inputs. ZeRO-1's state is its local optimizer's
    (ZeroRedundancyOptimizer's own `state` is empty)."""
    local = getattr(optimizer, "optim", optimizer)
    if isinstance(variant.module, FSDPModule):
        fsdp = FSDPMemTracker(variant.module, local)
        fsdp.track_inputs(inputs)
        return fsdp
    tracker = MemTracker()
    tracker.track_external(variant.module, local, *inputs)
    return tracker


def _kind(key: Any) -> str:
    """A snapshot key (a MemTracker reference-type enum) as its plain name: "Activation"."""
    return str(key.value) if isinstance(key, Enum) else str(key)


class LiveTensors:
    """A context manager around the step: the live bytes on `device` now (`level`), and at
    each mark the peak since the last one with its bytes by kind (`mark`)."""

    def __init__(self, variant: Variant, optimizer: torch.optim.Optimizer, inputs: tuple,
                 device: torch.device):
        self.tracker = tracker_for(variant, optimizer, inputs)
        self.device = device
        missing = [a for a in PEAK_ATTRIBUTES if not isinstance(getattr(self.tracker, a, None), dict)]
        if missing:
            raise RuntimeError(f"torch {torch.__version__}'s MemTracker has no {', '.join(missing)}: "
                               "dpbench.run.live_memory cannot reset its peak at each phase")

    def __enter__(self) -> "LiveTensors":
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.tracker.__exit__(*exc)

    def _on_device(self, snapshot: dict) -> dict[Any, int]:
        return snapshot.get(self.device, {})

    def level(self) -> int:
        """The bytes live now."""
        return self._on_device(self.tracker.get_tracker_snapshot("current")).get(TOTAL, 0)

    def restart_peak(self) -> None:
        """From now on the peak is the live bytes' (what MemTracker's __enter__ does)."""
        now = self.tracker.get_tracker_snapshot("current")
        # private (PEAK_ATTRIBUTES, checked at construction): no public reset of the peak
        self.tracker._peak_mem_snap = now
        self.tracker._peak_mem = {dev: snap[TOTAL] for dev, snap in now.items()}

    def mark(self, phase: str) -> tuple[int, dict[str, int], int]:
        """The most bytes live at once since the last mark, those bytes by kind (the tracker's
        names: "Activation", "Unsharded Param", ...; kinds holding none left out) and the bytes
        live now; then the peak restarts. After a backward the per-module stats go (the next
        micro-batch's forward calls the root again, which MemTracker refuses while it keeps
        them; none is read here)."""
        snap = self._on_device(self.tracker.get_tracker_snapshot("peak"))
        peak, kinds = snap.get(TOTAL, 0), {_kind(k): v for k, v in snap.items() if k != TOTAL and v}
        now = self.level()
        self.restart_peak()
        if phase == "backward":
            self.tracker.reset_mod_stats()
        return peak, kinds, now
