"""The device allocation trace of a rehearsed rank on fake tensors (claims.c9.alloc_trace): the
model's history on the device before sharding, FSDP2's streams, and a trace the caching
allocator's replay accepts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sharded_ranks import TINY_LM

from dpbench.analysis.caching_allocator import replay

REPO = Path(__file__).resolve().parents[3]
CASE = {"name": "tiny-fsdp", "variant": "fsdp", "options": {}, "batch": 4, "args": TINY_LM["args"]}


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("alloc") / "trace.json"
    subprocess.run([sys.executable, "-m", "dpbench.claims.c9.alloc_trace", "--ranks", "2", "--out", str(out),
                    "--case", json.dumps(CASE)], check=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    return json.loads(out.read_text())


def parameter_bytes() -> list[int]:
    """The tiny model's parameter storages' bytes in Module._apply's order (built here on the CPU)."""
    import torch

    from dpbench.claims.c9.alloc_trace import parameters_as_moved
    from dpbench.workloads.spec import build
    torch.manual_seed(0)
    model = build(TINY_LM).model
    return [p.untyped_storage().nbytes() for p in parameters_as_moved(model)]


def test_the_whole_model_comes_first_and_sharding_frees_it(trace):
    events = [tuple(e) for e in trace["events"]]
    moved = parameter_bytes()
    first = events[:len(moved)]
    assert [e[0] for e in first] == ["alloc"] * len(moved)
    assert [e[2] for e in first] == moved
    sharded = events.index(("mark", "sharded"))
    freed = {e[1] for e in events[:sharded] if e[0] == "free"}
    assert {e[1] for e in first} <= freed          # fully_shard replaced every full parameter


def test_marks_in_order_and_each_key_freed_at_most_once(trace):
    events = [tuple(e) for e in trace["events"]]
    assert [e[1] for e in events if e[0] == "mark"] == [
        "sharded", "warm_start", "warm_end", "profiled_start", "profiled_end"]
    frees = [e[1] for e in events if e[0] == "free"]
    assert len(frees) == len(set(frees))
    allocated = {e[1] for e in events if e[0] == "alloc"}
    assert set(frees) <= allocated


def test_fsdp_streams_are_named_and_the_replay_keeps_them_apart(trace):
    assert {"0", "all_gather_copy_in_stream", "reduce_scatter_stream"} <= set(trace["streams"])
    end = replay([tuple(e) for e in trace["events"]]).marks["profiled_end"]
    # the gradient shards are the reduce-scatter's outputs: allocated on its stream, alive at the end
    assert end.allocated_by_stream["reduce_scatter_stream"] > 0
    assert end.allocated_by_stream["all_gather_copy_in_stream"] == 0


def test_gloo_copies_each_gathered_and_reduced_buffer_on_its_stream(trace):
    """Each all-gather and reduce-scatter holds one copy of its whole payload (tagged, on the stream
    current at the call), freed before the next event of the trace's own allocations."""
    events = [tuple(e) for e in trace["events"]]
    copies = [e for e in events if e[0] == "alloc" and e[4:] == ("gloo",)]
    assert {e[3] for e in copies} == {"all_gather_stream", "reduce_scatter_stream"}
    unit_bytes = sum(parameter_bytes())   # N = 2: a step gathers and reduces every parameter
    per_step = [e[2] for e in copies if e[3] == "reduce_scatter_stream"]
    assert sum(per_step) == 2 * unit_bytes   # the warm step's and the profiled step's
    for e in copies:   # held only while the collective runs
        assert events[events.index(e) + 1] == ("free", e[1])
    with_copies = replay(events).marks["profiled_end"]
    without = replay(events, without=("gloo",)).marks["profiled_end"]
    assert "all_gather_stream" in with_copies.reserved_by_stream
    assert "all_gather_stream" not in without.reserved_by_stream


