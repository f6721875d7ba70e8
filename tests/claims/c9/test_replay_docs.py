"""docs/sharding.md's reserved memory replayed (claims.c9.replay_docs) from the committed traces
and GPU records: the replay holds each record's traced case, the reduce-scatter stream of a
one-rank rank exactly as the GPU cached it, and the cache emptied after sharding where a launch
ran after shard_model began to empty it."""
from __future__ import annotations

from pathlib import Path

from dpbench.analysis.caching_allocator import MIB
from dpbench.claims.c9 import docs, replay_docs

REF = Path(__file__).resolve().parents[3] / "results" / "reference"


def test_every_traced_sharded_gpu_record_is_a_row():
    traced = replay_docs.traces(REF)
    rows = replay_docs.rows(REF)
    expected = {(str(r["size"]), name) for name, recs in docs.combined(REF).launches.items() for r in recs
                if r.get("status") == "ok" and not r.get("launched")
                and (str(r["size"]), replay_docs.rehearsal.variant_label(r), int(r["gpus"])) in traced}
    assert {(x.size, x.launch) for x in rows} == expected
    assert len(rows) >= 40


def test_a_one_rank_reduce_scatter_stream_is_replayed_as_the_gpu_cached_it():
    """At N = 1 the reduce-scatter stream holds the gradients and the root's buffer: its segments,
    sizes and count, as the GPU's snapshot gave them (236M, 1.08B, 1.97B)."""
    ones = [x for x in replay_docs.rows(REF) if x.gpus == 1 and x.measured_streams]
    assert {x.size for x in ones} >= {"1024x16", "2048x20", "2560x24"}
    for x in ones:
        sim = {k: v / MIB for k, v in x.replayed.reserved_by_stream.items()}
        side = [v for k, v in x.measured_streams.items() if k != "0"]
        assert side == [sim["reduce_scatter_stream"]]


def test_the_cache_is_emptied_only_after_the_last_launch_that_kept_it():
    names = [docs.launch_name(*x) for x in docs.LAUNCHES]
    kept = names.index(docs.launch_name(*replay_docs.LAST_KEPT_SEGMENTS))
    assert not any(replay_docs.emptied_cache(n) for n in names[:kept + 1])
    assert all(replay_docs.emptied_cache(n) for n in names[kept + 1:])
    # emptying changes the replay where the whole model dwarfs a rank's step: 1.97B fsdp at N = 8
    key = ("2560x24", "fsdp", 8)
    kept_mib, emptied_mib = (replay_docs.replayed(REF, key, e).reserved / MIB for e in (False, True))
    assert emptied_mib < 0.8 * kept_mib


def test_each_record_is_replayed_after_the_first_case_its_process_ran():
    """The rehearsal runs each N's cases one after another in one process: a record comes after
    that process's first case (its trace, or fsdp's at its size where ddp or zero1 ran first);
    the first case itself starts from nothing."""
    by = {(x.size, x.variant, x.gpus, x.launch.split("/")[0]): x for x in replay_docs.rows(REF)}
    one_12m = by[("256x4", "fsdp", 1, "h100-alloc-history-209515f")]           # after ddp and zero1
    assert (one_12m.after, one_12m.stand_in) == (("256x4", "fsdp", 1), True)
    one_1b = by[("2048x20", "fsdp", 1, "h100-rehearsal-11dc2db")]            # after 236M fsdp
    assert (one_1b.after, one_1b.stand_in) == (("1024x16", "fsdp", 1), False)
    eight_2b = by[("2560x24", "fsdp", 8, "h100-rehearsal-11dc2db")]          # alone in its launch
    assert (eight_2b.after, eight_2b.stand_in) == (None, False)


def test_at_11_7m_the_earlier_cases_segments_decide_reserved():
    """11.7M's records, replayed after their process's first case, hold the GPU's reserved bytes
    to the MiB; the first rules (no earlier case, two workspaces at the first GEMM) held more."""
    now = [x for x in replay_docs.rows(REF) if x.size == "256x4"]
    then = [x for x in replay_docs.rows(REF, which=replay_docs.BLIND_TRACES, preludes=False) if x.size == "256x4"]
    assert len(now) == len(then) >= 10
    assert all(abs(x.measured - x.replayed.reserved / MIB) < 1 for x in now)
    assert all(x.replayed.reserved / MIB - x.measured > 300 for x in then)
