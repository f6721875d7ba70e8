"""Reserved memory per CUDA stream without a GPU: rank 0's device allocations of the 236M fsdp
rehearsal (claims.c9.alloc_trace, on fake tensors) replayed through the caching allocator's
rules (analysis.caching_allocator), beside what the GPU rehearsals measured at the profiled
step's end (results/reference: H100 at N = 1 and 8, torch 2.11; H200 at N = 4).

Each replay is made twice: as the trace ran (the whole model's history of `model.to(device)`
before fully_shard kept in the cache, as the measured runs had it) and with `empty_cache()`
right after sharding (what run/sharded.py's shard_model does on CUDA since 5191b457).

    PYTHONPATH=src python3 tools/alloc_replay.py                 # N = 1 2 4 8, ~10 s each
    PYTHONPATH=src python3 tools/alloc_replay.py --ranks 8 --traces /tmp/traces
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

from dpbench.analysis.caching_allocator import MIB, Snapshot, replay
from dpbench.claims.c9.alloc_trace import GLOO

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results" / "reference"
# (tar, run_id, the GPU) of each N's measured rank 0
MEASURED = {1: ("h100-rehearsal-ceb1b88/n1-235m-fsdp.tar.gz", "235m-fsdp-g1", "H100, torch 2.11"),
            4: ("h200-rehearsal-4036c92/n4-235m-sharded.tar.gz", "235m-fsdp-g4", "H200, after zero1 in the same process"),
            8: ("h100-rehearsal-ceb1b88/n8-235m-fsdp.tar.gz", "235m-fsdp-g8", "H100, torch 2.11")}
SHARDED, PROFILED_END = "sharded", "profiled_end"   # claims.c9.alloc_trace's marks


def measured_row(ranks: int) -> dict | None:
    """Rank 0's memory row of the measured case at `ranks`, with the GPU it ran on."""
    if ranks not in MEASURED:
        return None
    tar_name, run_id, gpu = MEASURED[ranks]
    with tarfile.open(REFERENCE / tar_name) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("records.jsonl"))
        for line in tar.extractfile(member).read().decode().splitlines():
            rec = json.loads(line)
            if rec.get("run_id") == run_id:
                row = next(r for r in rec["memory_components"] if r.get("device") == 0)
                return {**row, "gpu": gpu}
    return None


def segment_counts(segments: list[list[float]]) -> str:
    """Segment sizes as "132x1 128x5 ...", the largest first."""
    counts = Counter(round(size, 1) for size, _ in segments)
    return " ".join(f"{size:g}x{n}" for size, n in sorted(counts.items(), reverse=True))


def record(ranks: int, folder: Path) -> tuple[list[tuple], float]:
    """The trace at `ranks` (recorded in a process of its own) and how long that took."""
    out = folder / f"trace-n{ranks}.json"
    started = time.perf_counter()
    if not out.exists():
        subprocess.run([sys.executable, "-m", "dpbench.claims.c9.alloc_trace", "--ranks", str(ranks),
                        "--out", str(out)], check=True, cwd=REPO)
    trace = json.loads(out.read_text())
    return [tuple(e) for e in trace["events"]], trace.get("wall_s", time.perf_counter() - started)


def aligned(sim_order: list[str], kept: Snapshot, got: dict, segs: dict) -> list[str | None]:
    """The measured streams (CUDA handles) in the simulated streams' rows: "0" beside "0"; a side
    stream beside the simulated one whose allocated bytes it holds (within 1 MiB: FSDP2's
    reduce-scatter stream holds the gradient shards); the rest after, the largest first."""
    others = [s for s in got if s != "0"]
    held = {s: sum(a for _, a in segs[s]) for s in others if segs.get(s)}
    out: list[str | None] = []
    for s in sim_order:
        if s == "0":
            out.append("0" if "0" in got else None)
            continue
        mib = kept.allocated_by_stream.get(s, 0) / MIB
        match = next((g for g in others if mib > 1 and g in held and abs(held[g] - mib) < 1), None)
        out.append(match)
        if match:
            others.remove(match)
    rest = iter(others)
    out = [g if g is not None or s == "0" else next(rest, None) for s, g in zip(sim_order, out)]
    return out + list(rest)


