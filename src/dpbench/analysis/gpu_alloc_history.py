"""A GPU allocator's own history (run.alloc_history's dump of one rehearsed case) as replay
events for analysis.caching_allocator, and where it differs from a fake-tensor trace of the same
case (claims.c9.alloc_trace). Replaying the GPU's own requests checks the replay's rules alone:
the segments it ends with should be the GPU's. Torch-free.

The dump's events are the allocator's: alloc, free_requested, free_completed (a block is reusable
from then: later than requested where a block was used on another stream), segment_alloc,
segment_free. The segments held as the case began (another case's, earlier in the same process)
are adopted as they were; a run of segment_free events is one empty_cache(); each new segment
takes the address the driver gave it (among free blocks of one size the lowest address is taken).
"""
from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

from dpbench.analysis.caching_allocator import MIB, WARM_END, WARM_START, CachingAllocator, Replay, Snapshot

DEFAULT_STREAM = "0"


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def stream_labels(dump: dict[str, Any]) -> dict[int, str]:
    """The GPU's stream handles as labels: 0 the default stream "0", the others "s1", "s2", ... by
    first use (their handles differ between processes; their names are not in the dump)."""
    labels = {0: DEFAULT_STREAM}
    for seg in dump["start_segments"]:
        labels.setdefault(seg[2], f"s{len(labels)}")
    for e in dump["events"]:
        labels.setdefault(e[3], f"s{len(labels)}")
    return labels


def replayed(dump: dict[str, Any], driver_addresses: bool = True) -> Replay:
    """The dump's requests replayed from its start segments: a snapshot at each mark (by the
    number of events recorded when the mark was taken) and at the end. `driver_addresses` False:
    new segments take the replay's own addresses, as a trace's do (it cannot know the driver's)."""
    labels = stream_labels(dump)
    sim = CachingAllocator()
    live: dict[int, int] = {}   # address -> the key of the block allocated there
    n = 0
    for address, _, stream, blocks in dump["start_segments"]:
        start, parts = address, []
        for size, state in blocks:
            key = None
            if state != "inactive":
                key = live[address] = n
                n += 1
            parts.append((size, key))
            address += size
        sim.adopt_segment(labels[stream], parts, start if driver_addresses else None)
    at = {i: name for name, i in dump["marks"].items()}
    out = Replay()
    for i, (action, address, size, stream, _) in enumerate(dump["events"]):
        if i in at:
            out.marks[at[i]] = sim.snapshot()
        if action == "segment_alloc" and driver_addresses:   # it breaks ties between free blocks
            sim.next_segment_address = address
        elif action == "alloc":
            live[address] = n
            sim.malloc(n, size, labels[stream])
            n += 1
        elif action == "free_completed" and address in live:
            sim.free(live.pop(address))
        elif action == "segment_free" and (i == 0 or dump["events"][i - 1][0] != "segment_free"):
            sim.empty_cache()   # one empty_cache() frees its run of segments (shard_model's, from 5191b45)
    for i, name in at.items():
        if i >= len(dump["events"]):
            out.marks[name] = sim.snapshot()
    out.end = sim.snapshot()
    return out


def gpu_segments(dump: dict[str, Any], which: str = "end_segments") -> dict[str, list[list[float]]]:
    """The GPU's segments by stream label, each [size, allocated] MiB, the largest first (as
    Snapshot.segments_mib)."""
    labels = stream_labels(dump)
    out: dict[str, list[list[float]]] = {}
    for _, _, stream, blocks in dump[which]:
        out.setdefault(labels[stream], []).append(
            [sum(b for b, _ in blocks) / MIB, sum(b for b, s in blocks if s != "inactive") / MIB])
    for sizes in out.values():
        sizes.sort(key=lambda s: (-s[0], -s[1]))
    return out


def gpu_reserved_by_stream_mib(dump: dict[str, Any]) -> dict[str, float]:
    """What the GPU held reserved as the case ended, per stream label, MiB."""
    return {stream: sum(size for size, _ in sizes) for stream, sizes in gpu_segments(dump).items()}


def segment_sizes(segments: dict[str, list[list[float]]]) -> dict[str, Counter]:
    """Per stream, how many segments of each size (MiB): what the reserved bytes are made of."""
    return {stream: Counter(size for size, _ in sizes) for stream, sizes in segments.items()}


def segments_match(dump: dict[str, Any], snapshot: Snapshot | None = None) -> bool:
    """Whether a replay ends with the GPU's segments: the same sizes on each stream."""
    snapshot = snapshot or replayed(dump).end
    return segment_sizes(snapshot.segments_mib) == segment_sizes(gpu_segments(dump))


def kept_from_warm_step(dump: dict[str, Any], optimizer_frame: str = "sgd.py") -> list[tuple[int, str]]:
    """What the warm step allocated and the case still held as it ended, the optimizer's state
    aside: [(bytes, where)] in the order allocated, `where` "" where no Python frame asked (the
    autograd engine's thread). In a process's first case: cuBLAS's workspaces."""
    live: dict[int, tuple[int, list[Any]]] = {}
    for i, e in enumerate(dump["events"]):
        if e[0] == "alloc":
            live[e[1]] = (i, e)
        elif e[0] == "free_completed":
            live.pop(e[1], None)
    start, end = dump["marks"][WARM_START], dump["marks"][WARM_END]
    return [(e[2], e[4]) for i, e in sorted(live.values(), key=lambda x: x[0])
            if start <= i < end and optimizer_frame not in e[4]]
