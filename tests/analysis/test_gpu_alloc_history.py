"""The H100's own allocator history of three 11.7M cases run one after another in one process
(results/reference/h100-alloc-history-209515f: ddp, zero1, fsdp at N = 1), replayed through the
caching allocator's rules (analysis.gpu_alloc_history), and the fake-tensor trace of the same
fsdp case beside it (claims.c9.alloc_trace)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dpbench.analysis import gpu_alloc_history as history
from dpbench.analysis.caching_allocator import MIB, replay

REPO = Path(__file__).resolve().parents[2]
REF = REPO / "results/reference/h100-alloc-history-209515f"
ORDER = ("ddp", "zero1", "fsdp")   # the launch's cases, in the order its one process ran them
CASE_12M_FSDP = {"name": "12m-fsdp", "variant": "fsdp", "options": {}, "batch": 8,
                 "args": {"width": 256, "layers": 4, "heads": 4}}


def dump(variant: str) -> dict:
    return history.load(REF / "hist" / f"12m-{variant}-g1.json.gz")


def records() -> dict[str, dict]:
    with tarfile.open(REF / "n1-12m.tar.gz") as tar:
        lines = tar.extractfile("records.jsonl").read().decode().splitlines()
    return {r["variant"]: r for r in map(json.loads, lines)}


@pytest.mark.parametrize("variant", ORDER)
def test_the_gpus_own_requests_replay_to_its_segments_and_reserved_bytes(variant):
    d = dump(variant)
    end = history.replayed(d).end
    assert history.segments_match(d, end)
    rank0 = records()[variant]["memory_components"][0]
    assert end.reserved / MIB == rank0["reserved_peak_mib"]
    assert end.reserved_by_stream_mib()["0"] == rank0["reserved_by_stream_mib"]["0"]


def test_a_later_case_begins_with_segments_the_first_case_left_and_they_decide_its_reserved():
    """Only the process's first case starts from nothing. The fsdp case (third) began with the
    segments holding cuBLAS's workspaces; replayed without them its requests cache more."""
    first, third = dump("ddp"), dump("fsdp")
    assert first["start_segments"] == [] and third["start_segments"]
    alone = history.replayed({**third, "start_segments": []}).end
    assert alone.reserved > history.replayed(third).end.reserved
    assert not history.segments_match(third, alone)


def test_a_processs_first_case_makes_cublas_workspaces_for_the_forward_and_the_backward_thread():
    """Kept from the first case's warm step: the forward's first GEMM's 32 MiB and 1 MiB, and
    32 MiB the autograd engine's thread asked for (no Python frame); later cases make none."""
    kept = history.kept_from_warm_step(dump("ddp"))
    assert [size for size, _ in kept] == [32 * MIB, MIB, 32 * MIB]
    assert [where.startswith("linear.py") for _, where in kept[:2]] == [True, True] and kept[2][1] == ""
    assert history.kept_from_warm_step(dump("zero1")) == history.kept_from_warm_step(dump("fsdp")) == []


@pytest.fixture(scope="module")
def fake_trace(tmp_path_factory) -> list[tuple]:
    out = tmp_path_factory.mktemp("alloc12m") / "trace.json"
    subprocess.run([sys.executable, "-m", "dpbench.claims.c9.alloc_trace", "--ranks", "1", "--out", str(out),
                    "--case", json.dumps(CASE_12M_FSDP)], check=True,
                   env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=300)
    return [tuple(e) for e in json.loads(out.read_text())["events"]]


def test_the_fake_trace_after_an_earlier_case_of_its_size_gives_the_gpus_segments(fake_trace):
    """The fsdp case replayed after an earlier case of the same size (its own trace standing for
    the ddp and zero1 cases the GPU ran first) ends with the GPU's segments, stream by stream;
    replayed as a process's first case it caches the model's mid-sized segments besides."""
    gpu = history.segment_sizes(history.gpu_segments(dump("fsdp")))
    after = replay(fake_trace, empty_cache_at=("sharded",), after=fake_trace).marks["profiled_end"]
    got = history.segment_sizes(after.segments_mib)
    assert sorted(got.values(), key=str) == sorted(gpu.values(), key=str)   # side streams: named vs numbered
    assert after.reserved / MIB == records()["fsdp"]["memory_components"][0]["reserved_peak_mib"]
    fresh = replay(fake_trace, empty_cache_at=("sharded",)).marks["profiled_end"]
    assert fresh.reserved > after.reserved


