"""Where each rank of a distributed run is, so that a stuck run ends as a failed record naming
where it waited (torch-free: the launcher reads it).

Every wait on a peer is bounded by `collective_timeout_s` (the process group's timeout): gloo
raises when a collective outlasts it, NCCL's watchdog aborts the rank. A rank that raises
writes its own reason (engine._failed) with the place it was at; a rank that was aborted
writes nothing, so the launcher names the place from the note each rank keeps here. The note
changes at phase boundaries only (set-up, the first steps, evaluation, checkpoint, the
record), never per timed step.
"""
from __future__ import annotations

from pathlib import Path

NOTE = "rank{rank}.wait.txt"


class Waits:
    """This rank's current place; written to its note in the run's folder when it changes."""

    def __init__(self, out: Path | None = None, rank: int = 0):
        self.out, self.rank, self.where = out, rank, "start-up"

    def at(self, where: str) -> None:
        self.where = where
        if self.out is not None:
            (self.out / NOTE.format(rank=self.rank)).write_text(where + "\n")

    def done(self) -> None:
        """The run ended with its record: no place to name any more."""
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
