"""Time intervals of a profiled step (torch-free): how much of the communication's time no
computation overlaps (run.step_breakdown's exposed communication)."""
from __future__ import annotations


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping intervals merged, in order."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def exposed(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """The time inside the communication's intervals that no computation overlaps (same unit)."""
    comm, compute = union(comm), union(compute)
    covered = 0.0
    for a, b in comm:
        for c, d in compute:
            covered += max(0.0, min(b, d) - max(a, c))
    return length(comm) - covered
