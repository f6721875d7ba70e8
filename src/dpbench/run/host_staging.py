"""Host memory of rehearsed ranks (issue 38). gloo on CUDA tensors copies each collective's
tensors through page-locked host buffers, which torch's host allocator keeps cached, one
power-of-two size class apart from the next: under DDP and ZeRO-1 a rank's step stages its
whole gradient (the all-reduce) and its whole model (ZeroRedundancyOptimizer's broadcasts),
and the cache then holds both. N rehearsed ranks share one host, so that is N x twice the
model in locked memory, where NCCL on N GPUs stages none (two of 8 ranks of the 1.08B model
were killed by signal 9 on an H200, h200-rehearsal-72e1378: the host's memory is the suspect,
the log does not say). Rehearsed ranks on CUDA
therefore hand the cached buffers back around each optimizer step, so a rank holds one phase's
staging at a time; a rehearsed step's speed is nobody's, so the waits cost nothing reported."""
from __future__ import annotations

import resource
from typing import Callable

import torch

MIB = 2 ** 20


def empty_host_cache() -> None:
    """Free the host allocator's cached page-locked blocks, once the device has used them."""
    torch.cuda.synchronize()
    torch._C._host_emptyCache()


def release_around_steps(opt: torch.optim.Optimizer, release: Callable[[], None] = empty_host_cache) -> None:
    """Release the staging before each optimizer step (the backward's all-reduces are done) and
    after it (its broadcasts are done)."""
    opt.register_step_pre_hook(lambda *_: release())
    opt.register_step_post_hook(lambda *_: release())


def host_peaks_mib(cuda: bool) -> dict[str, float | None]:
    """This process's peak resident memory on the host, and on CUDA the host allocator's peak
    of page-locked bytes in use (what gloo staged at once)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MIB   # Linux gives KiB
    pinned = torch.cuda.host_memory_stats().get("allocated_bytes.peak") if cuda else None
    return {"host_rss_peak_mib": round(rss, 1), "host_pinned_peak_mib": None if pinned is None else round(pinned / MIB, 1)}
