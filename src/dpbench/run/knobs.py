"""The knobs people turn on a data-parallel run, each as the variant applies it: gradient
accumulation's deferred synchronisation, activation checkpointing of the shard units, and
torch.compile of each unit before fully_shard (fsdp, hsdp). Whether each did what it claims is
`run.mechanisms`'s to say.

PLANT_ENV=accumulate-noop plants the published silent failure (NVIDIA/cosmos-framework#161):
the deferred synchronisation does nothing, so every micro-batch synchronises. The gradients stay
right (a sum of reduced gradients is the reduced sum); only the mechanism check can see it.
PLANT_ENV=checkpoint-noop: the units are named checkpointed and nothing is recomputed
(pytorch#82293's wrapper that saved no memory). Comma-separated, both.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Iterator

import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

PLANT_ENV = "DPBENCH_PLANT"
NOOP_SYNC = "accumulate-noop"
NOOP_CHECKPOINT = "checkpoint-noop"   # the wrapper that saved no memory (pytorch#82293)


def planted(name: str) -> bool:
    return name in os.environ.get(PLANT_ENV, "").split(",")


def _ddp(module: nn.Module):
    """The DistributedDataParallel under a compiled module (None for other wrappers)."""
    inner = getattr(module, "_orig_mod", module)
    return inner if isinstance(inner, DDP) else None


def _replicas(root: nn.Module) -> int:
    """hsdp: the replicas of its (replicate, shard) mesh; 1 for fsdp's one dimension."""
    mesh = getattr(next(root.parameters(), None), "device_mesh", None)
    return mesh.shape[0] if mesh is not None and mesh.ndim == 2 else 1


@contextmanager
def _fsdp_deferred(root: nn.Module) -> Iterator[None]:
    """FSDP2's deferral for one micro-batch: fsdp keeps its gradients unsharded and reduces
    nothing (set_requires_gradient_sync(False)); hsdp over several replicas reduce-scatters
    within its shard group as usual (the gradients stay sharded) and defers only the all-reduce
    across replicas (set_requires_all_reduce(False))."""
    if _replicas(root) > 1:
        root.set_requires_all_reduce(False)
        try:
            yield
        finally:
            root.set_requires_all_reduce(True)
    else:
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)


def deferred_sync(variant, last: bool) -> AbstractContextManager:
    """The context one micro-batch's backward runs in: synchronising (last) or deferring."""
    if last or planted(NOOP_SYNC):
        return nullcontext()
    if (ddp := _ddp(variant.module)) is not None:   # ddp, zero1 (ZeroRedundancyOptimizer beside DDP)
        return ddp.no_sync()
    if variant.spec.wrapper == "fully_shard":
        return _fsdp_deferred(variant.bare)
    return nullcontext()   # single, dp*: nothing to synchronise (DataParallel reduces in its backward)


# -- activation checkpointing ------------------------------------------------------------------------

_CHECKPOINTED: dict[type, type] = {}


def _checkpointed_class(cls: type) -> type:
    """cls with its forward run under torch.utils.checkpoint (non-reentrant): a subclass, so the
    module keeps its parameters' names and its type (fully_shard then swaps the class again, as
    it does; DataParallel's replicas copy the class)."""
    if cls not in _CHECKPOINTED:
        def forward(self, *args, **kwargs):
            return checkpoint(cls.forward, self, *args, use_reentrant=False, **kwargs)
        _CHECKPOINTED[cls] = type(f"Checkpointed{cls.__name__}", (cls,),
                                  {"forward": forward, "dpbench_checkpointed": True})
    return _CHECKPOINTED[cls]


def unit_modules(model: nn.Module, units: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """The model's shard units (spec.shard_modules), the root left out, outermost first."""
    return [m for m in model.modules() if units and isinstance(m, units) and m is not model]


def checkpoint_units(model: nn.Module, units: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """Activation checkpointing of every shard unit (a unit inside another is left to its outer
    one's recomputation); returns the units checkpointed. Before any wrapping (torchtitan's
    order: checkpoint, compile, fully_shard)."""
    done: list[nn.Module] = []
    for m in unit_modules(model, units):
        if any(m in set(d.modules()) for d in done):
            continue
        if not planted(NOOP_CHECKPOINT):
            m.__class__ = _checkpointed_class(type(m))
        done.append(m)
    return done


def compile_units(model: nn.Module, units: tuple[type[nn.Module], ...], mode: str) -> list[nn.Module]:
    """torch.compile each shard unit in place (nn.Module.compile: the names stay), before
    fully_shard as torchtitan does; the root's own code (embeddings, head) stays eager."""
    kwargs: dict[str, Any] = {"dynamic": False, **({} if mode == "default" else {"mode": mode})}
    done = unit_modules(model, units)
    for m in done:
        m.compile(**kwargs)
    return done


def dynamo_counts() -> dict[str, int]:
    """torch._dynamo's counters so far in this process: graph breaks, graphs compiled
    (unique_graphs), recompiles (a frame's guards failing after it was compiled: each failure
    torch._dynamo keeps in guard_failures is one recompilation)."""
    # torch._dynamo takes over a second to import: a run loads it in engine.preload, where its start-up is timed
    from torch._dynamo.utils import counters, guard_failures
    return {"graph_breaks": int(sum(counters["graph_break"].values())),
            "unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "recompiles": int(sum(len(v) for v in guard_failures.values()))}