def test_what_the_earlier_case_leaves_is_what_the_gpus_first_cases_left(fake_trace):
    """Between cases the rehearsal frees everything and empties the cache: the fsdp trace standing
    in for the ddp and zero1 cases leaves the segments the fsdp case found on the GPU, each with
    what it held (the workspaces)."""
    left = replay([("mark", "next")], empty_cache_at=("sharded",), after=fake_trace).marks["next"]
    assert left.segments_mib == history.gpu_segments(dump("fsdp"), "start_segments")


LATER = REPO / "results/reference/h100-rehearsal-ab61c43"
LATER_CASES = {"1b-fsdp-g1": "n1-1b-fsdp-hist.tar.gz", "235m-fsdp-g2": "n2-235m-fsdp-hist.tar.gz"}


def later(case: str) -> tuple[dict, dict]:
    """A later launch's history of one case (alone in its process) and rank 0's record of it."""
    with tarfile.open(LATER / LATER_CASES[case]) as tar:
        (rec,) = [json.loads(x) for x in tar.extractfile("records.jsonl").read().decode().splitlines()]
    return history.load(LATER / "hist" / f"{case}.json.gz"), rec["memory_components"][0]


@pytest.mark.parametrize("case", sorted(LATER_CASES))
def test_freed_segments_and_the_drivers_addresses_make_the_replay_the_gpus(case):
    """Both cases empty the cache after sharding (segment_free events); replayed with that and
    each new segment at the driver's address, the requests give the GPU's segments and bytes."""
    d, rank0 = later(case)
    assert any(e[0] == "segment_free" for e in d["events"])
    end = history.replayed(d).end
    assert history.segments_match(d, end)
    assert end.reserved / MIB == rank0["reserved_peak_mib"]
    gpu = history.gpu_reserved_by_stream_mib(d)
    assert end.reserved_by_stream_mib() == gpu


def test_without_the_drivers_addresses_a_tie_between_free_blocks_goes_the_other_way():
    """236M at N = 2: with the replay's own addresses (a trace's), one 130 MiB request on the
    default stream takes a free block that on the GPU held a 2 MiB block by then, and the GPU's
    extra 132 MiB segment is not made; the side streams are the GPU's either way."""
    d, _ = later("235m-fsdp-g2")
    own = history.replayed(d, driver_addresses=False).end.reserved_by_stream_mib()
    gpu = history.gpu_reserved_by_stream_mib(d)
    assert gpu[history.DEFAULT_STREAM] - own[history.DEFAULT_STREAM] == 132
    assert {k: v for k, v in own.items() if k != history.DEFAULT_STREAM} == \
        {k: v for k, v in gpu.items() if k != history.DEFAULT_STREAM}
    one, _ = later("1b-fsdp-g1")
    assert history.segments_match(one, history.replayed(one, driver_addresses=False).end)


def test_one_cases_reserved_differs_between_launches_by_the_tie_the_drivers_addresses_break():
    """1.08B zero1 at N = 4 on an H200, twice: at 72e1378 with its history, at a7dce61 without.
    The history replays to its own launch's bytes with the driver's addresses, and to the other
    launch's without them."""
    h200 = REPO / "results/reference/h200-rehearsal-72e1378"
    d = history.load(h200 / "hist" / "1b-zero1-g4.json.gz")
    with tarfile.open(h200 / "n4-1b-zero1-hist.tar.gz") as tar:
        (now,) = [json.loads(x) for x in tar.extractfile("records.jsonl").read().decode().splitlines()]
    with tarfile.open(REPO / "results/reference/h200-rehearsal-a7dce61/n4-1b-zero1.tar.gz") as tar:
        (then,) = [json.loads(x) for x in tar.extractfile("records.jsonl").read().decode().splitlines()]
    assert history.replayed(d).end.reserved / MIB == now["memory_components"][0]["reserved_peak_mib"]
    without = history.replayed(d, driver_addresses=False).end.reserved / MIB
    assert without == then["memory_components"][0]["reserved_peak_mib"] != now["memory_components"][0]["reserved_peak_mib"]
