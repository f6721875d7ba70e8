"""Where each rank of a distributed run is, so that a stuck run ends as a failed record naming
where it waited (torch-free: the launcher reads it).

Every wait on a peer is bounded by `collective_timeout_s` (the process group's timeout): gloo
raises when a collective outlasts it, NCCL's watchdog aborts the rank. A rank that raises
writes its own reason (engine._failed) with the place it was at; a rank that was aborted
writes nothing, so the launcher names the place from the note each rank keeps here. The note
changes at phase boundaries only (set-up, the first steps, evaluation, checkpoint, the
record), never per timed step.

What no collective timeout sees (a rank stuck on the host: a CUDA event never recorded, a lock)
the stall guard ends: once armed, a rank that goes `stall_s` without a step or a phase change
writes its error note naming the place and exits, and torchrun ends its peers.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

NOTE = "rank{rank}.wait.txt"


class Waits:
    """This rank's current place; written to its note in the run's folder when it changes."""

    def __init__(self, out: Path | None = None, rank: int = 0):
        self.out, self.rank, self.where = out, rank, "start-up"
        self.last = time.monotonic()
        self._guard: threading.Event | None = None

    def beat(self) -> None:
        """Progress (a step finished): cheap enough for every step."""
        self.last = time.monotonic()

    def arm(self, stall_s: float, poll_s: float = 1.0) -> None:
        """Start the stall guard (once): from now on `stall_s` without progress ends the rank."""
        if self._guard is not None or self.out is None:
            return
        self._guard = stop = threading.Event()
        self.beat()

        def watch():
            while not stop.wait(poll_s):
                if (idle := time.monotonic() - self.last) > stall_s:
                    reason = f"at {self.where}: no progress for {idle:.0f} s (stall guard, {stall_s:g} s)"
                    (self.out / f"rank{self.rank}.error.txt").write_text(reason + "\n")
                    os._exit(1)
        threading.Thread(target=watch, name="dpbench-stall-guard", daemon=True).start()

    def disarm(self) -> None:
        if self._guard is not None:
            self._guard.set()
            self._guard = None

    def at(self, where: str) -> None:
        self.where = where
        self.beat()
        if self.out is not None:
            (self.out / NOTE.format(rank=self.rank)).write_text(where + "\n")

    def done(self) -> None:
        """The run ended with its record: no place to name any more."""
        self.disarm()
        if self.out is not None:
            (self.out / NOTE.format(rank=self.rank)).unlink(missing_ok=True)


def notes(out: Path) -> dict[int, str]:
    """rank -> the place its note names."""
    found = {}
    for path in out.glob(NOTE.format(rank="*")):
        rank = path.name.split(".")[0].removeprefix("rank")
        if rank.isdigit():
            found[int(rank)] = path.read_text().strip()
    return dict(sorted(found.items()))


def clear(out: Path) -> None:
    for path in out.glob(NOTE.format(rank="*")):
        path.unlink(missing_ok=True)


def waited_text(out: Path, timeout_s: float) -> str:
    """'rank 0 at training step 1, rank 1 at set-up' (empty without notes)."""
    found = notes(out)
    if not found:
        return ""
    places = ", ".join(f"rank {r} at {w}" for r, w in found.items())
    return f"last places: {places} (collective timeout {timeout_s:g} s)"
