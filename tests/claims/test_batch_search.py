"""The largest-batch search: doubling, then bisection to its resolution, on the granule."""

import pytest

from dpbench.claims.c1 import probe as c1_probe


@pytest.mark.parametrize("boundary", [8, 100, 4_000, 5_000, 123_457])
def test_largest_batch_search_brackets_the_boundary_within_its_resolution(boundary):
    tried = []
    found = c1_probe.largest(lambda b: tried.append(b) or b <= boundary, granule=16)
    lo, hi = found["largest"], found["smallest_failing"]
    assert lo <= boundary < hi and lo % 16 == 0 and hi % 16 == 0
    assert hi - lo <= max(16, lo / 32)                     # within 1/32 (or one granule)
    assert [b for b, _ in found["trials"]] == tried and len(tried) <= 20
    assert all(ok == (b <= boundary) for b, ok in found["trials"])


def test_largest_batch_search_keeps_to_the_granule_up_to_the_ceiling():
    found = c1_probe.largest(lambda b: True, granule=24, ceiling=1 << 20)
    assert found["largest"] % 24 == 0 and found["largest"] > (1 << 20) - 24


def test_largest_batch_search_says_when_nothing_or_everything_fits():
    assert c1_probe.largest(lambda b: False, granule=16) == {
        "largest": 0, "smallest_failing": 16, "trials": [[256, False], [128, False], [64, False], [32, False], [16, False]]}
    found = c1_probe.largest(lambda b: True, granule=16, ceiling=4096)
    assert found["largest"] == 4096 and found["smallest_failing"] is None
