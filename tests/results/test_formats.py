"""dpbench.results.formats (and record.py's layout): older records upgraded to the current shape,
a new record round-tripped, a newer format refused."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpbench import results


def test_old_records_read_with_the_planning_defaults():
    old = {"run_id": "ddp-g2-r0", "status": "ok", "gpus": 2,
           "config": {"global_batch": 250, "seed": 7}}
    rec = results.RunRecord.from_json(old)
    assert (rec.scaling, rec.per_gpu_batch, rec.seed, rec.deterministic) == ("strong", 125.0, 7, False)
    weak = results.RunRecord.from_json({**old, "config": {"global_batch": 256, "per_gpu_batch": 128}})
    assert (weak.scaling, weak.per_gpu_batch, weak.seed) == ("weak", 128, 0)
    assert results.planned_per_gpu_batch({"global_batch": 3}, 2) == 1.5
    assert results.planned_per_gpu_batch({}, 2) is None
    assert results.planned_per_gpu_batch({"global_batch": 3}, 0) is None


# -- the record's format and its upgrade ------------------------------------------------------

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
# The oldest committed set: its records predate seed, scaling, launch, start-up and compile_s.
OLD_RUN = REFERENCE / "h200x2-torch-2.11.0+cu130" / "runs" / "ddp-g2-r0" / results.METRICS


def _current_record(**over) -> dict:
    from dpbench.plan.config import RunConfig
    from dpbench.results.record import planned_identity, record_fields
    cfg = RunConfig.from_dict({"variant": "ddp", "gpus": 2, "global_batch": 250, "seed": 7, **over})
    return record_fields(cfg, planned_identity(cfg, "/nonexistent"), results.STATUS_OK, "", device_type="cuda", launch={"exclusive": True},
                         provenance={"torch": "x"})


def test_an_old_reference_record_upgrades_to_the_current_shape():
    old = results.read_json(OLD_RUN)
    assert "format" not in old and "seed" not in old and "launch" not in old
    new = results.upgrade(old)
    assert new["format"] == results.FORMAT and "format" not in old   # the input is left as it was
    assert set(_current_record()) <= set(new)                        # every field a record has now
    assert (new["scaling"], new["seed"], new["deterministic"]) == ("strong", old["config"]["seed"], False)
    assert new["per_gpu_batch"] == old["config"]["global_batch"] / old["gpus"]
    assert (new["start_s"], new["startup"], new["launch"]["exclusive"]) == (None, {}, False)
    assert new["throughput"]["compile_s"] is None
    assert all("data_mib" in row for row in new["memory"])
    kept = [k for k in old if k not in ("throughput", "memory")]   # the two with fields added
    assert {k: new[k] for k in kept} == {k: old[k] for k in kept}
    assert new["throughput"].items() >= old["throughput"].items()
    assert results.upgrade(new) == new                                # idempotent
    assert results.read_metrics(OLD_RUN.parent) == new                # every reader sees one shape
    assert results.RunRecord.from_json(old) == results.RunRecord.from_json(new)


def test_a_new_record_round_trips(tmp_path):
    from dpbench.plan.config import RunConfig
    from dpbench.results.record import Record
    rec = Record(RunConfig.from_dict({"variant": "single", "gpus": 1}), tmp_path, "cpu")
    rec.steps = [{"epoch": 1, "step": 0, "loss_global": 2.0, "loss_reported": 2.0, "lr": 0.1, "step_ms": 1.0}]
    written = rec.write(results.STATUS_OK, launch={"exclusive": False}, provenance={})
    assert written["format"] == results.FORMAT and written["final_loss"] == 2.0
    assert (tmp_path / results.STEPS).is_file()
    assert results.read_metrics(tmp_path) == results.read_json(tmp_path / results.METRICS) == written
    assert results.upgrade(written) == written


def test_a_record_from_a_newer_format_is_a_clear_error_naming_the_file(tmp_path, capsys):
    from dpbench.analysis import collect, compare
    rs = results.ResultSet(tmp_path, "t")
    results.write_json(rs.metrics_path("ddp-g2-r0"), dict(_current_record(), format=results.FORMAT + 1))
    with pytest.raises(results.RecordFormatError) as err:
        list(rs.runs())
    assert str(rs.metrics_path("ddp-g2-r0")) in str(err.value) and "update" in str(err.value)
    with pytest.raises(results.RecordFormatError):
        rs.metrics("ddp-g2-r0")
    with pytest.raises(compare.InputError, match=re.escape(str(rs.metrics_path("ddp-g2-r0")))):
        compare.loading._records(tmp_path, "t")
    with pytest.raises(SystemExit) as stop:
        collect.main(["--results-dir", str(tmp_path), "--tag", "t"])
    assert stop.value.code == 2 and "metrics.json" in capsys.readouterr().err
    # a format that is no version is damage, as any unreadable record
    results.write_json(rs.metrics_path("ddp-g2-r0"), dict(_current_record(), format="two"))
    [(bad, _)] = results.iter_runs(rs.runs_dir, damaged=True)
    assert isinstance(bad, results.DamagedRecord)


def test_an_older_record_whose_train_named_a_workload_gets_it_in_its_options():
    """Plans before issue 36 left a `train` workload out of the options (and the run id); read
    through upgrade() it names the run's cell as a swept one does. The default adds nothing."""
    lm = {"name": "transformer-lm", "args": {"width": 64}}
    old = {"format": 2, "run_id": "ddp-g2-r0", "status": "ok", "variant": "ddp", "gpus": 2, "repeat": 0,
           "options": {"global_batch": 64}, "config": {"workload": lm, "options": {"global_batch": 64}}}
    rec = results.upgrade(old)
    assert rec["options"] == {"global_batch": 64, "workload": lm} and old["options"] == {"global_batch": 64}
    assert rec["run_id"] == "ddp-g2-r0"                            # its folder's name, kept
    for default in (None, "resnet18-cifar10", {"name": "resnet18-cifar10"}):
        plain = results.upgrade({**old, "config": {"workload": default}})
        assert plain["options"] == {"global_batch": 64}
    swept = results.upgrade({**old, "options": {"workload": "torchvision"}})
    assert swept["options"] == {"workload": "torchvision"}
