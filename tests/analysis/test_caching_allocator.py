"""The caching allocator's replay follows the CUDA allocator's default rules, in numbers."""
from __future__ import annotations

import json

import pytest

from dpbench.analysis.caching_allocator import MIB, CachingAllocator, replay, round_size, segment_size


def test_round_size_is_512_at_least_then_multiples_of_512():
    assert round_size(1) == 512
    assert round_size(511) == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024
    assert round_size(4 * MIB + 1) == 4 * MIB + 512


def test_segment_sizes_by_pool():
    assert segment_size(512) == 2 * MIB            # small pool
    assert segment_size(MIB) == 2 * MIB            # 1 MiB is still small
    assert segment_size(MIB + 512) == 20 * MIB     # large, below 10 MiB
    assert segment_size(10 * MIB - 512) == 20 * MIB
    assert segment_size(10 * MIB) == 10 * MIB      # from 10 MiB: its own size ...
    assert segment_size(11 * MIB) == 12 * MIB      # ... rounded up to 2 MiB
    assert segment_size(48 * MIB + 4096) == 50 * MIB


def test_small_requests_share_a_two_mib_segment():
    sim = CachingAllocator()
    for i in range(4):
        sim.malloc(i, 100_000)                      # 100,352 B each after rounding
    snap = sim.snapshot()
    assert snap.reserved == 2 * MIB
    assert snap.allocated == 4 * 100_352
    assert snap.segments_mib == {"0": [[2.0, 4 * 100_352 / MIB]]}


def test_mid_sized_requests_split_a_twenty_mib_segment():
    sim = CachingAllocator()
    for i in range(4):
        sim.malloc(i, 4 * MIB)
    assert sim.snapshot().reserved == 20 * MIB     # 16 MiB used, 4 MiB left in one block
    sim.malloc(4, 4 * MIB)                          # the remainder serves it exactly
    assert sim.snapshot().reserved == 20 * MIB
    sim.malloc(5, 4 * MIB)
    assert sim.snapshot().reserved == 40 * MIB


def test_large_pool_keeps_a_remainder_of_one_mib_or_less_unsplit():
    sim = CachingAllocator()
    sim.malloc("a", 19 * MIB)                       # >= 10 MiB: a segment of its own, 20 MiB (2 MiB steps)
    sim.free("a")
    sim.malloc("b", 19 * MIB + 512)                 # fits the 20 MiB block; remainder < 1 MiB: not split
    sim.malloc("c", 2 * MIB)                        # nothing left in that segment: a new 20 MiB one
    snap = sim.snapshot()
    assert snap.reserved == 40 * MIB
    assert snap.allocated == 20 * MIB + 2 * MIB     # b holds the whole unsplit block


def test_large_pool_splits_when_more_than_one_mib_remains():
    sim = CachingAllocator()
    sim.malloc("big", 16 * MIB)
    sim.free("big")
    sim.malloc("x", 14 * MIB)                       # 2 MiB remain: split
    sim.malloc("y", MIB + 512)                      # 2 MiB block serves it (best fit), no new segment
    assert sim.snapshot().reserved == 16 * MIB


def test_best_fit_takes_the_smallest_block_large_enough():
    sim = CachingAllocator()
    sim.malloc("s30", 30 * MIB)
    sim.malloc("s12", 12 * MIB)
    sim.malloc("s16", 16 * MIB)
    for k in ("s30", "s12", "s16"):
        sim.free(k)
    sim.malloc("n", 11 * MIB)                       # the 12 MiB segment, not 16 or 30
    snap = sim.snapshot()
    assert snap.reserved == 58 * MIB
    held = {size: alloc for size, alloc in snap.segments_mib["0"]}
    assert held == {30.0: 0.0, 16.0: 0.0, 12.0: 12.0}   # 1 MiB remainder: not split


def test_freed_blocks_serve_only_their_own_stream():
    sim = CachingAllocator()
    sim.malloc("a", 16 * MIB, "side")
    sim.free("a")
    sim.malloc("b", 16 * MIB, "0")                  # the side stream's free block is not reused
    snap = sim.snapshot()
    assert snap.reserved_by_stream == {"side": 16 * MIB, "0": 16 * MIB}
    assert snap.allocated_by_stream == {"side": 0, "0": 16 * MIB}
    sim.malloc("c", 16 * MIB, "side")               # but serves its own stream again
    assert sim.snapshot().reserved == 32 * MIB


def test_freed_neighbours_coalesce_within_a_segment():
    sim = CachingAllocator()
    for k in "abcd":
        sim.malloc(k, 5 * MIB)                      # a 20 MiB segment cut in four
    for k in "bac":                                 # free out of order: a+b+c merge into 15 MiB
        sim.free(k)
    sim.malloc("e", 15 * MIB)                       # fits only if they merged
    assert sim.snapshot().reserved == 20 * MIB
    sim.free("e")
    sim.free("d")
    assert sim.snapshot().segments_mib == {"0": [[20.0, 0.0]]}


def test_blocks_of_two_segments_never_merge():
    sim = CachingAllocator()
    sim.malloc("a", 12 * MIB)
    sim.malloc("b", 12 * MIB)
    sim.free("a")
    sim.free("b")
    sim.malloc("c", 20 * MIB)                       # two free 12 MiB segments cannot hold it
    assert sim.snapshot().reserved == 44 * MIB


def test_segments_stay_until_empty_cache_releases_the_unused_ones():
    sim = CachingAllocator()
    sim.malloc("a", 12 * MIB)
    sim.malloc("b", 4 * MIB)
    sim.malloc("c", 4 * MIB)
    sim.free("a")
    sim.free("b")                                   # c keeps its 20 MiB segment in use
    assert sim.snapshot().reserved == 32 * MIB
    sim.empty_cache()
    snap = sim.snapshot()
    assert snap.reserved == 20 * MIB
    assert snap.peak_reserved == 32 * MIB
    assert snap.segments_mib == {"0": [[20.0, 4.0]]}


