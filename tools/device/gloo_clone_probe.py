"""What gloo's collectives hold on the GPU beyond their own tensors (issue 38: the rehearsal-only
cost suspected in 1.08B fsdp's backward at N = 4). Two processes share one GPU over gloo on CUDA
tensors, as rehearsed ranks do; each collective runs on a 256 MiB input and the allocator's peak
above the tensors held is printed per collective, as JSON lines from rank 0.
tests/run/test_live_memory.py measures the reduce-scatter's clone on the CPU.

    python tools/device/gloo_clone_probe.py            # on a CUDA machine, ~20 s
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 2 ** 20
INPUT_MIB = 256
WORLD = 2


def _collectives(world: int, n: int, device: torch.device) -> dict:
    """name -> (what the collective is called with, and runs)."""
    return {
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            torch.empty(n // world, device=device), torch.ones(n, device=device)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.empty(n, device=device), torch.ones(n // world, device=device)),
        "all_reduce": lambda: dist.all_reduce(torch.ones(n, device=device)),
    }


def _rank(rank: int, store: str) -> None:
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    device = torch.device("cuda", 0)
    n = INPUT_MIB * MIB // 4
    try:
        for name, run in _collectives(WORLD, n, device).items():
            sizes = {"reduce_scatter_tensor": n + n // WORLD, "all_gather_into_tensor": n + n // WORLD,
                     "all_reduce": n}[name]
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            run()
            torch.cuda.synchronize()
            above = torch.cuda.max_memory_allocated() - before - 4 * sizes
            if rank == 0:
                print(json.dumps({"collective": name, "ranks": WORLD, "input_mib": INPUT_MIB,
                                  "tensors_mib": 4 * sizes / MIB, "peak_above_tensors_mib": above / MIB,
                                  "torch": torch.__version__}), flush=True)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("gloo_clone_probe: no CUDA device; tests/run/test_live_memory.py is the CPU check")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(os.path.join(tmp, "store"),), nprocs=WORLD, join=True)
