#!/usr/bin/env python3
"""Where an eager training step's time goes on one GPU: the device's kernels, or the host
launching them.

    python3 tools/device/step_profile.py [--steps 60] [--json FILE] [--md FILE]

For each case (recipe, batch, variant) the same dpbench step (model, Variant, SGD as the engine
builds them, fed one fixed batch already on the device) is timed three ways, back to back:

- eager: the step as the engine runs it, device clock over the timed steps;
- graphed: the very same step captured once in a CUDA graph and replayed (the whole-network
  capture of PyTorch's CUDA graphs notes): the same kernels with no host in the loop, so
  eager / graphed is the share of the step the device's own work explains;
- profiled: torch.profiler over a few eager steps; the kernels' summed time over the span from
  the first kernel's start to the last one's end is how busy the device was (the profiler adds
  host time of its own, so this is a lower bound on eager's busy share).

A step whose eager time is well above its graphed time waits on the host (kernel launches,
Python, the optimizer's bookkeeping); one whose two times agree is bound by the device. ddp
runs one rank (a one-process NCCL group): what DDP adds to a step before any communication,
with its knobs off and on. dp is left out: on one GPU DataParallel calls the module directly.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from dpbench.plan.config import RunConfig  # noqa: E402
from dpbench.plan.variants.settings import DDPSettings  # noqa: E402
from dpbench.run.measure import StepClock  # noqa: E402
from dpbench.workloads.resnet import resnet18  # noqa: E402
from dpbench.run.step import train_step  # noqa: E402
from dpbench.run.variants import Variant  # noqa: E402

RECIPES = {"fp32": (False, False), "fp32_cl": (False, True), "bf16_cl": (True, True)}
DDP_KNOBS = {
    "ddp": {},
    "ddp_nobcast": {"broadcast_buffers": False},
    "ddp_views_static": {"gradient_as_bucket_view": True, "static_graph": True},
    "ddp_all": {"gradient_as_bucket_view": True, "static_graph": True, "broadcast_buffers": False},
}
# (recipe, batch, variant, optimizer implementation)
CASES = ([(r, 512, "single", "foreach") for r in RECIPES]
         + [("bf16_cl", 256, "single", "foreach"), ("bf16_cl", 1024, "single", "foreach"),
            ("bf16_cl", 512, "single", "fused"), ("fp32_cl", 512, "single", "fused")]
         + [("bf16_cl", 512, name, "foreach") for name in DDP_KNOBS]
         + [("fp32", 512, "ddp", "foreach"), ("fp32", 512, "ddp_all", "foreach")])


class Step:
    """One case's model, optimizer and fixed batch; `__call__` is one training step."""

    def __init__(self, recipe: str, batch: int, variant: str, impl: str, device: torch.device):
        bf16, cl = RECIPES[recipe]
        torch.manual_seed(0)
        fmt = torch.channels_last if cl else torch.contiguous_format
        model = resnet18().to(device).to(memory_format=fmt).train()
        name = "ddp" if variant.startswith("ddp") else variant
        ddp = RunConfig(variant="ddp", **DDP_KNOBS[variant]).variant_settings(DDPSettings) if name == "ddp" else None
        self.variant = Variant(name, model, [device], 1, ddp,
                               autocast_dtype=torch.bfloat16 if bf16 else None)
        kw = {"fused": True} if impl == "fused" else {"foreach": True}
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, **kw)
        self.x = torch.randn(batch, 3, 32, 32, device=device).contiguous(memory_format=fmt)
        self.y = torch.randint(0, 10, (batch,), device=device)
        self.batch = batch
        self.bf16 = bf16

    def __call__(self, zero_grad: bool = True, autocast_cache: bool = True) -> None:
        """The engine's step. In a CUDA graph the gradients are not zeroed (the captured
        backward writes them anew into the graph's buffers) and autocast keeps no cache of
        cast weights (PyTorch's advice for capture); neither changes the kernels of a step
        that uses each weight once."""
        cast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=autocast_cache)) if self.bf16 \
            else nullcontext
        train_step(self.variant, self.opt, self.x, self.y, self.batch, cast, zero_grad=zero_grad)


