"""The CUDA caching allocator's own history of one rehearsed case (issue 38): every allocation,
free and new segment the GPU's allocator made, with its stream and the Python frames that asked,
marked at the step's phases, and the segments it held as the case began and as the profiled step
ended. analysis.caching_allocator replays it as it replays claims.c9.alloc_trace's fake-tensor
trace, which splits a reserved miss in two: the replay's rules (the GPU's own history replayed)
and the trace's content (the two histories side by side).

Set DPBENCH_ALLOC_HISTORY to a folder; rank 0 of each rehearsed case on CUDA writes
<case>-g<N>.json.gz there (claims.c9.rehearsal). Recording costs host time, never device memory.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import torch

ENV = "DPBENCH_ALLOC_HISTORY"
MAX_ENTRIES = 500_000     # the history's ring: far beyond a 12M-1B case's two steps
FRAMES = 3                # the innermost Python frames kept per event: what asked, and its caller


def _segments(snapshot: dict[str, Any], device: int) -> list[list[Any]]:
    """[address, size, stream, [[block size, state], ...] in address order] per segment."""
    return [[s["address"], s["total_size"], s["stream"], [[b["size"], b["state"]] for b in s["blocks"]]]
            for s in snapshot["segments"] if s["device"] == device]


def _where(frames: list[dict[str, Any]]) -> str:
    return " < ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in frames[:FRAMES])


class History:
    """The allocator's history from start() to write(); mark(name) notes how far it had got."""

    def __init__(self, device: torch.device, folder: Path):
        self.device = device.index if device.index is not None else torch.cuda.current_device()
        self.folder = folder
        self.marks: dict[str, int] = {}
        self.start_segments: list[list[Any]] = []

    def start(self) -> "History":
        torch.cuda.memory._record_memory_history(enabled=None)   # a failed case's recording ends here
        self.start_segments = _segments(torch.cuda.memory._snapshot(), self.device)
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
        return self

    def _trace(self, snapshot: dict[str, Any]) -> list[dict[str, Any]]:
        traces = snapshot.get("device_traces") or []
        return traces[self.device] if self.device < len(traces) else []

    def mark(self, name: str) -> None:
        self.marks[name] = len(self._trace(torch.cuda.memory._snapshot()))

    def write(self, name: str, extra: dict[str, Any]) -> Path:
        """Stop recording and write the history: events are [action, address, size, stream, where]."""
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        trace = self._trace(snapshot)
        out = {**extra, "torch": torch.__version__, "device": torch.cuda.get_device_name(self.device),
               "marks": self.marks, "start_segments": self.start_segments,
               "end_segments": _segments(snapshot, self.device), "truncated": len(trace) >= MAX_ENTRIES,
               "events": [[e["action"], e["addr"], e["size"], e["stream"], _where(e.get("frames") or [])]
                          for e in trace]}
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{name}.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump(out, f)
        return path


def history_for(device: torch.device, rank: int) -> History | None:
    """A started History where DPBENCH_ALLOC_HISTORY asks for one (rank 0 on CUDA), else None."""
    folder = os.environ.get(ENV)
    if not folder or device.type != "cuda" or rank != 0:
        return None
    return History(device, Path(folder)).start()
