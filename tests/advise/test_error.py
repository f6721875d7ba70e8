"""advise.error over the committed references: every cell predicted, the probe's own cells kept
out of the summary, a rehearsal folder given on the command line read like the default ones, and
without DeepSpeed or accelerate it says "not installed"."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpbench.advise import docs, error, nccl_memory, others

REF = Path(__file__).resolve().parents[2] / "results" / "reference"
REHEARSAL = REF / "h200-rehearsal-525c3e7"


def test_every_measured_cell_of_a_rehearsal_is_predicted_and_the_probe_is_kept_out():
    rows = error.cells([REHEARSAL], error.cached_estimates())
    records = error.rehearsal_records(REHEARSAL)
    profiled = [c for c in rows if c["quantity"] == "allocated" and "estimate_key" in c]
    assert len(profiled) == len([r for r in records if r.get("memory_components")])
    budgets = sum(len(r.get("search") or {}) for r in records)
    assert len([c for c in rows if c["quantity"] == "largest_batch"]) == budgets
    assert all(c["predicted"] is not None for c in rows)
    probe = [c for c in rows if c["probe"]]
    assert probe and {c["setup"] for c in probe} == {"ddp"} and {c["gpus"] for c in probe} == {1}
    s = {r["quantity"]: r for r in error.summary(rows)}
    assert s["allocated"]["cells"] == len([c for c in rows if c["quantity"] == "allocated" and not c["probe"]])


def test_the_tool_reads_a_rehearsal_folder_given_and_works_without_the_others(monkeypatch, capsys):
    monkeypatch.setattr(others, "_installed", lambda module: False)
    monkeypatch.setattr(others, "version", lambda package: others.NOT_INSTALLED)
    assert error.main([str(REHEARSAL)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert header.count(others.NOT_INSTALLED) == 2
    rows = error.cells([REHEARSAL])
    assert all(c.get("deepspeed_mib") is None and c.get("accelerate_mib") is None for c in rows)
    assert error.main([str(REF / "no-such-folder")]) == 2


def test_c1s_resnet18_batches_are_predicted_from_the_sharding_benchs_resnet18():
    rows = error.cells([REF / name for name in error.REFERENCES], error.cached_estimates())
    c1 = [c for c in rows if c["source"] == "h200-c1-probe-550c3a7"]
    assert {(c["setup"], c["measured"]) for c in c1} == {("single", 1728), ("ddp", 1728)}   # ddp: 3456 / 2
    assert all(c["quantity"] == "largest_batch" and c["predicted"] > 0 for c in c1)


SHARDING = REF / "h200-sharding-f611959"


def advise_json(path: Path, mib: float | None, device: str = "NVIDIA H200", reason: str = "") -> Path:
    """An advise --json-out file whose probe facts hold a process-group measurement."""
    group = {"process_group_mib": mib if mib is not None else 0.0, "nccl": "2.28.9", "reason": reason}
    path.write_text(json.dumps({"workload": "w", "probe": {"device": "cuda" if device != "cpu" else "cpu",
                                                           "device_name": device, "process_group_mib": group["process_group_mib"],
                                                           "process_group": group}}))
    return path


def test_measurements_are_read_from_advise_json_and_the_probes_own_and_others_skipped(tmp_path):
    files = [advise_json(tmp_path / "advise-a.json", 500.0), advise_json(tmp_path / "advise-b.json", 600.0),
             advise_json(tmp_path / "advise-cpu.json", 0.0, device="cpu", reason="no CUDA"),
             advise_json(tmp_path / "advise-failed.json", 0.0, reason="timeout"),
             tmp_path / "own.json", tmp_path / "other.json", tmp_path / "list.json"]
    files[4].write_text(json.dumps({"process_group_mib": 700.0, "nccl": "2.27.3", "reason": "", "device_name": "NVIDIA H100"}))
    files[5].write_text(json.dumps({"rows": []}))
    files[6].write_text("[1, 2]")
    got = nccl_memory.group_memory(files, tmp_path)
    assert set(got) == {"NVIDIA H200", "NVIDIA H100"}
    h200 = got["NVIDIA H200"]
    assert (h200.mib, h200.values, h200.nccl, h200.sources) == (550.0, (500.0, 600.0), ("2.28.9",),
                                                                 ("advise-a.json", "advise-b.json"))
    assert got["NVIDIA H100"].mib == 700.0


def test_nccls_memory_enters_only_the_nvml_cells_of_runs_with_an_nccl_group_on_that_gpu(tmp_path):
    measured = nccl_memory.group_memory([advise_json(tmp_path / "advise-a.json", 560.0)], tmp_path)
    before = error.cells([SHARDING, REHEARSAL], error.cached_estimates())
    after = error.cells([SHARDING, REHEARSAL], error.cached_estimates(), measured)
    assert len(before) == len(after)
    nccl = 0
    for b, a in zip(before, after):
        assert (b["quantity"], b["model"], b["setup"], b["measured"]) == (a["quantity"], a["model"], a["setup"],
                                                                          a["measured"])
        if a["quantity"] == "nvml" and a["nccl_group"]:
            nccl += 1
            assert a["process_group_mib"] == 560.0 and a["predicted"] == pytest.approx(b["predicted"] + 560.0)
        else:   # rehearsed (gloo) cells, and every allocated, reserved and largest-batch cell
            assert a["predicted"] == b["predicted"] and a.get("process_group_mib") is None
    records = error.sharding_records(SHARDING)
    assert nccl == len([r for r in records if nccl_memory.ran_nccl_group(r) and (r.get("memory") or [{}])[0].get("nvml_used_mib")
                        and r["config"]["precision"] == "fp32"])
    assert not any(nccl_memory.ran_nccl_group(r) for r in error.rehearsal_records(REHEARSAL))
    # a measurement from another GPU is not this machine's
    elsewhere = nccl_memory.group_memory([advise_json(tmp_path / "advise-h100.json", 560.0, "NVIDIA H100")], tmp_path)
    assert error.cells([SHARDING], error.cached_estimates(), elsewhere) == error.cells([SHARDING], error.cached_estimates())


def test_the_docs_apply_a_committed_measurement_and_only_to_nccl_cells(tmp_path):
    for name in error.REFERENCES:
        (tmp_path / name).symlink_to(REF / name)
    plain = docs._rows(tmp_path)
    assert not docs._measured(tmp_path) and all(c.get("process_group_mib") is None for c in plain)
    # the committed H200 measurement (h200-advise-1a5f006) enters only the NVML cells with an NCCL group
    published = docs._rows(REF)
    changed = [(a["source"], a["setup"], a["quantity"]) for a, b in zip(plain, published) if a != b]
    assert len(plain) == len(published) and changed
    assert {q for _, _, q in changed} == {"nvml"}
    assert all(b.get("nccl_group") and b["process_group_mib"] == docs._measured(REF)["NVIDIA H200"].mib
               for a, b in zip(plain, published) if a != b)
    with_file = tmp_path / "with"
    with_file.mkdir()
    for name in error.REFERENCES:
        (with_file / name).symlink_to(REF / name)
    (with_file / "h200-advise-test" / "call").mkdir(parents=True)
    advise_json(with_file / "h200-advise-test" / "call" / "advise-x.json", 560.0)
    measured = docs._measured(with_file)
    assert measured["NVIDIA H200"].mib == 560.0
    applied = [c for c in docs._rows(with_file) if c.get("process_group_mib") is not None]
    assert applied and {c["quantity"] for c in applied} == {"nvml"}
    note = docs.advise_process_group(with_file)
    assert "560" in note and "h200-advise-test/call" in note
