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
