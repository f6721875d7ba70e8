"""C7 mechanism: is cuDNN autotuning repeated in every new thread? And where a DataParallel
step's time goes (C7 and C8 name their cause from it).

DataParallel's parallel_apply runs each replica in a fresh threading.Thread every step. If
cudnn.benchmark's cache of chosen algorithms is per thread, every step pays the autotuning
again. Timed here on one conv of ResNet18-CIFAR's first stage, forward + backward; then one
DataParallel training step taken apart, and DataParallel with persistent replica threads,
each cudnn.benchmark setting in a fresh process (dpbench.claims.dp_step).
"""
from __future__ import annotations

import statistics
import threading
import time

import torch
import torch.nn as nn

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.common import gpus_visible, needs, record, run_python
from dpbench.claims.records import Observation, ProbeRecord, obs as observation

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


def dp_step_observations(n: int) -> tuple[list[Observation], list[str]]:
    """The DataParallel step breakdown, one fresh process per cudnn.benchmark setting."""
    if n < 2:
        return [], [f"DataParallel step breakdown and persistent replica threads: {needs(2, n)}"]
    out = []
    for flag in ("off", "on"):
        r = run_python("", args=["-m", "dpbench.claims.dp_step", "--benchmark", flag])
        key = f"c7.dp_step.bench_{flag}"
        if r.get("rc") or "single" not in r:
            out.append(observation(key, f"DataParallel step breakdown, cudnn.benchmark {flag}: failed", **r))
            continue
        where = f"batch {r['batch']} on {r['gpus']} GPUs, cudnn.benchmark {flag}"
        out.append(observation(f"{key}.steps", f"training step, {where}: one GPU, stock DataParallel, "
                                               f"DataParallel with persistent replica threads",
                               **{k: r[k] for k in ("single", "dp", "dp_persistent_threads")},
                               batch=r["batch"], gpus=r["gpus"], tf32_cudnn=r["tf32_cudnn"]))
        out.append(observation(f"{key}.stages.dp", f"stock DataParallel step by stage (ms, medians), {where}",
                               **r["dp_stages"]))
        out.append(observation(f"{key}.stages.dp_persistent_threads",
                               f"DataParallel with persistent replica threads, by stage (ms), {where}",
                               **r["dp_persistent_threads_stages"]))
        if flag == "off":
            out.append(observation("c7.dp_step.replica_autocast_dtype",
                                   "dtype a replica computes in when the caller's autocast asks for bfloat16",
                                   **r["replica_autocast_dtype"]))
    return out, []


def run() -> ProbeRecord:
    n = gpus_visible()
    if n < 1:
        return record("C7", [], NOT_RUN, not_run=needs(1, n))
    ms = {(b, t): time_ms(b, t) for b in (False, True) for t in (False, True)}
    ratio_on = ms[True, True] / ms[True, False]
    ratio_off = ms[False, True] / ms[False, False]
    obs = [observation(f"c7.conv.bench_{'on' if b else 'off'}.{'new_thread' if t else 'same_thread'}",
                       f"3x3 conv {list(SHAPE)} fwd+bwd on cuda:0, cudnn.benchmark={b}, "
                       f"{'new thread per step' if t else 'same thread'}",
                       median_ms=round(v, 3), iters=ITERS) for (b, t), v in ms.items()]
    obs.append(observation("c7.conv.slowdown", "new-thread / same-thread slowdown",
                           benchmark_on=round(ratio_on, 2), benchmark_off=round(ratio_off, 2)))
    steps, parts_not_run = dp_step_observations(n)
    obs += steps
    if ratio_on > SLOW and ratio_on > SLOW * ratio_off:
        verdict = CONFIRMED
    elif ratio_on <= SLOW:
        verdict = REFUTED
    else:
        verdict = NUANCE  # slower in new threads, but with benchmark off too
    on = next((o for o in steps if o.id == "c7.dp_step.bench_on.steps"), None)
    if verdict == CONFIRMED and on is not None:
        # threads are the mechanism only if DataParallel on persistent threads escapes the slowdown
        if on.get("dp_persistent_threads")["step_ms"] * SLOW > on.get("dp")["step_ms"]:
            verdict = NUANCE
    return record("C7", obs, verdict, parts_not_run=parts_not_run)
