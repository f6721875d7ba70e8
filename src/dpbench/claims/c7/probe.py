"""C7 mechanism: is cuDNN autotuning repeated in every new thread? And where a DataParallel
step's time goes (C7 and C8 name their cause from it).

DataParallel's parallel_apply runs each replica in a fresh threading.Thread every step. If
cudnn.benchmark's cache of chosen algorithms is per thread, every step pays the autotuning
again. Timed here on one conv of ResNet18-CIFAR's first stage, forward + backward; then one
DataParallel training step taken apart, and DataParallel with persistent replica threads,
each cudnn.benchmark setting and batch in a fresh process (dpbench.claims.c7.dp_step): both
settings at the C7 group's batch, benchmark off again at the largest batch of C8's sweep.
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Sequence

import torch
import torch.nn as nn

from dpbench.analysis.intervals import Estimate, ratio_ci
from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.common import gpus_visible, needs, record, run_python
from dpbench.claims.records import Observation, ProbeRecord, dp_step_id
from dpbench.claims.records import obs as observation

ITERS = 10
SHAPE = (256, 64, 32, 32)  # batch 256 through layer1's 3x3, 64 -> 64 conv
# New-thread steps this many times slower than same-thread ones count as re-autotuning: an
# effect worth naming (autotuning again costs many times a step), not a threshold for noise.
# Noise is the intervals' part: a verdict is called only where a ratio's interval clears SLOW.
SLOW = 1.5


def _step(conv: nn.Module, x: torch.Tensor, times: list[float]) -> None:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    conv(x).sum().backward()
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)


def time_ms(benchmark: bool, new_thread: bool) -> list[float]:
    """Every timed step's time (ms), ITERS of them, after one warm-up step in the main thread."""
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
    return times


def slowdowns(ms: dict[tuple[bool, bool], list[float]]) -> dict[bool, Estimate]:
    """New-thread / same-thread median step, per cudnn.benchmark setting, with the ratio's
    distribution-free interval (the steps' own spread, no assumed distribution)."""
    return {b: ratio_ci(ms[b, True], ms[b, False]) for b in (False, True)}


def verdict_from(on: Estimate, off: Estimate) -> str:
    """Confirmed only where the benchmark-on slowdown's interval lies wholly above SLOW and
    above SLOW times the benchmark-off one's; refuted only where it lies wholly at or below
    SLOW; otherwise too close to call, or slower with benchmark off too (NaN bounds call nothing)."""
    if on.low > SLOW and on.low > SLOW * off.high:
        return CONFIRMED
    if on.high <= SLOW:
        return REFUTED
    return NUANCE


def threads_escape(steps: dict[str, Any]) -> bool:
    """Whether stock DataParallel is surely SLOW times slower than on persistent replica threads.
    The breakdown keeps each kind's median and the range of its timed steps, not the steps, so
    the ratio's interval is the ranges' (stock's fastest over persistent's slowest): no narrower
    than ratio_ci's on the steps themselves. No range recorded, no call."""
    stock, pers = steps["dp"], steps["dp_persistent_threads"]
    if "step_ms_min" not in stock or "step_ms_max" not in pers:
        return False
    return stock["step_ms_min"] > SLOW * pers["step_ms_max"]


def breakdown_runs(batches: Sequence[int]) -> list[tuple[str, int]]:
    """(cudnn.benchmark, batch) of each step-breakdown process, the most needed first: both
    settings at the first batch (the C7 group's, where C7's verdict is), then benchmark off at
    the others (C8's runs train with it off)."""
    return [("off", batches[0]), ("on", batches[0])] + [("off", b) for b in batches[1:]]


