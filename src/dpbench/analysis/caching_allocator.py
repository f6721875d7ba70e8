"""PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), replayed in Python
without a GPU: what a device would reserve for a given order of allocations and frees, per
CUDA stream. Torch-free (the trace comes from claims.c9.alloc_trace, recorded on fake tensors).

The default policy only (no expandable segments, no max_split_size, no garbage-collection
threshold, no CUDA graphs, no record_stream):
- a request is rounded up to a multiple of 512 B (512 B at least);
- sizes up to 1 MiB come from the small pool, whose new segments are 2 MiB; larger ones from the
  large pool, whose new segments are 20 MiB below 10 MiB, else the size rounded up to 2 MiB;
- each (pool, stream) has its own free blocks: a freed block serves only the stream it was
  allocated on;
- best fit: the smallest free block of the pool and stream that is large enough (the lower
  address among equals); a block larger than the request is split when what remains is at least
  512 B (small pool) or more than 1 MiB (large pool), the request taking the lower addresses;
- a freed block merges with its free neighbours in its own segment;
- segments go back to the device only on `empty_cache()`, which releases every segment with
  nothing allocated (no allocation here ever fails, so the out-of-memory retries never run).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable

MIB = 2 ** 20
MIN_BLOCK = 512               # kMinBlockSize: every request a multiple of it
SMALL_SIZE = MIB              # kSmallSize: the largest request the small pool serves
SMALL_BUFFER = 2 * MIB        # kSmallBuffer: a small pool's new segment
LARGE_BUFFER = 20 * MIB       # kLargeBuffer: a new segment for requests of 1 to 10 MiB
MIN_LARGE_ALLOC = 10 * MIB    # kMinLargeAlloc: from here a segment is the request's own size
ROUND_LARGE = 2 * MIB         # kRoundLarge: what those segments are rounded up to
# A case's marks, in the order they come, in its fake-tensor trace (claims.c9.alloc_trace) and in
# the GPU's own history (run.alloc_history): after fully_shard, around the warm and profiled steps
SHARDED, WARM_START, WARM_END, PROFILED_START, PROFILED_END = (
    "sharded", "warm_start", "warm_end", "profiled_start", "profiled_end")


def round_size(nbytes: int) -> int:
    """The block size a request of `nbytes` takes (round_size without power-of-2 divisions)."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def is_small(size: int) -> bool:
    """Whether a rounded request comes from the small pool."""
    return size <= SMALL_SIZE


