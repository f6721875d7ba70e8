"""Rehearsed ranks in one launch: every case of a plan (variant x model size) on the N ranks of
this torchrun, all sharing the visible GPU(s) over gloo on CUDA tensors (the run option
rehearse: each rank its own process and caching allocator, so its peaks are what it would hold
on a GPU of its own, less NCCL's buffers), one case after the other:

    python -m torch.distributed.run --standalone --nproc-per-node 4 -m dpbench.claims.c9.rehearsal \\
        --plan plan.json --out cases-4.jsonl

Per case, through the engine's own pieces (build_workload, wrap: the variant and optimizer, the
profiled step of run.components): one warm step (the optimizer's momentum exists from then
on), then one profiled step at the case's per-rank batch: each rank's tensors by component,
its allocator's peaks by phase, the largest single all-gather its counter saw, rank 0's
counted collectives. Then, where the case asks, C9's largest per-rank batch within each
budget by edge_search (each trial where the line through the peaks so far meets the budget):
a batch fits a budget when every rank's allocated peak of one training step at that batch
stays within it.
The step runs uncapped and the ranks decide together from the gathered peaks (a capped step
that ran out of memory on one rank would leave its peers waiting in a collective); a batch
whose peak the trials so far put beyond SAFE x the budget (peak linear in the batch, fitted on
the measured trials) is decided without running it, and the trial says so. On the CPU (no
allocator, no search) the profiled step's peaks by phase are its live tensors' (run.live_memory).

Rank 0 appends one JSON line per case to --out: a record-like dict (run_id, variant, gpus,
options, config, parameters, param_bytes, memory_components, collectives, status, reason,
search) that analysis.collect's memory_component_rows and traffic_model.collective_rows read.
A case whose ranks do not fit the GPU (memory_model.rehearsal_misfit) is a skipped line.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dpbench.analysis.caching_allocator import PROFILED_END, PROFILED_START, SHARDED, WARM_END, WARM_START
from dpbench.analysis.memory_model import CONTEXT_BYTES, rehearsal_misfit, setting_of
from dpbench.analysis.rehearsal import first_failure
from dpbench.claims.batch_search import CEILING, REHEARSAL_RESOLUTION
from dpbench.host.nvml import nvml_process_mib
from dpbench.plan.config import RunConfig
from dpbench.run import alloc_history, components, engine, host_staging
from dpbench.run.cache_streams import reserved_by_stream_mib, reserved_segments_mib
from dpbench.run.step import train_step
from dpbench.workloads.transformer_lm import parameter_count

MIB = 2 ** 20
GIB = 2 ** 30
SAFE = 1.15          # run a trial only where the fitted peak stays within SAFE x the budget
# Every wait on a peer is bounded: a rank that ran out of memory inside a step leaves its peers in
# the step's collective (seen on one H200: 4 ranks of a 236M model, one out of memory mid-backward,
# three waiting in DDP's all-reduce for 9 minutes); gloo's timeout ends that wait with an error.
TIMEOUT_ENV = "DPBENCH_REHEARSAL_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
# The ranks' reserved memory together may use this share of the device: a trial predicted beyond
# it is not run (out of memory on one rank mid-step would desynchronise the ranks' collectives).
DEVICE_SHARE = 0.95
# The search's first extrapolated trial goes at most this many times the largest batch measured:
# a line through batches 1 and 2 can be far too flat (ddp at 236M on 4 ranks of one H200: 391 MiB
# a sample there, 645-709 in zero1's larger trials), and its overshoot put the 4 ranks past the
# GPU; one ran out of memory and left its peers in DDP's all-reduce (issue 38, 4036c92).
FIRST_TRIAL_SPAN = 8
# A search starts no trial this long past the launch's deadline (DPBENCH_REHEARSAL_DEADLINE, when
# the launch starts no more cases): the case then ends, cut short, and its record, with the memory
# its profiled step measured, is written before the launcher's grace (tools/device/rehearse.py)
# runs out. A 1.08B trial over gloo takes ~20 s.
TRIAL_GRACE_S = 60.0
DEADLINE_ENV = "DPBENCH_REHEARSAL_DEADLINE"
PLANT_DESYNC = "rehearsal-desync"   # DPBENCH_PLANT: rank 1 skips the warm step (the bounded-wait test)


def peak_fit(trials: list[dict[str, Any]], key: str = "peak_mib") -> Callable[[int], float] | None:
    """The allocated peak (MiB; or `key`: reserved_mib) as a straight line in the batch through
    the measured trials (least squares; None with fewer than two distinct batches)."""
    pts = [(t["batch"], t[key]) for t in trials if t.get("how") == "measured"]
    xs = {b for b, _ in pts}
    if len(xs) < 2:
        return None
    n = len(pts)
    mx, my = sum(b for b, _ in pts) / n, sum(p for _, p in pts) / n
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    slope = sum((b - mx) * (p - my) for b, p in pts) / sxx
    return lambda b: my + slope * (b - mx)


def edge_search(fits: Callable[[int], bool | None], trials: list[dict[str, Any]], cap_mib: float, resolution: float,
                start: int | None = None) -> dict[str, Any]:
    """The largest batch for which fits() holds (None: not run, the time is spent), between
    the largest batch the trials so far put within cap_mib and the smallest they put beyond it:
    {largest, smallest_failing}. A peak is a straight line in the batch (1.08B zero1 on 4 ranks
    of one H200: batches 6 and 7 within 0.1 MiB of the line through 1 and 2), so each trial
    goes to the largest batch the line through the measured peaks puts within the budget, or,
    where that batch is known to fit, to the one above it: two trials settle a straight line's
    edge, where doubling and bisection took four to seven (1.08B fsdp at N = 8). Before any
    batch fails, a trial goes at most FIRST_TRIAL_SPAN times the largest measured (a line
    through batches 1 and 2 can be far too flat). A trial the line put on the wrong side is
    followed by a doubling (nothing failed yet) or a midpoint: bisection's bound on the trials.
    Without a line, doubling and then midpoints. `start`: the first trial's batch."""
    def known(fit: bool) -> list[int]:
        return [t["batch"] for t in trials if t.get("how") != "late"
                and (t.get("how") == "measured" and t["peak_mib"] <= cap_mib) == fit]
    lo = max(known(True), default=0)
    hi = min((b for b in known(False) if b > lo), default=None)
    for b in (lo, hi):   # the bracket the earlier trials give, said in this search's decisions
        if b:
            fits(b)
    line_missed = False
    while hi is None or hi - lo > max(1, int(lo * resolution)):
        line = peak_fit(trials)
        slope = line(2) - line(1) if line else 0.0
        edge = int((cap_mib - line(0)) / slope) if line and slope > 0 else None
        guided = edge is not None and not line_missed and start is None
        if start is not None:
            b, start = start, None
        elif not guided:
            b = max(1, 2 * lo) if hi is None else (lo + hi) // 2
        elif hi is None:
            b = lo + 1 if edge <= lo else min(edge, FIRST_TRIAL_SPAN * max(lo, 1))
        else:
            b = min(max(edge, lo + 1), hi - 1)
        ok = fits(b)
        if ok is None:   # the launch's time is spent: lo stays a lower bound
            break
        lo, hi = (b, hi) if ok else (lo, b)
        line_missed = guided and ok != (b <= edge)
        if b >= CEILING:
            break
    return {"largest": lo, "smallest_failing": hi}