def test_segments_made_after_empty_cache_are_all_counted():
    sim = CachingAllocator()
    sim.malloc("a", 12 * MIB)
    sim.malloc("b", 16 * MIB)
    sim.free("a")
    sim.empty_cache()                               # a's segment goes, b's stays
    sim.malloc("c", 30 * MIB, "side")
    sim.malloc("d", 40 * MIB)
    snap = sim.snapshot()
    assert snap.reserved == 86 * MIB
    assert snap.reserved_by_stream == {"0": 56 * MIB, "side": 30 * MIB}


def test_zero_bytes_take_no_block():
    sim = CachingAllocator()
    sim.malloc("z", 0)
    sim.free("z")
    assert sim.snapshot().reserved == 0


def test_a_key_cannot_be_allocated_twice():
    sim = CachingAllocator()
    sim.malloc("a", 10)
    with pytest.raises(KeyError):
        sim.malloc("a", 10)


def test_replay_marks_and_empty_cache_variant():
    events = [("alloc", 1, 12 * MIB, "0"), ("free", 1), ("mark", "sharded"),
              ("alloc", 2, 4 * MIB, "0"), ("mark", "end")]
    plain = replay(events)
    assert plain.marks["sharded"].reserved == 12 * MIB
    assert plain.end.reserved == 12 * MIB           # the 4 MiB request fits the cached 12 MiB block
    emptied = replay(events, empty_cache_at=("sharded",))
    assert emptied.marks["sharded"].reserved == 0
    assert emptied.end.reserved == 20 * MIB         # a fresh 20 MiB segment instead
    assert replay([*events, ("empty_cache",)]).end.reserved == 12 * MIB   # still allocated: kept


def test_an_adopted_segment_serves_requests_and_merges_as_its_own():
    sim = CachingAllocator()
    sim.adopt_segment("0", [(32 * MIB, "workspace"), (68 * MIB, None)])
    assert (sim.reserved, sim.allocated) == (100 * MIB, 32 * MIB)
    sim.malloc("a", 60 * MIB)                      # the free 68 MiB serves it: no new segment
    assert sim.reserved == 100 * MIB
    sim.free("workspace")
    sim.free("a")                                  # both neighbours free: one block again
    sim.empty_cache()
    assert sim.reserved == 0


def test_a_case_after_another_in_its_process_finds_the_kept_workspace_where_that_case_left_it():
    """The earlier case's 100 MiB segment keeps its workspace (tagged cublas) after the cache is
    emptied between the cases; the later case's 60 MiB fits in its rest, and its own workspace
    is not made again. From nothing, the same trace reserves 60 + 32 MiB."""
    earlier = [("alloc", 0, 100 * MIB, "0"), ("free", 0), ("alloc", 1, 32 * MIB, "0", "cublas"),
               ("alloc", 2, 4 * MIB, "0"), ("mark", "end")]
    later = [("alloc", 0, 60 * MIB, "0"), ("alloc", 1, 32 * MIB, "0", "cublas"), ("mark", "end")]
    after = replay(later, after=earlier).marks["end"]
    assert (after.reserved, after.allocated) == (100 * MIB, 92 * MIB)
    assert after.segments_mib == {"0": [[100.0, 92.0]]}
    assert replay(later).marks["end"].reserved == 92 * MIB
    assert replay(later, after=earlier, kept=()).marks["end"].reserved == 60 * MIB + 32 * MIB


def test_the_command_replays_each_trace_of_a_file_and_says_which_have_none(tmp_path, capsys):
    from dpbench.analysis.caching_allocator import main
    events = [["alloc", 0, 30 * MIB, "0"], ["alloc", 1, 12 * MIB, "rs", "gloo"], ["free", 1],
              ["mark", "sharded"], ["free", 0], ["mark", "profiled_end"]]
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join([json.dumps({"case": "a", "ranks": 2, "events": events}),
                            json.dumps({"case": "b", "ranks": 2, "events": [], "reason": "its factory failed"})]))
    assert main([str(f), "--empty-cache-at", "profiled_end"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("a N=2 at sharded: reserved 42 MiB (0 30, rs 12)")
    assert lines[1].startswith("a N=2 at profiled_end: reserved 0 MiB")   # emptied there
    assert lines[2] == "b N=2: no events (its factory failed)"
    main([str(f), "--without", "gloo", "--empty-cache-at"])
    assert capsys.readouterr().out.splitlines()[0].startswith("a N=2 at sharded: reserved 30 MiB (0 30)")


def test_of_two_free_blocks_of_one_size_the_lower_address_is_taken():
    """A GPU's own history gives each new segment the driver's address. Two free 12 MiB blocks:
    the rest of a 20 MiB segment that holds 8 MiB, and a 12 MiB segment of its own. A 12 MiB
    request takes the one at the lower address; empty_cache() then releases the other only if
    it is the segment of its own."""
    for own_segment_below, reserved in ((True, 32), (False, 20)):
        a = CachingAllocator()
        a.next_segment_address = (50 if own_segment_below else 200) * MIB
        a.malloc("y", 12 * MIB)                    # a 12 MiB segment of its own
        a.next_segment_address = 100 * MIB
        a.malloc("x", 8 * MIB)                     # a 20 MiB segment: 8 held, 12 free
        a.free("y")
        a.malloc("z", 12 * MIB)
        a.empty_cache()
        assert a.snapshot().reserved == reserved * MIB
