"""C1's why: what each device holds at its peak, by what allocated it (PyTorch's memory snapshot).

    python -m dpbench.claims.c1.attribution --variant dp --batch 2048 --classes 10 32768

prints one JSON line. The C1 probe starts one fresh process per variant (the allocator's
history must begin before the model exists, or its parameters have no recorded origin), at the
C1 runs' global batch and output widths (dpbench.claims.settings).

Two SGD steps with momentum run at a fixed global batch through dpbench's own model, variant
wrappers and training step (c1.devices), with torch.cuda.memory._record_memory_history recording every allocation and the
Python stack that made it. Replaying each device's trace gives the moment its allocated bytes
peak and the blocks alive then; each block is put in a category by the frames of the stack
that allocated it (CATEGORIES: the first rule that matches wins). Under DataParallel this says
whether device 0's extra is the gathered outputs and the loss on them, as the article says, or
the summed gradients, the optimizer state and the input batch. Block sizes are the
allocator's (rounded up), so a device's sum can exceed the tensors' own bytes by a little.
"""
from __future__ import annotations

import argparse
import gc
import json
from typing import Any, Iterable

import torch

from dpbench.claims.c1.devices import one_rank, train_steps, variant_devices
from dpbench.claims.records import obs as observation

MIB = 2 ** 20
VARIANTS = ("single", "dp", "dp_sum", "ddp")
MAX_ENTRIES = 200_000       # trace entries kept: two steps of ResNet18 need a few thousand

# (category, rules): a rule is (file path fragment, function name or None for any). The first
# category with a rule that matches any frame of the allocating stack wins, so the specific
# (DataParallel's collectives, the optimizer, the loss) come before the general (backward,
# the forward's activations).
CATEGORIES: list[tuple[str, list[tuple[str, str | None]]]] = [
    ("optimizer state", [("torch/optim/", None)]),
    # Broadcast's backward sums the replicas' gradients onto device 0
    ("summed gradients", [("torch/nn/parallel/comm.py", "reduce_add_coalesced"),
                          ("torch/nn/parallel/comm.py", "reduce_add")]),
    ("gathered outputs", [("torch/nn/parallel/comm.py", "gather")]),
    # Gather's backward scatters the outputs' gradient back to the replicas
    ("output gradients, scattered back", [("torch/nn/parallel/_functions.py", "backward")]),
    ("replicated parameters", [("torch/nn/parallel/replicate.py", None),
                               ("torch/nn/parallel/comm.py", "broadcast_coalesced")]),
    ("scattered inputs", [("torch/nn/parallel/scatter_gather.py", None),
                          ("torch/nn/parallel/comm.py", "scatter")]),
    # made once, when DDP wraps the model (its forward passes through distributed.py too)
    ("DDP's gradient buckets", [("torch/nn/parallel/distributed.py", "_ddp_init_helper"),
                                ("torch/nn/parallel/distributed.py", "__init__")]),
    ("loss", [("torch/nn/functional.py", "cross_entropy"), ("torch/nn/functional.py", "log_softmax")]),
    ("backward, from Python", [("torch/autograd/", None), ("torch/_tensor.py", "backward")]),
    ("parameters", [("torch/nn/modules/module.py", "_apply")]),
    ("forward activations", [("torch/nn/modules/", None), ("dpbench/workloads/resnet.py", None)]),
    ("input batch", [("dpbench/claims/c1/devices.py", "random_batch")]),
]
# CUDA's backward runs in autograd's own device threads, which have no Python stack: the
# gradients and the buffers of the built-in ops' backward land here.
NO_STACK = "backward, in autograd's device threads (no Python stack)"
OTHER = "other"


def _matches(frame: dict, path: str, name: str | None) -> bool:
    return path in str(frame.get("filename", "")).replace("\\", "/") and (name is None or frame.get("name") == name)


def classify(frames: Iterable[dict]) -> str:
    """The category of an allocation, from the Python frames of the stack that made it."""
    frames = list(frames)
    if not frames:
        return NO_STACK
    for category, rules in CATEGORIES:
        if any(_matches(f, path, name) for f in frames for path, name in rules):
            return category
    return OTHER


def peak_breakdown(trace: Iterable[dict]) -> dict[str, Any]:
    """Replay one device's allocator trace: the bytes alive at the moment the allocated total
    peaks, by category. A block lives from its 'alloc' to its first 'free_requested' (or
    'free_completed' where the request was not recorded)."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for e in trace:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = (int(e["size"]), classify(e.get("frames") or []))
            total += live[addr][0]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action in ("free_requested", "free_completed") and addr in live:
            total -= live.pop(addr)[0]
    by: dict[str, float] = {}
    for size, category in at_peak.values():
        by[category] = by.get(category, 0.0) + size / MIB
    # Categories under 0.05 MiB at the peak (a loss scalar, a step counter) round away.
    return {"peak_mib": round(peak / MIB, 1),
            "by_category": {c: round(m, 1) for c, m in sorted(by.items(), key=lambda kv: -kv[1])
                            if round(m, 1) > 0}}


def attribute(variant: str, classes: int, batch: int, devices: list) -> dict[str, Any]:
    """Two training steps under the allocator's history; each device's peak, by category."""
    gc.collect()
    # cuBLAS keeps its workspaces from an earlier width alive: freed here, they are allocated
    # again under the recording and counted (without this, about 64 MiB went unseen on the H200)
    if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
        torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    try:
        train_steps(variant, classes, batch, devices)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
        gc.collect()   # free before the next width
        torch.cuda.empty_cache()
    traces = snapshot.get("device_traces") or []
    return {str(d.index): peak_breakdown(traces[d.index] if d.index < len(traces) else [])
            for d in devices}


def measure(variant: str, classes: list[int], batch: int) -> dict[str, Any]:
    """One variant at each output size, in this process (CUDA must start here)."""
    devices, skipped = variant_devices(variant)
    if skipped:
        return {"variant": variant, "skipped": skipped}
    per_gpu = batch // 2 if variant == "ddp" else batch   # a rank of 2 holds half the global batch
    with one_rank(variant):
        per_classes = {str(c): attribute(variant, c, per_gpu, devices) for c in classes}
    return {"variant": variant, "gpus": len(devices), "batch": batch, "per_gpu_batch": per_gpu,
            "per_classes": per_classes}


def observations(r: dict[str, Any]) -> list:
    """The probe's observations of one variant's JSON line: one per output size and device."""
    out = []
    where = "one rank of 2, half the global batch" if r["variant"] == "ddp" else f"{r['gpus']} GPU(s)"
    for classes, devices in r["per_classes"].items():
        for device, b in devices.items():
            out.append(observation(
                f"c1.attribution.{r['variant']}.out{classes}.dev{device}",
                f"{r['variant']} at global batch {r['batch']:,}, {int(classes):,} outputs ({where}): "
                f"device {device} at its peak, by what allocated it (memory snapshot)",
                peak_mib=b["peak_mib"], by_category=b["by_category"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", required=True, choices=VARIANTS)
    ap.add_argument("--classes", type=int, nargs="+", required=True, help="output widths")
    ap.add_argument("--batch", type=int, required=True, help="global batch (the C1 runs')")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.variant, args.classes, args.batch)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
