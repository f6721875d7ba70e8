"""run.host_staging: the releases land around every optimizer step, ZeroRedundancyOptimizer's
too (its step broadcasts the updated shards: the staging the hook hands back)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from dpbench.run import host_staging


def _steps(opt, model, n: int) -> None:
    for _ in range(n):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_release_before_and_after_each_step():
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []
    # what the release sees: before the first step no momentum, after it the two tensors' buffers
    host_staging.release_around_steps(opt, lambda: seen.append(len(opt.state)))
    _steps(opt, model, 2)
    assert seen == [0, 2, 2, 2]


def test_release_around_zero_redundancy_steps(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 2)
        opt = ZeroRedundancyOptimizer(list(model.parameters()), optimizer_class=torch.optim.SGD, lr=0.1)
        weights = []
        host_staging.release_around_steps(opt, lambda: weights.append(model.weight.detach().clone()))
        _steps(opt, model, 3)
        assert len(weights) == 6
        for before, after in zip(weights[::2], weights[1::2]):   # one release each side of the update
            assert not torch.equal(before, after)
        for after, next_before in zip(weights[1::2], weights[2::2]):
            assert torch.equal(after, next_before)
    finally:
        dist.destroy_process_group()


def test_host_peaks_on_the_cpu():
    peaks = host_staging.host_peaks_mib(cuda=False)
    assert peaks["host_pinned_peak_mib"] is None
    big = torch.ones(64 * 2 ** 20 // 4)   # 64 MiB touched: the peak resident memory holds it
    assert host_staging.host_peaks_mib(cuda=False)["host_rss_peak_mib"] >= 64
    del big