def test_cublas_workspaces_come_at_each_threads_first_gemm_as_on_the_gpu(trace):
    """The forward's first GEMM brings cuBLAS's workspace and cuBLASLt's, the backward's (the
    autograd engine's thread, its own cuBLAS handle) cuBLAS's again: each just after that GEMM's
    output, never freed, and none in the profiled step (they exist)."""
    events = [tuple(e) for e in trace["events"]]
    workspaces = [e for e in events if e[0] == "alloc" and e[4:] == ("cublas",)]
    assert [(e[2], e[3]) for e in workspaces] == [(32 * 2 ** 20, "0"), (2 ** 20, "0"), (32 * 2 ** 20, "0")]
    assert not {e[1] for e in workspaces} & {e[1] for e in events if e[0] == "free"}
    at = [events.index(e) for e in workspaces]
    assert events.index(("mark", "warm_start")) < at[0] < at[2] < events.index(("mark", "warm_end"))
    assert at[1] == at[0] + 1 and events[at[0] - 1][0] == "alloc"   # after the GEMM's own output


SHARDED_STEP = """
import json, torch, torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from dpbench.claims.c9.alloc_trace import AllocationTrace, as_on_cuda
from dpbench.claims.c9.fake import fake_store
dist.init_process_group("fake", rank=0, world_size=4, store=fake_store())
trace = AllocationTrace()
mesh = init_device_mesh("cpu", (4,))   # outside the fake mode: it reads its ranks' values
with FakeTensorMode(allow_non_fake_inputs=True):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False), torch.nn.Linear(1024, 1024, bias=False))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    as_on_cuda(opt)
    model(torch.randn(8, 1024)).sum().backward()
    with trace:
        opt.step()
dist.destroy_process_group()
print(json.dumps({"foreach": opt.param_groups[0]["foreach"],
                  "bytes": [e[2] for e in trace.events if e[0] == "alloc"]}))
"""


def test_an_optimizer_step_on_shards_allocates_shards_only():
    """foreach SGD over 4 ranks' shards (as on CUDA): the weight-decayed gradients and the first
    momentum buffers, one shard each; DTensor's sharding propagation, which runs the same ops
    on whole-shaped fake tensors, allocates nothing on a device and is left out."""
    out = subprocess.run([sys.executable, "-c", SHARDED_STEP], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    step = json.loads(out.stdout.strip().splitlines()[-1])
    shard = 1024 * 1024 * 4 // 4
    assert step["foreach"] is True
    assert sorted(step["bytes"]) == [shard] * 4   # 2 decayed gradients, 2 momentum buffers


def test_a_plan_writes_a_line_per_case_and_a_failed_case_keeps_its_reason(tmp_path):
    bad = {**CASE, "name": "bad-fsdp", "args": {**CASE["args"], "width": CASE["args"]["width"] + 1}}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([bad, CASE]))
    out = tmp_path / "traces.jsonl"
    subprocess.run([sys.executable, "-m", "dpbench.claims.c9.alloc_trace", "--ranks", "2", "--plan", str(plan),
                    "--out", str(out)], check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["case"], x["status"]) for x in lines] == [("bad-fsdp", "failed"), ("tiny-fsdp", "ok")]
    assert "width" in lines[0]["reason"] and lines[0]["events"] == []
    assert lines[1]["events"] and lines[1]["size"] == f"{CASE['args']['width']}x{CASE['args']['layers']}"


def test_a_plans_sharded_cases_get_their_replayed_reserved_bytes(tmp_path, monkeypatch):
    """What tools/device/rehearse.py sets on each case before N ranks share a GPU: the replay of
    the case's trace (the cache emptied after sharding, gloo's copies kept); none for ddp."""
    from dpbench.claims.c9.alloc_trace import replayed_reserved_mib
    ddp = {**CASE, "name": "tiny-ddp", "variant": "ddp"}
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    got = replayed_reserved_mib([CASE, ddp], 2, tmp_path)
    assert set(got) == {"tiny-fsdp"}
    events = [tuple(e) for e in json.loads((tmp_path / "traces-2.jsonl").read_text())["events"]]
    assert got["tiny-fsdp"] == replay(events, empty_cache_at=("sharded",)).marks["profiled_end"].reserved / 2 ** 20
    assert got["tiny-fsdp"] >= 2 * 32 + 1   # cuBLAS's two workspaces and cuBLASLt's at least
