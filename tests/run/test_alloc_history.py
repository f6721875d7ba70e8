"""The GPU allocator's history of a rehearsed case (run.alloc_history): written only where asked
and only on CUDA, and the snapshot's parts it keeps. The recording itself needs a GPU (verified
on an H100: results/reference/h100-alloc-history-209515f, replayed in
tests/analysis/test_gpu_alloc_history.py)."""
from __future__ import annotations

import torch

from dpbench.run import alloc_history

SNAPSHOT = {"segments": [
    {"device": 0, "address": 4096, "total_size": 2 ** 21, "stream": 0,
     "blocks": [{"size": 2 ** 20, "state": "active_allocated"}, {"size": 2 ** 20, "state": "inactive"}]},
    {"device": 1, "address": 8192, "total_size": 2 ** 21, "stream": 7,
     "blocks": [{"size": 2 ** 21, "state": "inactive"}]}]}


def test_no_history_off_cuda_or_unasked_or_beyond_rank_0(monkeypatch, tmp_path):
    monkeypatch.delenv(alloc_history.ENV, raising=False)
    assert alloc_history.history_for(torch.device("cpu"), 0) is None
    monkeypatch.setenv(alloc_history.ENV, str(tmp_path))
    assert alloc_history.history_for(torch.device("cpu"), 0) is None
    assert alloc_history.history_for(torch.device("cuda", 0), 1) is None   # rank 0 only: never touches CUDA
    assert list(tmp_path.iterdir()) == []


def test_a_devices_segments_keep_their_blocks_in_address_order():
    assert alloc_history._segments(SNAPSHOT, 0) == [[4096, 2 ** 21, 0, [[2 ** 20, "active_allocated"],
                                                                         [2 ** 20, "inactive"]]]]
    assert [s[2] for s in alloc_history._segments(SNAPSHOT, 1)] == [7]


def test_an_event_names_its_innermost_frames_first():
    frames = [{"filename": "/x/linear.py", "line": 134, "name": "forward"},
              {"filename": "/x/module.py", "line": 1790, "name": "_call_impl"},
              {"filename": "/x/module.py", "line": 1779, "name": "_wrapped_call_impl"},
              {"filename": "/x/train.py", "line": 9, "name": "main"}]
    assert alloc_history._where(frames) == ("linear.py:134:forward < module.py:1790:_call_impl < "
                                            "module.py:1779:_wrapped_call_impl")
    assert alloc_history._where([]) == ""