def search_budget(measure: Callable[[int], dict[str, Any]], cap_gib: float, trials: list[dict[str, Any]],
                  resolution: float = REHEARSAL_RESOLUTION, safe: float = SAFE, start: int | None = None) -> dict[str, Any]:
    """The largest batch whose measured peak stays within cap_gib (edge_search),
    `trials` the measured batches so far (shared between budgets: each batch is run once).
    measure(batch) -> {"batch", "peak_mib", "reserved_mib", "how": "measured"} or with how
    "failed" (an out-of-memory on any rank: counts as not fitting) or "late" (not run: the
    launch's time is spent; the search is then cut short, its largest only a lower bound).
    The trials go where the line through the measured peaks meets the budget (edge_search)."""
    cap_mib = cap_gib * GIB / MIB
    decided: list[list[Any]] = []

    def fits(batch: int) -> bool | None:
        done = next((t for t in trials if t["batch"] == batch), None)
        if done is None:
            line = peak_fit(trials)
            if line is not None and line(batch) > safe * cap_mib:
                decided.append([batch, False, round(line(batch), 1), "extrapolated"])
                return False
            done = measure(batch)
            if done["how"] == "late":   # not a trial: another budget's search may still run it
                decided.append([batch, False, None, "late"])
                return None
            trials.append(done)
        ok = done["how"] == "measured" and done["peak_mib"] <= cap_mib
        decided.append([batch, ok, done.get("peak_mib"), done["how"]])
        return ok

    found = edge_search(fits, trials, cap_mib, resolution, start)
    at = next((t for t in trials if t["batch"] == found["largest"]), {})
    cut = any(d[3] == "late" for d in decided)
    return {"cap_gib": cap_gib, "largest": found["largest"], "cut_short": cut,
            "smallest_failing": None if cut else found["smallest_failing"],
            # the bound came from the GPU, not the budget: the smallest failing batch was a trial the
            # rehearsed ranks together could not run on it ("device-full"); one above a batch that
            # failed the budget by measurement limits nothing (42.3M at N = 8 on one H200)
            "limited_by_device": any(d[3] == "device-full" and d[0] == found["smallest_failing"] for d in decided), "trials": decided, "peak_mib_at_largest": at.get("peak_mib"),
            "reserved_mib_at_largest": at.get("reserved_mib")}


