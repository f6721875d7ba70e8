"""The caching allocator's reserved bytes by CUDA stream, from torch.cuda.memory_snapshot's
segments: the allocator keeps freed blocks per stream, so memory FSDP2 allocates on its
all-gather and reduce-scatter streams is cached apart from the compute stream's (issue 38's
reserved misses), and each segment's size and what it held allocated, where a pool's size is
to be explained (fragmentation: a segment kept for a block long freed). None on the CPU."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

MIB = 2 ** 20


def by_stream_mib(segments: Iterable[Mapping[str, Any]], device: int) -> dict[str, float]:
    """Reserved MiB per stream of one device's segments, the largest first ("0": the default
    stream; others by their handle as the snapshot gives it)."""
    out: dict[str, float] = {}
    for seg in segments:
        if seg.get("device") == device:
            key = str(seg.get("stream", "?"))
            out[key] = out.get(key, 0.0) + seg.get("total_size", 0) / MIB
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def reserved_by_stream_mib(device: torch.device) -> dict[str, float] | None:
    """This process's reserved memory on `device` by stream; None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return by_stream_mib(torch.cuda.memory_snapshot(), index)


def segments_by_stream_mib(segments: Iterable[Mapping[str, Any]], device: int) -> dict[str, list[list[float]]]:
    """Per stream of one device's segments (as by_stream_mib), each segment's [size, allocated]
    MiB at the snapshot, the largest first."""
    out: dict[str, list[list[float]]] = {}
    for seg in segments:
        if seg.get("device") == device:
            out.setdefault(str(seg.get("stream", "?")), []).append(
                [seg.get("total_size", 0) / MIB, seg.get("allocated_size", 0) / MIB])
    for sizes in out.values():
        sizes.sort(key=lambda s: -s[0])
    return {k: out[k] for k in by_stream_mib(segments, device)}


def reserved_segments_mib(device: torch.device) -> dict[str, list[list[float]]] | None:
    """This process's segments on `device` by stream ([size, allocated] MiB); None off CUDA."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return segments_by_stream_mib(torch.cuda.memory_snapshot(), index)
