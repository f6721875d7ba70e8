"""C9's bench: the ledger's C9 section from the probe's rows."""
from pathlib import Path


from dpbench import results
from dpbench.claims import NOT_RUN
from dpbench.claims.c9 import bench, probe

from claims.planted import CROSSING


def test_the_bench_prints_the_ledgers_c9_section_from_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "cuda_devices", lambda: 1)
    monkeypatch.chdir(Path(__file__).resolve().parents[3])   # experiments/claims.yaml
    one = [r for r in CROSSING if r["gpus"] == 1]
    section = bench.ledger_section(one, 12.0, tmp_path)
    (c9,) = [c for c in results.read_json(tmp_path / "c9" / "claims.json")["claims"] if c["id"] == "C9"]
    assert c9["verdict"] == NOT_RUN and c9["data"]["crossovers"] == []
    assert [p["cap_gib"] for p in c9["data"]["predicted"]] == [12.0]   # the memory model's prediction
    assert {(r["variant"], r["gpus"], r["largest_batch"]) for r in c9["data"]["rows"]} == {("ddp", 1, 500),
                                                                                           ("fsdp", 1, 500)}
    # the section printed is the ledger's own, that finding's evidence in it (its words: the C9 snapshot)
    assert section.startswith("## C9:") and c9["evidence"]
    assert all(f"- {line}" in section for line in c9["evidence"])
    table = results.ResultSet(tmp_path, "c9").claim_table("largest_batch")
    assert sorted(table["variant"]) == ["ddp", "fsdp"] and table["largest_batch"].tolist() == [500, 500]
