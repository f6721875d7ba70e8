"""Every allocation of one FSDP2 forward on N gloo ranks of this CPU, from PyTorch's profiler
(the CPU allocator's own events, so also what a collective allocates inside itself), with the
op around it and the running total above the forward's start: where the forward's peak comes
and what is live there. Issue 38 used it to find the 2048x20 model's peak at N = 2 (the last
block's gathering: the block before it kept, its all-gather output, and gloo's flat buffer or
its parameters copied out), which docs/sharding.md's memory model now predicts.

    python tools/fsdp_forward_trace.py --width 2048 --layers 4 --ranks 2          # ~1 min, ~4 GB a rank
    python tools/fsdp_forward_trace.py --width 2048 --layers 4 --ranks 1          # one rank, to compare

It trains one step (the profiled forward is the second) on the rehearsal's case
(claims.c9.rehearsal.run_config; Variant, train_step); rank 0 prints. Nothing here is a GPU's
allocator: the CPU's, whose bytes the rehearsal's tracker (run.live_memory) also counts.
"""
from __future__ import annotations

import argparse
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

MIB = 2 ** 20


def trace(rank: int, world: int, store: str, args: argparse.Namespace) -> None:
    from dpbench.claims.c9.rehearsal import run_config
    from dpbench.run import engine
    from dpbench.run.step import train_step
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    # the rehearsal's own case (claims.c9.rehearsal), as its CPU tracker references ran it
    cfg = run_config({"variant": "fsdp", "args": {"width": args.width, "layers": args.layers,
                                                  "heads": max(2, args.width // 64), "seq_len": args.seq_len,
                                                  "vocab": args.vocab}}, world, args.batch)
    cpu = torch.device("cpu")
    spec = engine.build_workload(cfg)
    model = spec.model.to(cpu)
    variant, opt = engine.wrap(cfg, spec, model, [cpu], world)
    gen = torch.Generator().manual_seed(cfg.seed + rank)
    x, y = spec.batch(gen, args.batch)
    train_step(variant, opt, x, y, args.batch * world)   # a warm step: the optimizer's state exists, as in a profiled step
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = variant.module(x)   # kept: its graph holds the activations the backward would use
    if rank == 0:
        report(prof, world, args.min_mib)
    del out
    dist.destroy_process_group()


def report(prof, world: int, min_mib: float) -> None:
    events = list(prof.profiler.kineto_results.events())
    ops = [(e.start_ns(), e.end_ns(), e.name(), e.start_thread_id()) for e in events if e.name() != "[memory]"]
    memory = sorted((e.start_ns(), e.nbytes(), e.start_thread_id()) for e in events if e.name() == "[memory]")
    total = peak = 0
    for at, nbytes, thread in memory:
        total += nbytes
        peak = max(peak, total)
        if abs(nbytes) >= min_mib * MIB:
            around = [o for o in ops if o[0] <= at <= o[1] and o[3] == thread]
            name = min(around, key=lambda o: o[1] - o[0])[2] if around else "(no op)"
            print(f"{nbytes / MIB:+10.1f} MiB -> {total / MIB:9.1f}  {name}")
    print(f"N = {world}: the forward's peak {peak / MIB:.1f} MiB above its start; {total / MIB:.1f} MiB at its end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=1, help="per rank")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--min-mib", type=float, default=4.0, help="print allocations at least this large")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(trace, args=(args.ranks, f"{tmp}/store", args), nprocs=args.ranks)


if __name__ == "__main__":
    main()