def device_ms(fn, steps: int) -> float:
    """Mean milliseconds a call over `steps` calls, on the device clock (the engine's StepClock,
    one mark either side: one sync at the end)."""
    clock = StepClock(torch.device("cuda", torch.cuda.current_device()))
    clock.mark()
    for _ in range(steps):
        fn()
    clock.mark()
    return clock.step_ms()[0] / steps


def graphed(step: Step):
    """The step captured in a CUDA graph after warm-up steps on a side stream (PyTorch's
    whole-network capture recipe); returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(autocast_cache=False)
    torch.cuda.current_stream().wait_stream(side)
    step.opt.zero_grad(set_to_none=True)   # backward in the capture makes the gradients in the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(zero_grad=False, autocast_cache=False)
    return graph.replay


def busy_share(step: Step, steps: int = 8) -> tuple[float, int]:
    """Under the profiler: the kernels' summed device time over the steps' device-clock span,
    and the kernels a step."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        span_ms = device_ms(step, steps) * steps
    kernels = [e for e in prof.key_averages() if kernel_us(e) > 0]
    return sum(kernel_us(e) for e in kernels) / 1e3 / span_ms, round(sum(e.count for e in kernels) / steps)


def kernel_us(event) -> float:
    # torch >= 2.4 names it self_device_time_total; older ones self_cuda_time_total
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0) or 0


def run_case(recipe: str, batch: int, variant: str, impl: str, steps: int, device) -> dict:
    torch.backends.cudnn.benchmark = False   # the engine's default
    step = Step(recipe, batch, variant, impl, device)
    for _ in range(10):
        step()
    eager = min(device_ms(step, steps) for _ in range(3))
    try:
        busy, kernels = busy_share(step)
    except Exception as exc:
        busy, kernels = float("nan"), 0
        print(f"profiler: {type(exc).__name__}: {exc}", file=sys.stderr)
    row = {"recipe": recipe, "batch": batch, "variant": variant, "optimizer": impl,
           "eager_ms": round(eager, 3), "eager_images_per_s": round(batch / eager * 1e3),
           "profiled_busy": round(busy, 3), "kernels_per_step": kernels}
    if variant != "single":   # a failed capture can leave the context unusable: only single is captured
        return dict(row, graphed_ms=None, graphed_images_per_s=None, device_share=None,
                    graph_error="not captured (DDP's reducer and its collectives)")
    try:
        replay = graphed(step)
        for _ in range(3):
            replay()
        g = min(device_ms(replay, steps) for _ in range(3))
        row.update(graphed_ms=round(g, 3), graphed_images_per_s=round(batch / g * 1e3),
                   device_share=round(g / eager, 3))
    except Exception as exc:   # a case that cannot be captured is a row with the reason
        row.update(graphed_ms=None, graphed_images_per_s=None, device_share=None,
                   graph_error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| recipe | batch | variant | SGD | eager ms | eager images/s | graphed ms | graphed images/s "
            "| graphed / eager | busy (profiled) | kernels a step |\n|" + "---|" * 11)
    lines = [head]
    for r in rows:
        g = "–" if r["graphed_ms"] is None else f"{r['graphed_ms']:.2f}"
        gi = "–" if r["graphed_images_per_s"] is None else f"{r['graphed_images_per_s']:,}"
        share = "–" if r["device_share"] is None else f"{r['device_share']:.2f}"
        lines.append(f"| {r['recipe']} | {r['batch']} | {r['variant']} | {r['optimizer']} | {r['eager_ms']:.2f} "
                     f"| {r['eager_images_per_s']:,} | {g} | {gi} | {share} | {r['profiled_busy']:.2f} "
                     f"| {r['kernels_per_step']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("step_profile: needs a CUDA device; none is visible", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("nccl", init_method=f"file://{store.name}", rank=0, world_size=1, device_id=device)
    rows = []
    try:
        for case in CASES:
            rows.append(run_case(*case, args.steps, device))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        dist.destroy_process_group()
        if os.path.exists(store.name):   # the FileStore may have removed it already
            os.unlink(store.name)
    facts = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "cudnn": torch.backends.cudnn.version()}
    table = markdown(rows)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"facts": facts, "rows": rows}, indent=1) + "\n")
    if args.md:
        args.md.write_text(f"{facts}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
