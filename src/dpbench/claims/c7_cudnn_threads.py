"""C7 mechanism: is cuDNN autotuning repeated in every new thread?

DataParallel's parallel_apply runs each replica in a fresh threading.Thread every step. If
cudnn.benchmark's cache of chosen algorithms is per thread, every step pays the autotuning
again. Timed here on one conv of ResNet18-CIFAR's first stage, forward + backward.
"""
from __future__ import annotations

import statistics
import threading
import time

import torch
import torch.nn as nn

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.common import gpus_visible, needs, record

ITERS = 10
SHAPE = (256, 64, 32, 32)  # batch 256 through layer1's 3x3, 64 -> 64 conv
# New-thread steps this many times slower than same-thread ones count as re-autotuning.
SLOW = 1.5


def _step(conv: nn.Module, x: torch.Tensor, times: list[float]) -> None:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    conv(x).sum().backward()
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)


def time_ms(benchmark: bool, new_thread: bool) -> float:
    """Median step time over ITERS, after one warm-up step in the main thread."""
    torch.backends.cudnn.benchmark = benchmark
    conv = nn.Conv2d(64, 64, 3, padding=1, bias=False).cuda()
    x = torch.randn(*SHAPE, device="cuda", requires_grad=True)
    times: list[float] = []
    _step(conv, x, times)
    times.clear()
    for _ in range(ITERS):
        if new_thread:
            t = threading.Thread(target=_step, args=(conv, x, times))
            t.start()
            t.join()
        else:
            _step(conv, x, times)
    return statistics.median(times)


def run() -> dict:
    n = gpus_visible()
    if n < 1:
        return record("C7", [], NOT_RUN, not_run=needs(1, n))
    ms = {(b, t): time_ms(b, t) for b in (False, True) for t in (False, True)}
    ratio_on = ms[True, True] / ms[True, False]
    ratio_off = ms[False, True] / ms[False, False]
    obs = [{"what": f"3x3 conv {list(SHAPE)} fwd+bwd on cuda:0, cudnn.benchmark={b}, "
                    f"{'new thread per step' if t else 'same thread'}",
            "median_ms": round(v, 3), "iters": ITERS} for (b, t), v in ms.items()]
    obs.append({"what": "new-thread / same-thread slowdown",
                "benchmark_on": round(ratio_on, 2), "benchmark_off": round(ratio_off, 2)})
    if ratio_on > SLOW and ratio_on > SLOW * ratio_off:
        verdict = CONFIRMED
    elif ratio_on <= SLOW:
        verdict = REFUTED
    else:
        verdict = NUANCE  # slower in new threads, but with benchmark off too
    return record("C7", obs, verdict)