def measured_context_bytes(rows: list[dict[str, Any]]) -> float:
    """What a rank holds on the GPU beyond its allocator's reserved memory (the CUDA context,
    cuBLAS's and gloo's own), the most over the ranks' profiled-step rows, NVML's per-process
    memory less the reserved peak; the memory model's CONTEXT_BYTES where NVML names no rank.
    On one H200 it was 812 MiB a rank (12M, N = 8), not the 0.5 GiB assumed."""
    seen = [r["nvml_process_mib"] - r["reserved_peak_mib"] for r in rows
            if isinstance(r.get("nvml_process_mib"), (int, float)) and isinstance(r.get("reserved_peak_mib"), (int, float))]
    return max(max(seen) * MIB, CONTEXT_BYTES) if seen else CONTEXT_BYTES


def device_full(reserved_mib: float, ranks_here: int, context_bytes: float, total_bytes: int) -> bool:
    """Whether the ranks sharing this GPU, each holding reserved_mib plus its context, would pass
    DEVICE_SHARE of it: such a trial is not run (one rank out of memory inside a collective
    leaves its peers waiting there)."""
    return ranks_here * (reserved_mib * MIB + context_bytes) > DEVICE_SHARE * total_bytes


# -- on the ranks ----------------------------------------------------------------------------

def run_config(case: dict[str, Any], world: int, batch: int):
    return RunConfig.from_dict({
        "variant": case["variant"], "gpus": world, "rehearse": True, "precision": case.get("precision", "fp32"),
        "workload": {"name": "transformer-lm", "args": dict(case["args"])}, "global_batch": batch * world,
        "per_gpu_batch": batch, "dataset": "synthetic", "lr_schedule": "constant", **case.get("options", {})})


def case_options(case: dict[str, Any]) -> dict[str, Any]:
    """The options that set the case apart (its identity, as a run's options)."""
    return {"workload": f"transformer-lm-{case['args']['width']}x{case['args']['layers']}", "rehearse": True,
            "per_gpu_batch": case["batch"], **case.get("options", {})}


