"""The tidy tables read back: how each run was planned, records from before strong and weak
scaling, and a damaged record collected as a failed row."""
from __future__ import annotations

import pytest
from fakes import fake_result_set, write_fake_run
from scaling_runs import SPEC, cell

from dpbench import results
from dpbench.analysis import collect
from dpbench.analysis.cell_table import cells


@pytest.fixture(scope="module")
def rs(tmp_path_factory):
    return fake_result_set(tmp_path_factory.mktemp("tables"), SPEC)


def test_summary_csv_records_how_each_run_was_planned(rs):
    summary = rs.table("summary").set_index("run_id")
    weak = summary.loc["ddp-g4-per_gpu_batch256-r1"]
    assert (weak["scaling"], weak["per_gpu_batch"], weak["global_batch"], weak["seed"]) == \
        ("weak", 256, 1024, 1)
    strong = summary.loc["ddp-g2-global_batch512-r0"]
    assert (strong["scaling"], strong["per_gpu_batch"]) == ("strong", 256)
    assert not strong["deterministic"]
    # the batch fields do not make a different setup; precision and channels_last do
    assert summary.loc["single-g1-global_batch1024-r0", "setup"] == strong["setup"]
    assert summary.loc["single-g1-channels_lasttrue-global_batch512-precisionbf16-r0", "setup"] \
        != strong["setup"]


def test_records_from_before_scaling_read_as_strong(tmp_path):
    rs = fake_result_set(tmp_path, [
        dict(variant="single", images_per_s=[1000.0, 1010.0], legacy=True),
        dict(variant="ddp", gpus=2, images_per_s=[1800.0, 1820.0], legacy=True)])
    row = rs.table("summary").set_index("run_id").loc["ddp-g2-r0"]
    assert (row["scaling"], row["per_gpu_batch"], row["seed"]) == ("strong", 64, 0)
    c = cell(cells(rs.table("summary")), "ddp", 2, {})
    assert c["efficiency_strong"] == pytest.approx(1810 / (2 * 1005))


def test_a_damaged_record_becomes_a_failed_row_and_the_rest_is_collected(tmp_path, capsys):
    runs = results.runs_dir(tmp_path, "t")
    write_fake_run(runs, variant="single", images_per_s=1000.0)
    bad = write_fake_run(runs, variant="ddp", gpus=2, images_per_s=1800.0) / results.METRICS
    bad.write_text('{"run_id": "ddp-g2-r0", "status": ')
    assert collect.main(["--results-dir", str(tmp_path), "--tag", "t", "--print"]) == 0
    summary = results.read_table(tmp_path, "t", "summary").set_index("run_id")
    assert summary.loc["single-g1-r0", "status"] == "ok"
    row = summary.loc["ddp-g2-r0"]
    assert (row["status"], row["variant"], row["gpus"]) == ("failed", "ddp", 2)
    assert str(bad) in row["reason"] and "--forcerun" in row["reason"]   # the file and the rerun
    assert "JSONDecodeError" in row["reason"]
    assert "Traceback" not in capsys.readouterr().err
