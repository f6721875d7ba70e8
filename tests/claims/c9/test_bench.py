"""C9's bench: the ledger's C9 section from the probe's rows."""
from pathlib import Path


from dpbench import results
from dpbench.claims.c9 import bench, probe

from claims.planted import CROSSING


def test_the_bench_prints_the_ledgers_c9_section_from_its_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "cuda_devices", lambda: 1)
    monkeypatch.chdir(Path(__file__).resolve().parents[3])   # experiments/claims.yaml
    one = [r for r in CROSSING if r["gpus"] == 1]
    section = bench.ledger_section(one, 12.0, tmp_path)
    assert section.startswith("## C9:") and "**Verdict: not measured here.**" in section
    assert "- The memory model predicts, on 2 GPUs" in section and "crossover itself was not measured" in section
    assert "ddp on 1 GPU(s), transformer-lm-12000000 (12M parameters), fp32: largest batch 500" in section
    table = results.ResultSet(tmp_path, "c9").claim_table("largest_batch")
    assert sorted(table["variant"]) == ["ddp", "fsdp"] and table["largest_batch"].tolist() == [500, 500]