def dp_step_observations(n: int, batches: Sequence[int]) -> tuple[list[Observation], list[str]]:
    """The DataParallel step breakdown, one fresh process per cudnn.benchmark setting and batch."""
    if n < 2:
        return [], [f"DataParallel step breakdown and persistent replica threads: {needs(2, n)}"]
    out, parts_not_run = [], []
    for flag, batch in breakdown_runs(batches):
        r = run_python("", args=["-m", "dpbench.claims.c7.dp_step", "--benchmark", flag, "--batch", str(batch)])
        where = f"batch {batch} on {r.get('gpus', n)} GPUs, cudnn.benchmark {flag}"
        if r.get("rc") or "single" not in r:
            out.append(observation(dp_step_id(flag, batch, "failed"), f"DataParallel step breakdown, {where}: failed",
                                   **r))
            parts_not_run.append(f"DataParallel step breakdown, {where}: failed (exit code {r.get('rc')})")
            continue
        out.append(observation(dp_step_id(flag, batch, "steps"),
                               f"training step, {where}: one GPU, stock DataParallel, "
                               f"DataParallel with persistent replica threads",
                               **{k: r[k] for k in ("single", "dp", "dp_persistent_threads")},
                               batch=r["batch"], gpus=r["gpus"], tf32_cudnn=r["tf32_cudnn"]))
        out.append(observation(dp_step_id(flag, batch, "stages.single"), f"one GPU's step by stage (ms, medians), {where}",
                               **r["single_stages"]))
        out.append(observation(dp_step_id(flag, batch, "stages.dp"),
                               f"stock DataParallel step by stage (ms, medians), {where}", **r["dp_stages"]))
        out.append(observation(dp_step_id(flag, batch, "stages.dp_persistent_threads"),
                               f"DataParallel with persistent replica threads, by stage (ms), {where}",
                               **r["dp_persistent_threads_stages"]))
        if not any(o.id == "c7.dp_step.replica_autocast_dtype" for o in out):
            out.append(observation("c7.dp_step.replica_autocast_dtype",
                                   "dtype a replica computes in when the caller's autocast asks for bfloat16: "
                                   "stock DataParallel, on persistent replica threads, and dpbench's dp variant "
                                   "(each replica in autocast of its own, as the training runs wrap it)",
                                   **r["replica_autocast_dtype"]))
    return out, parts_not_run


def conv_observations(ms: dict[tuple[bool, bool], list[float]], r: dict[bool, Estimate]) -> list[Observation]:
    out = [observation(f"c7.conv.bench_{'on' if b else 'off'}.{'new_thread' if t else 'same_thread'}",
                       f"3x3 conv {list(SHAPE)} fwd+bwd on cuda:0, cudnn.benchmark={b}, "
                       f"{'new thread per step' if t else 'same thread'}",
                       median_ms=round(statistics.median(v), 3), iters=len(v),
                       steps_ms=[round(x, 3) for x in v]) for (b, t), v in ms.items()]
    bounds = {f"benchmark_{'on' if b else 'off'}_{side}": round(getattr(r[b], side), 2)
              for b in (True, False) for side in ("low", "high")}
    out.append(observation("c7.conv.slowdown", "new-thread / same-thread slowdown (ratio of median steps), "
                                               "with its distribution-free interval at confidence at least `level`",
                           benchmark_on=round(r[True].value, 2), benchmark_off=round(r[False].value, 2),
                           **bounds, level=round(min(r[True].level, r[False].level), 3)))
    return out


def run(batches: Sequence[int]) -> ProbeRecord:
    """batches: the step breakdown's global batches, the C7 group's first (dpbench.claims.settings)."""
    n = gpus_visible()
    if n < 1:
        return record("C7", [], NOT_RUN, not_run=needs(1, n))
    ms = {(b, t): time_ms(b, t) for b in (False, True) for t in (False, True)}
    r = slowdowns(ms)
    obs = conv_observations(ms, r)
    verdict = verdict_from(r[True], r[False])
    steps, parts_not_run = dp_step_observations(n, batches)
    obs += steps
    on = next((o for o in steps if o.id == dp_step_id("on", batches[0], "steps")), None)
    if verdict == CONFIRMED and on is not None and not threads_escape(on.values):
        verdict = NUANCE  # threads are the mechanism only if DataParallel on persistent threads escapes the slowdown
    return record("C7", obs, verdict, parts_not_run=parts_not_run)