def side_by_side(ranks: int, kept: Snapshot, emptied: Snapshot, measured: dict | None,
                 peaks: tuple[int, int]) -> list[str]:
    lines = [f"## N = {ranks}" + (f" (measured: {measured['gpu']})" if measured else " (nothing measured)"), "",
             "| stream | simulated | allocated | segments | with empty_cache | segments | measured | allocated | segments |",
             "|---|---|---|---|---|---|---|---|---|"]
    sim_streams = list(kept.reserved_by_stream)
    got = (measured or {}).get("reserved_by_stream_mib") or {}
    segs = (measured or {}).get("reserved_segments_mib") or {}
    sim_order = ["0"] + [s for s in sim_streams if s != "0"]
    got_order = aligned(sim_order, kept, got, segs)
    rows = max(len(sim_order), len(got_order))
    for i in range(rows):
        s = sim_order[i] if i < len(sim_order) else None
        g = got_order[i] if i < len(got_order) else None
        cells = [s or "-"]
        for snap in (kept, emptied):
            if s and s in snap.reserved_by_stream:
                cells += [f"{snap.reserved_by_stream[s] / MIB:,.0f}"] + (
                    [f"{snap.allocated_by_stream[s] / MIB:,.1f}"] if snap is kept else []) + [
                    segment_counts(snap.segments_mib[s])]
            else:
                cells += ["-", "-", "-"] if snap is kept else ["-", "-"]
        if g:
            alloc = sum(a for _, a in segs.get(g, [])) if segs else None
            cells += [f"{g}: {got[g]:,.0f}", f"{alloc:,.1f}" if alloc is not None else "?",
                      segment_counts(segs[g]) if segs.get(g) else "?"]
        else:
            cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    total_got = sum(got.values()) if got else None
    lines.append(f"| total | {kept.reserved / MIB:,.0f} | {kept.allocated / MIB:,.1f} | peak {peaks[0] / MIB:,.0f} | "
                 f"{emptied.reserved / MIB:,.0f} | peak {peaks[1] / MIB:,.0f} | "
                 + (f"{total_got:,.0f} | | peak {measured.get('reserved_peak_mib', 0):,.0f} |" if total_got else "- | | |"))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--traces", type=Path, default=Path("/tmp/alloc-traces"),
                    help="where the traces are kept (an existing one is reused)")
    args = ap.parse_args(argv)
    args.traces.mkdir(parents=True, exist_ok=True)
    for ranks in args.ranks:
        events, wall = record(ranks, args.traces)
        kept = replay(events)
        emptied = replay(events, empty_cache_at=(SHARDED,))
        nccl = replay(events, empty_cache_at=(SHARDED,), without=(GLOO,)).marks[PROFILED_END]
        lines = side_by_side(ranks, kept.marks[PROFILED_END], emptied.marks[PROFILED_END], measured_row(ranks),
                             (kept.marks[PROFILED_END].peak_reserved, emptied.marks[PROFILED_END].peak_reserved))
        at_shard = kept.marks[SHARDED]
        lines += ["", f"trace: {len(events)} events, {wall:.1f} s; after sharding the cache held "
                  f"{at_shard.reserved / MIB:,.0f} MiB ({at_shard.allocated / MIB:,.1f} allocated), "
                  f"which empty_cache() leaves at {emptied.marks[SHARDED].reserved / MIB:,.0f}; without gloo's "
                  f"copies (NCCL's rank) {nccl.reserved / MIB:,.0f} MiB reserved: "
                  + ", ".join(f"{k} {v / MIB:,.0f}" for k, v in nccl.reserved_by_stream.items()), ""]
        print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
