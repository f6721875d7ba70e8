"""The allocator's reserved bytes by stream, from a memory snapshot's segments."""
from __future__ import annotations

import torch

from dpbench.run.cache_streams import by_stream_mib, reserved_by_stream_mib, reserved_segments_mib, segments_by_stream_mib

MIB = 2 ** 20


def test_segments_add_up_per_stream_of_the_device_largest_first():
    segments = [{"device": 0, "stream": 0, "total_size": 20 * MIB},
                {"device": 0, "stream": 7, "total_size": 30 * MIB},
                {"device": 0, "stream": 0, "total_size": 2 * MIB},
                {"device": 1, "stream": 0, "total_size": 99 * MIB}]      # another rank's GPU
    assert by_stream_mib(segments, 0) == {"7": 30.0, "0": 22.0}
    assert list(by_stream_mib(segments, 0)) == ["7", "0"]
    assert by_stream_mib(segments, 2) == {}


def test_each_streams_segments_keep_their_size_and_what_they_held_largest_first():
    segments = [{"device": 0, "stream": 0, "total_size": 2 * MIB, "allocated_size": 2 * MIB},
                {"device": 0, "stream": 7, "total_size": 30 * MIB, "allocated_size": 0},
                {"device": 0, "stream": 0, "total_size": 130 * MIB, "allocated_size": 4 * MIB},
                {"device": 1, "stream": 0, "total_size": 99 * MIB, "allocated_size": 0}]
    got = segments_by_stream_mib(segments, 0)
    assert got == {"0": [[130.0, 4.0], [2.0, 2.0]], "7": [[30.0, 0.0]]}
    assert {k: sum(s for s, _ in v) for k, v in got.items()} == by_stream_mib(segments, 0)


def test_there_is_no_cache_off_cuda():
    assert reserved_by_stream_mib(torch.device("cpu")) is None
    assert reserved_segments_mib(torch.device("cpu")) is None
