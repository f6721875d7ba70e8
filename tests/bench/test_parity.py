"""The harness-parity benchmark on the CPU: bare loops and dpbench's runs of each variant compute the
same losses step by step (the bare loop is the same computation), on 2 gloo ranks for the
distributed ones; the table's ratio, range and regime come from the runs."""
from __future__ import annotations

import csv
import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import torch.distributed as dist

from dpbench.bench import parity


def test_table_pairs_repeats_and_names_the_regime():
    rows = [{"cell": "c", "variant": "ddp", "kind": k, "repeat": r, "status": "ok", "step_ms": ms, "host_ms": h}
            for k, r, ms, h in [("bare", 0, 10.0, None), ("dpbench", 0, 12.5, 12.0),
                                ("bare", 1, 11.0, None), ("dpbench", 1, 11.0, 11.5)]]
    rows.append({"cell": "c", "variant": "fsdp", "kind": "bare", "repeat": 0, "status": "failed", "reason": "OOM"})
    by = {r["variant"]: r for r in parity.table(rows)}
    assert by["ddp"]["bare_ms"] == pytest.approx(10.5) and by["ddp"]["dpbench_ms"] == pytest.approx(11.75)
    assert (by["ddp"]["ratio_low"], by["ddp"]["ratio_high"]) == (pytest.approx(0.8), pytest.approx(1.0))
    assert by["ddp"]["bound"] == "host"   # 11.75 ms issued against 11.75 ms a step
    assert by["fsdp"]["ratio"] is None and "OOM" in by["fsdp"]["failed"]


@pytest.mark.slow
def test_bare_loops_compute_dpbench_losses(tmp_path):
    assert parity.main(["--out", str(tmp_path), "--tiny", "--ranks", "2", "--repeats", "1",
                        "--variants", "single,ddp,zero1,fsdp,fsdp-keep,hsdp"]) == 0
    doc = json.loads((tmp_path / "parity.json").read_text())
    bare = {r["variant"]: r for r in doc["runs"] if r["kind"] == "bare"}
    ours = {r["variant"]: r for r in doc["runs"] if r["kind"] == "dpbench"}
    assert set(bare) == set(ours) == {"single", "ddp", "zero1", "fsdp", "fsdp-keep", "hsdp"}
    for variant, row in bare.items():
        assert row["status"] == "ok" and ours[variant]["status"] == "ok", (variant, row, ours[variant])
        with open(tmp_path / "runs" / f"lm-tiny-{variant}-r0" / "steps.csv") as f:
            recorded = [float(r["loss_global"]) for r in csv.DictReader(f)]
        assert len(recorded) == len(row["losses"]) == 6
        assert recorded == pytest.approx(row["losses"], rel=1e-6, abs=1e-7), variant
    assert all(r["ratio"] is not None for r in doc["summary"])


def _store_server():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)


def test_group_ports_post_one_free_port_per_group_to_every_rank(monkeypatch):
    """Each process group a parity rank opens gets a port the kernel called free, the same on every
    rank (a guessed MASTER_PORT + k was in use once: one rank failed, the other dialled for 30 min)."""
    server = _store_server()
    monkeypatch.setenv("MASTER_PORT", "1")
    ranks = [parity.GroupPorts(r, 2, "127.0.0.1", server.port, wait_s=20) for r in (0, 1)]
    seen = []
    for _ in range(2):
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda g: g.next_group(), ranks))
        port = int(os.environ["MASTER_PORT"])
        with socket.socket() as s:   # free: a store can listen on it
            s.bind(("", port))
        seen.append(port)
    assert [g.opened for g in ranks] == [2, 2] and len(set(seen)) == 2
    assert [server.get(f"dpbench-parity/{k}/port").decode() for k in (1, 2)] == [str(p) for p in seen]


def test_a_rank_alone_at_a_group_fails_in_bounded_time():
    server = _store_server()
    lone = parity.GroupPorts(0, 2, "127.0.0.1", server.port, wait_s=1)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"process group 1 \(1 of 2 arrived\)"):
        lone.next_group()
    assert time.monotonic() - t0 < 5