def case_record(case: dict[str, Any], cfg, sizes: dict[str, Any], world: int) -> dict[str, Any]:
    """A case's record as it starts: its identity, config and model size (claims.c9.fake's too)."""
    return {"run_id": f"{case['name']}-g{world}", "variant": cfg.variant, "gpus": world, "repeat": 0,
            "options": case_options(case), "config": cfg.to_dict(), "launch": {"nodes": 1},
            "parameters": sizes["parameters"], "param_bytes": sizes["parameter_bytes"],
            "case": case["name"], "size": f"{case['args']['width']}x{case['args']['layers']}"}


def run_case(case: dict[str, Any], device, world: int, rank: int) -> dict[str, Any]:
    cfg = run_config(case, world, case["batch"])
    spec = engine.build_workload(cfg)
    sizes = spec.sizes()
    rec = case_record(case, cfg, sizes, world)
    s = setting_of(rec)
    here = -(-world // torch.cuda.device_count()) if device.type == "cuda" else 1
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    budgets = case.get("budgets") or {}
    cap = SAFE * max(budgets.values()) * GIB if budgets else None   # what a search's trials may reach
    replayed = case.get("replayed_reserved_mib")   # tools/device/rehearse.py: the allocator's replay
    if total is not None and (why := rehearsal_misfit(s, here, total, cap, replayed and replayed * MIB)):
        return {**rec, "status": "skipped", "reason": why}
    history = alloc_history.history_for(device, rank)   # DPBENCH_ALLOC_HISTORY: the GPU allocator's own
    model = spec.model.to(device)
    variant, opt = engine.wrap(cfg, spec, model, [device], world)
    mark = history.mark if history else (lambda name: None)
    mark(SHARDED)
    reducer = count_reducer(variant.module)
    gen = torch.Generator().manual_seed(cfg.seed + rank)
    cuda = device.type == "cuda"
    if cuda:   # gloo's page-locked staging: N ranks on one host hold it N times (run.host_staging)
        host_staging.empty_host_cache()   # DDP's broadcast of the model as it wrapped it
        host_staging.release_around_steps(opt)

    def batch_of(b: int):
        x, y = spec.batch(gen, b)
        return x.to(device), y.to(device)

    def gather(obj):
        out = [None] * world
        dist.all_gather_object(out, obj)
        return out

    started = time.perf_counter()
    x, y = batch_of(case["batch"])
    mark(WARM_START)
    if not (os.environ.get("DPBENCH_PLANT") == PLANT_DESYNC and rank == 1):   # the plant: rank 1 skips it
        train_step(variant, opt, x, y, case["batch"] * world)        # warm: the momentum exists from here
    mark(WARM_END)
    reducer["on"] = True
    mark(PROFILED_START)
    losses, row, rec["collectives"] = components.profiled_step(variant, opt, x, y, case["batch"] * world,
                                                               nullcontext, True, track_cpu=not cuda)
    reducer["on"] = False
    mark(PROFILED_END)
    if reducer["count"] and any(c.get("source") == "buckets" for c in rec["collectives"]):
        # the reducer's all-reduces as its comm hook counted them, in place of its bucket sizes
        rec["collectives"] = [c for c in rec["collectives"] if c.get("source") != "buckets"] + [
            {"collective": "all_reduce", "count": reducer["count"], "bytes": reducer["bytes"], "source": "counted"}]
    row["nvml_process_mib"] = nvml_process_mib()
    row.update(host_staging.host_peaks_mib(cuda))
    row["reserved_by_stream_mib"] = reserved_by_stream_mib(device)   # the cache after the step, per stream
    row["reserved_segments_mib"] = reserved_segments_mib(device)     # and its segments, what each held
    if history:
        history.write(f"{case['name']}-g{world}", {"case": case, "world": world, "rank": rank})
    rec["memory_components"] = [dict(r, device=i) for i, r in enumerate(gather(row))]
    context = measured_context_bytes(rec["memory_components"])
    rec["context_mib"] = round(context / MIB, 1)
    rec["step_s"] = (time.perf_counter() - started) / 2   # two steps: nobody's speed, the sizing's
    del x, y, losses

    trials: list[dict[str, Any]] = []

    trials_until = float(os.environ.get(DEADLINE_ENV, "inf")) + TRIAL_GRACE_S

    def measure(b: int) -> dict[str, Any]:
        late = [time.time() > trials_until]
        dist.broadcast_object_list(late, src=0)   # rank 0's clock: every rank stops alike
        if late[0]:
            return note({"batch": b, "how": "late", "peak_mib": None, "reserved_mib": None})
        # the trials hold the ranks' gathered maxima, so every rank decides this alike
        reserved = peak_fit(trials, "reserved_mib")
        if total is not None and reserved is not None and device_full(reserved(b), here, context, total):
            return note({"batch": b, "how": "device-full", "peak_mib": None, "reserved_mib": round(reserved(b), 1)})
        failed = False
        try:
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()   # this trial's reserved, not what the steps before it cached
                torch.cuda.reset_peak_memory_stats(device)
            xb, yb = batch_of(b)
            train_step(variant, opt, xb, yb, b * world)
            del xb, yb
            peak = torch.cuda.max_memory_allocated(device) / MIB if cuda else 0.0
            reserved = torch.cuda.max_memory_reserved(device) / MIB if cuda else 0.0
        except torch.OutOfMemoryError as e:   # uncapped: the GPU itself is full (SAFE keeps this rare)
            failed, peak, reserved = True, float("nan"), float("nan")
            # said here, before the gather: under DDP the peers may be waiting in an all-reduce
            # this rank never joins, and then only this line tells why the case timed out
            print(f"[rehearsal] {rec['run_id']} rank {rank}: out of memory at batch {b}: "
                  f"{str(e).splitlines()[0][:160]}", flush=True)
        rows = gather((failed, peak, reserved))
        if cuda:
            torch.cuda.empty_cache()
        if any(f for f, _, _ in rows):
            return note({"batch": b, "how": "failed", "peak_mib": None, "reserved_mib": None})
        return note({"batch": b, "how": "measured", "peak_mib": max(p for _, p, _ in rows),
                     "reserved_mib": max(r for _, _, r in rows)})

    def note(trial: dict[str, Any]) -> dict[str, Any]:
        if rank == 0:   # the launch log shows how far a search got if a later trial loses the ranks
            print(f"[rehearsal] {rec['run_id']} trial {trial}", flush=True)
        return trial

    if budgets and not cuda:
        rec["search_skipped"] = "no CUDA: no allocator peak to measure"
    elif budgets:
        trials.extend(t for t in (measure(1), measure(2)) if t["how"] != "late")
        rec["search"] = {name: search_budget(measure, gib, trials) for name, gib in
                         sorted(budgets.items(), key=lambda kv: -kv[1])}
        rec["search_trials"] = trials
    rec["status"], rec["reason"] = "ok", ""
    rec["wall_s"] = time.perf_counter() - started
    return rec   # the model, its optimizer and the trials' tensors go with this frame


def count_reducer(module) -> dict[str, Any]:
    """DDP's gradient all-reduces counted where they run (a comm hook that counts each bucket it
    all-reduces while "on", then all-reduces it as DDP's default does): on CUDA the reducer runs
    them on an autograd thread that the dispatch counter cannot see. Rehearsed steps only (a
    Python hook costs time, and rehearsed time is nobody's). Nothing for other variants."""
    counts: dict[str, Any] = {"on": False, "count": 0, "bytes": 0}
    if not isinstance(module, DDP):
        return counts

    def hook(state, bucket):
        if counts["on"]:
            buf = bucket.buffer()
            counts["count"] += 1
            counts["bytes"] += buf.numel() * buf.element_size()
        return default_hooks.allreduce_hook(state, bucket)
    module.register_comm_hook(None, hook)
    return counts


def failed_case(case: dict[str, Any], world: int, reason: str, status: str = "failed") -> dict[str, Any]:
    """The record of a case that did not run to its end (or, "skipped", did not start): its
    identity and size, for the tables."""
    a = {"seq_len": 512, "vocab": 32768, "tied": True, **case["args"]}
    return {"run_id": f"{case['name']}-g{world}", "case": case["name"], "variant": case["variant"], "gpus": world,
            "status": status, "reason": reason, "size": f"{a['width']}x{a['layers']}", "options": case_options(case),
            "config": {"precision": case.get("precision", "fp32"), **case.get("options", {})},
            "parameters": parameter_count(a["width"], a["layers"], a["seq_len"], a["vocab"], a["tied"])}


def missing_records(cases: list[dict[str, Any]], world: int, wrote: list[dict[str, Any]], returncode: int,
                    log: str) -> list[dict[str, Any]]:
    """A failed record for each case a launch left without one: rank 0 writes each case's record,
    and a rank killed from outside (or rank 0 stopped by torchrun after it) writes none. The
    reason names the ranks that failed first, from torchrun's report in the ranks' log."""
    have = {r.get("case") for r in wrote}
    why = (f"the launch stopped before the case wrote its record (torchrun exit {returncode}; "
           f"{first_failure(log) or 'no rank reported a failure'})")
    return [failed_case(c, world, why) for c in cases if c["name"] not in have]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plan", required=True, help="JSON: a list of cases")
    ap.add_argument("--out", required=True, type=Path, help="JSON lines, one per case (rank 0 appends)")
    args = ap.parse_args(argv)
    cases = json.loads(Path(args.plan).read_text())
    world, rank, local = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))   # NCCL refuses two ranks on one GPU
    try:
        deadline = float(os.environ.get(DEADLINE_ENV, "inf"))   # epoch seconds
        for i, case in enumerate(cases):
            if world < case.get("min_ranks", 1) or world > case.get("max_ranks", world):
                continue
            late = [time.time() > deadline]
            dist.broadcast_object_list(late, src=0)   # every rank skips the same cases
            if late[0]:
                if rank == 0:   # a case that cannot run is a row with its reason
                    skipped = failed_case(case, world, "not started: the launch's time budget was spent", "skipped")
                    with open(args.out, "a") as f:
                        f.write(json.dumps(skipped) + "\n")
                    print(f"[rehearsal] {case['name']}-g{world}: not started (time budget spent)", flush=True)
                continue
            try:
                rec = run_case(case, device, world, rank)
            except Exception as exc:   # one case's failure must not end the others' (all ranks see it)
                rec = failed_case(case, world, f"{type(exc).__name__}: {exc}"[:500])
                # every rank says its own: the first rank that failed is the cause, its peers' errors follow
                print(f"[rehearsal rank {rank}] {case['name']}-g{world} failed at {time.strftime('%H:%M:%S')}:\n"
                      f"{traceback.format_exc()[-2000:]}", file=sys.stderr, flush=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            if rank == 0:
                with open(args.out, "a") as f:
                    f.write(json.dumps(rec, default=str) + "\n")
                print(f"[rehearsal] {rec['run_id']}: {rec['status']} {rec.get('reason', '')} "
                      f"({rec.get('wall_s', 0):.1f} s)", flush=True)
            try:
                dist.barrier()
            except Exception as exc:   # the ranks lost step (a timed-out wait): the rest cannot run
                if rank == 0:
                    why = f"not run: the ranks lost step in case {case['name']} ({type(exc).__name__})"
                    with open(args.out, "a") as f:
                        for later in cases[i + 1:]:
                            f.write(json.dumps(failed_case(later, world, why)) + "\n")
                return 3
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
