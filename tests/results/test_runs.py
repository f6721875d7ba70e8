"""dpbench.results.runs: the run-folder walker, finished and damaged runs."""
from __future__ import annotations

import pytest

from dpbench import results


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
    assert (good["run_id"], good["status"], good["format"]) == ("ddp-g2-r0", "ok", results.FORMAT)   # upgraded
    for bad in (bad_json, no_record):
        assert isinstance(bad, results.DamagedRecord) and isinstance(bad.error, ValueError)
    assert bad_json.path == runs / "single-g1-r0" / results.METRICS and bad_json.run_id == "single-g1-r0"

    with pytest.raises(ValueError):   # without damaged=True a damaged record stops the walk
        list(results.iter_runs(runs))
    assert list(results.iter_runs(tmp_path / "absent", damaged=True)) == []
