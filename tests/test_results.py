"""dpbench.results: run ids read back, the run-folder walker and the defaults of old records."""
from __future__ import annotations

import pytest

from dpbench import results


@pytest.mark.parametrize("variant, gpus, repeat, options", [
    ("single", 1, 0, None),
    ("ddp", 2, 3, {}),
    ("dp_sum", 8, 12, {"global_batch": 1024}),
    ("ddp", 2, 1, {"precision": "bf16", "channels_last": True, "lr": 0.1, "bucket_cap_mb": None}),
])
def test_a_run_id_reads_back_into_its_parts(variant, gpus, repeat, options):
    rid = results.run_id(variant, gpus, repeat, options)
    parts = results.parse_run_id(rid)
    assert parts is not None
    assert (parts.variant, parts.gpus, parts.repeat) == (variant, gpus, repeat)
    assert parts.cell == results.run_id(variant, gpus, 0, options).removesuffix("-r0")
    assert f"{parts.cell}-r{parts.repeat}" == rid
    assert (parts.options == "") == (not options)


@pytest.mark.parametrize("rid", ["", "ddp", "ddp-g2", "ddp-2-r0", "ddp-g2-rx"])
def test_what_is_no_run_id_parses_to_none(rid):
    assert results.parse_run_id(rid) is None


def test_the_walker_skips_unfinished_runs_and_marks_or_raises_on_damaged_ones(tmp_path):
    runs = tmp_path / "runs"
    results.write_json(runs / "ddp-g2-r0" / results.METRICS, {"run_id": "ddp-g2-r0", "status": "ok"})
    (runs / "ddp-g2-r1").mkdir(parents=True)                      # unfinished: no metrics.json
    (runs / "single-g1-r0").mkdir()
    (runs / "single-g1-r0" / results.METRICS).write_text("{not json")
    results.write_json(runs / "single-g1-r1" / results.METRICS, ["a list"])   # JSON, no record
    (runs / "stray.txt").write_text("not a run folder")

    walked = list(results.iter_runs(runs, damaged=True))
    assert [rdir.name for _, rdir in walked] == ["ddp-g2-r0", "single-g1-r0", "single-g1-r1"]
    good, bad_json, no_record = (rec for rec, _ in walked)
    assert good == {"run_id": "ddp-g2-r0", "status": "ok"}
    for bad in (bad_json, no_record):
        assert isinstance(bad, results.DamagedRecord) and isinstance(bad.error, ValueError)
    assert bad_json.path == runs / "single-g1-r0" / results.METRICS and bad_json.run_id == "single-g1-r0"

    with pytest.raises(ValueError):   # without damaged=True a damaged record stops the walk
        list(results.iter_runs(runs))
    assert list(results.iter_runs(tmp_path / "absent", damaged=True)) == []


def test_old_records_read_with_the_planning_defaults():
    old = {"run_id": "ddp-g2-r0", "status": "ok", "gpus": 2,
           "config": {"global_batch": 250, "seed": 7}}
    rec = results.RunRecord.from_json(old)
    assert (rec.scaling, rec.per_gpu_batch, rec.seed, rec.deterministic) == ("strong", 125.0, 7, False)
    weak = results.RunRecord.from_json({**old, "config": {"global_batch": 256, "per_gpu_batch": 128}})
    assert (weak.scaling, weak.per_gpu_batch, weak.seed) == ("weak", 128, 0)
    assert results.RunRecord.planned_per_gpu_batch({"global_batch": 3}, 2) == 1.5
    assert results.RunRecord.planned_per_gpu_batch({}, 2) is None
    assert results.RunRecord.planned_per_gpu_batch({"global_batch": 3}, 0) is None
