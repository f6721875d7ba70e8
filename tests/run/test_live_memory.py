"""What a rehearsed rank holds that a rank on its own GPU would not: gloo's reduce-scatter
(ProcessGroupGloo's reduce_scatter_tensor_coalesced, which FSDP2's reduce-scatter calls over gloo)
clones its whole input, all-reduces the clone and copies this rank's chunk out of it, so while it
is under way a rank holds one more copy of the unit's unsharded gradients; NCCL's needs none. On
CUDA tensors the clone is on the GPU. PyTorch's memory tracker (run.live_memory's) counts it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from sharded_ranks import on_ranks
from torch.distributed._tools.mem_tracker import MemTracker

from dpbench.run.live_memory import TOTAL

ELEMENTS = 2 ** 18   # 1 MiB of fp32


def _reduce_scatter_rank(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        inputs, output = torch.ones(ELEMENTS), torch.empty(ELEMENTS // world)
        tracker = MemTracker()
        tracker.track_external(inputs, output)
        with tracker:
            cpu = torch.device("cpu")
            before = tracker.get_tracker_snapshot("current")[cpu][TOTAL]
            dist.reduce_scatter_tensor(output, inputs)
            peak = tracker.get_tracker_snapshot("peak")[cpu][TOTAL]
        if rank == 0:
            Path(out).write_text(json.dumps({"before": before, "peak": peak, "sum": output.unique().tolist()}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow   # two spawned gloo ranks, ~10 s
def test_gloos_reduce_scatter_holds_a_clone_of_its_whole_input(tmp_path):
    out = tmp_path / "seen.json"
    on_ranks(_reduce_scatter_rank, 2, (2, str(tmp_path / "store"), str(out)))
    seen = json.loads(out.read_text())
    assert seen["sum"] == [2.0]
    assert seen["before"] == 4 * ELEMENTS * 3 // 2          # the input and this rank's output
    assert seen["peak"] - seen["before"] == 4 * ELEMENTS   # and, under way, the input once more