def segment_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request no free block serves (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-size // ROUND_LARGE)


def should_split(small: bool, remaining: int) -> bool:
    return remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE


@dataclass(eq=False)
class Block:
    address: int
    size: int
    stream: str
    small: bool
    segment: int
    allocated: bool = False
    prev: "Block | None" = None
    next: "Block | None" = None

    def key(self) -> tuple[int, int]:
        return (self.size, self.address)


@dataclass
class Segment:
    address: int
    size: int
    stream: str
    small: bool
    first: Block


@dataclass
class Snapshot:
    """The allocator's state at one point of a replay, in bytes (segments in MiB)."""
    reserved: int
    allocated: int
    peak_reserved: int
    peak_allocated: int
    reserved_by_stream: dict[str, int]
    allocated_by_stream: dict[str, int]
    segments_mib: dict[str, list[list[float]]]

    def reserved_by_stream_mib(self) -> dict[str, float]:
        return {s: b / MIB for s, b in self.reserved_by_stream.items()}


class CachingAllocator:
    """The allocator's bookkeeping for one device. Requests are named by a caller's key (a
    storage id): malloc(key, nbytes, stream), free(key), empty_cache()."""

    def __init__(self) -> None:
        # (small, stream) -> free blocks sorted by (size, address): the search key of BlockPool
        self._free: dict[tuple[bool, str], list[tuple[int, int, Block]]] = {}
        self._segments: dict[int, Segment] = {}
        self._live: dict[Any, tuple[Block, int]] = {}   # key -> (block, requested bytes)
        self._next_address = 0
        # the driver's address for the next new segment, where a replay knows it (a GPU's own
        # history): among free blocks of one size the lowest address is taken, so it decides ties
        self.next_segment_address: int | None = None
        self._next_segment = 0    # ids never reused: empty_cache leaves gaps
        self.reserved = 0
        self.allocated = 0          # rounded block bytes, as the allocator's allocated_bytes
        self.peak_reserved = 0
        self.peak_allocated = 0

    # -- the free lists -----------------------------------------------------------------------
    def _pool(self, small: bool, stream: str) -> list[tuple[int, int, Block]]:
        return self._free.setdefault((small, stream), [])

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self._pool(block.small, block.stream), (block.size, block.address, block))

    def _remove_free(self, block: Block) -> None:
        pool = self._pool(block.small, block.stream)
        i = bisect.bisect_left(pool, (block.size, block.address))
        assert pool[i][2] is block, "a free block missing from its pool"
        del pool[i]

    # -- malloc and free ----------------------------------------------------------------------
    def malloc(self, key: Any, nbytes: int, stream: str = "0") -> None:
        """Allocate `nbytes` for `key` on `stream`. Zero bytes take no block (the allocator
        returns a null pointer for them)."""
        if key in self._live:
            raise KeyError(f"{key!r} is already allocated")
        if nbytes <= 0:
            return
        size = round_size(nbytes)
        small = is_small(size)
        pool = self._pool(small, stream)
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            block = pool.pop(i)[2]
        else:
            block = self._new_segment(segment_size(size), stream, small)
        remaining = block.size - size
        if should_split(small, remaining):
            rest = Block(block.address + size, remaining, stream, small, block.segment,
                         prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert_free(rest)
        block.allocated = True
        self._live[key] = (block, nbytes)
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def adopt_segment(self, stream: str, blocks: list[tuple[int, Any]], address: int | None = None) -> None:
        """A segment that exists before the replay begins (left by what ran earlier in the
        process): its blocks in address order, each (size, key), key None for a free block."""
        size = sum(b for b, _ in blocks)
        self.next_segment_address = address
        first = self._new_segment(size, stream, size == SMALL_BUFFER)   # only the small pool's are 2 MiB
        block, address = first, first.address
        for i, (part, key) in enumerate(blocks):
            if i:
                block = Block(address, part, stream, first.small, first.segment, prev=block)
                block.prev.next = block
            block.size = part
            if key is None:
                self._insert_free(block)
            else:
                block.allocated = True
                self._live[key] = (block, part)
                self.allocated += part
            address += part
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def _new_segment(self, size: int, stream: str, small: bool) -> Block:
        segment = self._next_segment
        self._next_segment += 1
        address, self.next_segment_address = self.next_segment_address, None
        if address is None:
            address = self._next_address
            self._next_address += size
        block = Block(address, size, stream, small, segment)
        self._segments[segment] = Segment(address, size, stream, small, block)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def free(self, key: Any) -> None:
        """Return `key`'s block to the pool of the stream it was allocated on, merged with its
        free neighbours in its segment. A key never allocated (zero bytes) is ignored."""
        if key not in self._live:
            return
        block, _ = self._live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                self._merge(block, neighbour)
        self._insert_free(block)

    def _merge(self, block: Block, neighbour: Block) -> None:
        if neighbour is block.prev:
            block.address = neighbour.address
            block.prev = neighbour.prev
            if block.prev is not None:
                block.prev.next = block
            else:
                self._segments[block.segment].first = block
        else:
            block.next = neighbour.next
            if block.next is not None:
                block.next.prev = block
        block.size += neighbour.size

    def empty_cache(self) -> None:
        """Release every segment with nothing allocated (release_cached_blocks)."""
        for segment_id, seg in list(self._segments.items()):
            block = seg.first
            if block.allocated or block.next is not None:
                continue
            self._remove_free(block)
            del self._segments[segment_id]
            self.reserved -= seg.size

    # -- what it holds ------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        reserved: dict[str, int] = {}
        allocated: dict[str, int] = {}
        segments: dict[str, list[list[float]]] = {}
        for seg in self._segments.values():
            held, block = 0, seg.first
            while block is not None:
                held += block.size if block.allocated else 0
                block = block.next
            reserved[seg.stream] = reserved.get(seg.stream, 0) + seg.size
            allocated[seg.stream] = allocated.get(seg.stream, 0) + held
            segments.setdefault(seg.stream, []).append([seg.size / MIB, held / MIB])
        order = sorted(reserved, key=lambda s: -reserved[s])
        for sizes in segments.values():
            sizes.sort(key=lambda s: (-s[0], -s[1]))
        return Snapshot(self.reserved, self.allocated, self.peak_reserved, self.peak_allocated,
                        {s: reserved[s] for s in order}, {s: allocated[s] for s in order},
                        {s: segments[s] for s in order})


@dataclass
class Replay:
    """A trace replayed: the snapshot at each mark (by the mark's name) and at the end."""
    marks: dict[str, Snapshot] = field(default_factory=dict)
    end: Snapshot | None = None


def replay(events: Iterable[tuple], empty_cache_at: Iterable[str] = (), without: Iterable[str] = (),
           after: Iterable[tuple] = (), kept: Iterable[str] = ("cublas",)) -> Replay:
    """Replay a trace: ("alloc", key, nbytes, stream[, tag]), ("free", key), ("empty_cache",),
    ("mark", name). `empty_cache_at`: marks after which to empty the cache as well; `without`:
    tags whose allocations to leave out (variants of the same trace without re-recording it).
    `after`: the trace of a case that ran before this one in the same process (the rehearsal
    runs a launch's cases one after another): replayed first; then everything it allocated is
    freed but what the process keeps (tags `kept`: cuBLAS's workspaces) and the cache is emptied,
    as between two cases; this trace's own allocations of those tags are not made (they exist)."""
    at, skipped = set(empty_cache_at), set(without)
    sim = CachingAllocator()
    prior = list(after)
    if prior:
        keep, held = set(kept), set()
        for event in prior:   # its keys apart from this trace's: ("prior", key)
            if event[0] in ("alloc", "free"):
                event = (event[0], ("prior", event[1]), *event[2:])
                if event[0] == "alloc" and len(event) > 4 and event[4] in keep:
                    held.add(event[1])
            _apply(sim, event, at, skipped, None)
        for key in [k for k in sim._live if k not in held]:
            sim.free(key)
        sim.empty_cache()
        sim.peak_reserved, sim.peak_allocated = sim.reserved, sim.allocated
        skipped |= keep
    out = Replay()
    for event in events:
        _apply(sim, event, at, skipped, out)
    out.end = sim.snapshot()
    return out


def _apply(sim: CachingAllocator, event: tuple, at: set[str], skipped: set[str], out: Replay | None) -> None:
    kind = event[0]
    if kind == "alloc":
        if len(event) > 4 and event[4] in skipped:
            return   # its free finds no block and is ignored
        sim.malloc(event[1], event[2], event[3])
    elif kind == "free":
        sim.free(event[1])
    elif kind == "empty_cache":
        sim.empty_cache()
    elif kind == "mark":
        if event[1] in at:
            sim.empty_cache()
        if out is not None:
            out.marks[event[1]] = sim.snapshot()
    else:
        raise ValueError(f"unknown trace event {event!r}")


def main(argv: list[str] | None = None) -> int:
    """Replay traces (claims.c9.alloc_trace's JSON, or its --plan JSON lines) and print each
    one's reserved MiB per stream at its marks."""
    import argparse
    import json
    from pathlib import Path

    ap = argparse.ArgumentParser(description="Reserved memory per CUDA stream, replayed from allocation traces")
    ap.add_argument("traces", type=Path, help="a trace (JSON) or traces (JSON lines)")
    ap.add_argument("--empty-cache-at", nargs="*", default=[SHARDED],
                    help="marks after which the cache is emptied (default: sharded, as run.sharded does on CUDA)")
    ap.add_argument("--without", nargs="*", default=[],
                    help="tags left out: gloo (a rank over NCCL), cublas (a card before Hopper)")
    args = ap.parse_args(argv)
    text = args.traces.read_text()
    traces = [json.loads(x) for x in text.splitlines() if x.strip()] if args.traces.suffix == ".jsonl" else [json.loads(text)]
    for t in traces:
        if not t.get("events"):
            print(f"{t.get('case')} N={t.get('ranks')}: no events ({t.get('reason', 'empty')})")
            continue
        out = replay([tuple(e) for e in t["events"]], args.empty_cache_at, args.without)
        for mark, snap in out.marks.items():
            streams = ", ".join(f"{s} {mib:,.0f}" for s, mib in snap.reserved_by_stream_mib().items())
            print(f"{t.get('case')} N={t.get('ranks')} at {mark}: reserved {snap.reserved / MIB:,.0f} MiB "
                  f"({streams}), allocated {snap.allocated / MIB:,.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
