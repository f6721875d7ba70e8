"""Rehearsal on fake tensors (issue 38): one process stands for rank 0 of N ranks and runs a
case's own code (the model, fully_shard, the optimizer, a warm step and the profiled step) under
PyTorch's FakeTensorMode, whose tensors have sizes and no storage, over its fake process group,
whose collectives move nothing. The memory tracker (run.live_memory) counts what rank 0 holds by
phase, unit part and kind, as it does on gloo ranks of the CPU, without the memory: a model of any
size at any N runs on any machine in seconds. On the cases both ran (tests/claims/c9/test_fake.py:
fsdp with and without resharding, hsdp) its forward's and backward's peaks, parts and kinds are
the gloo ranks' byte for byte; the optimizer step's peak is a few KiB apart.

What it cannot see: the caching allocator (no reserved memory, so no search within a budget), a
backend's own buffers (NCCL's, gloo's GPU copies), the other ranks (their shards may be a few
bytes apart), anything that reads a tensor's values (no losses). ddp and zero1 do not run on it:
DDP's reducer reads its buckets' data. Its records say `fake: true`.

    python -m dpbench.claims.c9.fake --plan cases.json --out cases.jsonl --ranks 4
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from dpbench.claims.c9.rehearsal import case_record, failed_case, run_config
from dpbench.plan import variants
from dpbench.run import components, engine
from dpbench.run.step import train_step

# what a fake record cannot hold, said where the real one would hold it
NO_SEARCH = "fake tensors: no allocator, so no budget is searched"
UNSHARDED = "fake tensors: DDP's reducer reads its gradient buckets' data; ddp and zero1 run on gloo ranks"


def fake_store():
    """PyTorch's in-memory store for the fake backend (a testing utility it ships)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    return FakeStore()


def run_fake_case(case: dict[str, Any], world: int) -> dict[str, Any]:
    """One case as rank 0 of `world` ranks on fake tensors: its record (claims.c9.rehearsal's
    fields; one memory row, rank 0's; `fake` true), or a failed one naming the error."""
    started = time.perf_counter()
    if not variants.spec(case["variant"]).shards_parameters:
        return {**failed_case(case, world, UNSHARDED, "skipped"), "fake": True}
    cfg = run_config(case, world, case["batch"])
    dist.init_process_group("fake", rank=0, world_size=world, store=fake_store())
    try:
        # allow_non_fake_inputs: the device mesh, made outside the mode (run.sharded), is real
        with FakeTensorMode(allow_non_fake_inputs=True):
            spec = engine.build_workload(cfg)
            sizes = spec.sizes()
            device = torch.device("cpu")
            variant, opt = engine.wrap(cfg, spec, spec.model, [device], world)
            x, y = spec.batch(torch.Generator().manual_seed(cfg.seed), case["batch"])
            train_step(variant, opt, x, y, case["batch"] * world)   # warm: the momentum exists from here
            _, row, collectives = components.profiled_step(variant, opt, x, y, case["batch"] * world,
                                                           nullcontext, True, track_cpu=True)
    except Exception as exc:   # one case's failure must not end the others'
        print(traceback.format_exc()[-2000:], flush=True)
        return {**failed_case(case, world, f"{type(exc).__name__}: {exc}"[:500]), "fake": True}
    finally:
        dist.destroy_process_group()
    return {**case_record(case, cfg, sizes, world), "fake": True,
            "memory_components": [dict(row, device=0)], "collectives": collectives,
            "search_skipped": NO_SEARCH if case.get("budgets") else None,
            "status": "ok", "reason": "", "wall_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True, type=Path, help="JSON: a list of cases")
    ap.add_argument("--out", required=True, type=Path, help="JSON lines, one per case (appended)")
    ap.add_argument("--ranks", required=True, type=int, help="N, the ranks rank 0 stands among")
    args = ap.parse_args(argv)
    for case in json.loads(args.plan.read_text()):
        if args.ranks < case.get("min_ranks", 1) or args.ranks > case.get("max_ranks", args.ranks):
            continue
        rec = run_fake_case(case, args.ranks)
        with open(args.out, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        print(f"[fake] {rec['run_id']}: {rec['status']} {rec.get('reason', '')} ({rec.get('wall_s', 0):.1f} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
