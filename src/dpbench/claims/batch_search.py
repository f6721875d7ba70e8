"""The largest batch that fits: doubling from a start, then bisection (the C1 and C9 probes' search)."""
from __future__ import annotations

from typing import Any, Callable

START = 256
CEILING = 1 << 20           # a batch beyond this fits anything this search is for
RESOLUTION = 1 / 32         # bisect until the gap is this share of the largest fitting batch
REHEARSAL_RESOLUTION = 1 / 8   # the rehearsed ranks' search (claims.c9.rehearsal): each trial is a gloo step


def largest(fits: Callable[[int], bool], granule: int = 1, start: int = START,
            ceiling: int = CEILING, resolution: float = RESOLUTION) -> dict[str, Any]:
    """The largest batch (a multiple of `granule`) for which fits() holds, assuming it holds
    for every smaller batch: {largest, smallest_failing, trials: [[batch, fits], ...]}.
    largest is 0 when not even `granule` fits; smallest_failing None when `ceiling` fits."""
    trials: list[list[Any]] = []

    def test(b: int) -> bool:
        ok = bool(fits(b))
        trials.append([b, ok])
        return ok

    lo, hi = 0, None
    ceiling -= ceiling % granule
    b = min(max(granule, start - start % granule), ceiling)
    while hi is None:
        if test(b):
            lo = b
            if b >= ceiling:
                return {"largest": lo, "smallest_failing": None, "trials": trials}
            b = min(b * 2, ceiling)
        else:
            hi = b
    while hi - lo > max(granule, int(lo * resolution)):
        mid = (lo + hi) // 2
        mid -= mid % granule
        if mid <= lo:
            break
        if test(mid):
            lo = mid
        else:
            hi = mid
    return {"largest": lo, "smallest_failing": hi, "trials": trials}
