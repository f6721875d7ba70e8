"""Reading result sets as a user leaves them (issue 28, rows 3, 4, 7, 11): every mix of ok,
failed and skipped runs; a damaged steps.csv; a read-only set; a set compared with itself or
with another experiment's. Nothing here trains: records are written with tests/fakes.py."""
from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest
from fakes import SYNTHETIC_PROVENANCE, write_fake_run

from dpbench import cli, compare_cli
from dpbench import results as R
from dpbench.analysis import collect
from dpbench.report import summarize

CPU = dict(SYNTHETIC_PROVENANCE, gpu_names=[], cuda=None, driver=None, hostname="vm")
# What a run that never reached the device facts records (a skipped run, a data failure).
NO_DEVICE = {k: v for k, v in CPU.items() if k != "gpu_names"} | {"gpu_names": None}


def write_set(root: Path, tag: str, runs: list[dict]) -> R.ResultSet:
    for run in runs:
        write_fake_run(R.runs_dir(root, tag), **{"device_type": "cpu", "provenance": CPU, **run})
    assert collect.main(["--results-dir", str(root), "--tag", tag]) == 0
    return R.ResultSet(root, tag)


def compare_json(root: Path, baseline: str, candidate: str, capsys) -> tuple[int, dict, str, str]:
    code = compare_cli.main(["--results-dir", str(root), "--baseline", baseline, "--candidate", candidate])
    err = capsys.readouterr().err
    md, js = R.compare_paths(root, baseline, candidate)
    return code, json.loads(js.read_text()), md.read_text(), err


OK_RUNS = [dict(variant="single", images_per_s=v, repeat=r) for r, v in enumerate((990.0, 1010.0))]
# The data was not there: failed before the device facts (no gpu_names), and after them ([]).
NOT_OK_RUNS = [dict(variant="ddp", gpus=2, status="failed", images_per_s=None, provenance=NO_DEVICE,
                    reason="CIFAR-10 is not at /data/cifar-10-batches-py"),
               dict(variant="ddp", gpus=1, status="failed", images_per_s=None,
                    reason="CIFAR-10 is not at /data/cifar-10-batches-py"),
               dict(variant="ddp", gpus=4, status="skipped", images_per_s=None, provenance=NO_DEVICE,
                    reason="needs 4 GPUs, 0 visible")]


# == row 3: every mix of failed, skipped and ok runs =========================================

@pytest.mark.parametrize("mix", ["ok+failed+skipped", "failed+skipped"])
def test_collect_summary_and_compare_read_every_mix_of_runs(tmp_path, mix, capsys):
    runs = (OK_RUNS if mix.startswith("ok") else []) + NOT_OK_RUNS
    rs = write_set(tmp_path, "mix", runs)
    prov = rs.provenance()
    assert prov["gpu_names"] in ([], None)            # no null beside the runs' lists
    assert summarize.main(["--results-dir", str(tmp_path), "--tag", "mix"]) == 0
    assert rs.summary_md.exists()
    code, report, _, _ = compare_json(tmp_path, "mix", "mix", capsys)
    assert code == 0 and not report["provenance"]["hardware_differs"]
    statuses = dict(zip(rs.table("summary")["run_id"], rs.table("summary")["status"]))
    assert statuses["ddp-g4-r0"] == "skipped" and statuses["ddp-g2-r0"] == "failed"


def test_a_provenance_json_with_null_gpu_names_still_summarises(tmp_path):
    """A set collected by the older code ([null, []]) reads as no GPU, not a crash."""
    rs = write_set(tmp_path, "old", NOT_OK_RUNS)
    prov = rs.provenance()
    prov["gpu_names"] = [None, []]
    R.write_json(rs.provenance_path, prov)
    assert R.gpu_models(prov) == [] and R.widest_gpu_names(prov) == []
    assert summarize.main(["--results-dir", str(tmp_path), "--tag", "old"]) == 0


def test_failed_runs_on_the_same_machine_do_not_read_as_other_hardware(tmp_path, capsys):
    write_set(tmp_path, "good", OK_RUNS)
    write_set(tmp_path, "broken", NOT_OK_RUNS)
    code, report, _, _ = compare_json(tmp_path, "good", "broken", capsys)
    assert code == 0
    assert not report["provenance"]["hardware_differs"] and report["provenance"]["warning"] is None


# == row 3: the data folder ==================================================================

@pytest.mark.parametrize("which", ["data_root", "cifar folder"])
def test_a_data_path_that_is_a_file_is_named_as_a_file(tmp_path, which):
    from dpbench.run import datasets
    root = tmp_path / "data"
    if which == "data_root":
        root.write_text("")
        path = root
    else:
        root.mkdir()
        path = root / datasets.CIFAR_FOLDER
        path.write_text("")
    with pytest.raises(datasets.DatasetUnavailable) as err:
        datasets.load_cifar10(root, download=True)
    assert err.value.in_the_way == path and err.value.folder == root / datasets.CIFAR_FOLDER
    first = str(err.value).splitlines()[0]
    assert str(path) in first and "synthetic" in first


def test_a_failed_download_creates_no_folder(tmp_path, monkeypatch):
    from dpbench.run import datasets

    class OfflineCIFAR10:   # what torchvision does offline: makes the root, leaves part of the archive
        def __init__(self, root, train, download):
            Path(root).mkdir(parents=True, exist_ok=True)
            (Path(root) / datasets.ARCHIVE).write_bytes(b"\x1f\x8b part")
            raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(datasets, "import_torchvision", lambda module="": types.SimpleNamespace(CIFAR10=OfflineCIFAR10))
    root = tmp_path / "no" / "such" / "data"
    with pytest.raises(datasets.DatasetUnavailable) as err:
        datasets.load_cifar10(root, download=True)
    assert err.value.folder == root / datasets.CIFAR_FOLDER
    assert err.value.missing == datasets.TRAIN_FILES + ["test_batch"]
    assert not (tmp_path / "no").exists() and tmp_path.exists()


# == row 4: a damaged steps.csv ==============================================================

def _cut(path: Path, how: str) -> None:
    text = path.read_text()
    first = text.index("\n")
    path.write_text({"half a line": text[: first // 2],
                     "mid-row": text[: len(text) - 7],
                     "a whole row lost": text[: text.rstrip("\n").rindex("\n") + 1]}[how])


@pytest.mark.parametrize("how", ["half a line", "mid-row", "a whole row lost"])
def test_a_cut_steps_csv_is_a_failed_row_naming_the_file_and_the_rerun(tmp_path, how, capsys):
    write_set(tmp_path, "base", OK_RUNS)
    rs = write_set(tmp_path, "cut", OK_RUNS)
    bad = rs.steps_path("single-g1-r1")
    _cut(bad, how)
    assert collect.main(["--results-dir", str(tmp_path), "--tag", "cut"]) == 0
    summary = rs.table("summary").set_index("run_id")
    assert summary.loc["single-g1-r0", "status"] == "ok"
    assert summary.loc["single-g1-r1", "status"] == "failed"
    reason = summary.loc["single-g1-r1", "reason"]
    assert str(bad) in reason and str(rs.metrics_path("single-g1-r1")) in reason and "--forcerun" in reason
    steps = rs.table("steps")
    assert set(steps["run_id"]) == {"single-g1-r0"}     # no half row read as data
    # compare reads a damaged run as a broken input (exit 2, naming it), never as a failed run
    capsys.readouterr()
    code = compare_cli.main(["--results-dir", str(tmp_path), "--baseline", "base", "--candidate", "cut"])
    err = capsys.readouterr().err
    assert code == 2 and "single-g1-r1" in err and "damaged" in err


def test_an_intact_steps_csv_and_a_run_without_one_are_read(tmp_path):
    rs = write_set(tmp_path, "t", OK_RUNS)
    rs.steps_path("single-g1-r0").unlink()                # a committed reference keeps none
    assert collect.main(["--results-dir", str(tmp_path), "--tag", "t"]) == 0
    assert set(rs.table("summary")["status"]) == {"ok"}
    assert set(rs.table("steps")["run_id"]) == {"single-g1-r1"}


# == row 7: a result set that is not writable ================================================

def _refuse(dir=None, **_):
    """As a non-root user's folder without write permission refuses a new file (the tests run as
    root, which permissions do not stop)."""
    raise PermissionError(13, "Permission denied", str(Path(dir) / ".x.tmp"))


@pytest.mark.parametrize("command", ["collect", "plots", "summary"])
def test_a_read_only_result_set_is_one_line_and_exit_2(tmp_path, command, capsys, monkeypatch):
    write_set(tmp_path, "ro", OK_RUNS + NOT_OK_RUNS)
    monkeypatch.setattr(R.files.tempfile, "mkstemp", _refuse)
    try:
        code = cli.main([command, "--results-dir", str(tmp_path), "--tag", "ro"])
    except SystemExit as exc:   # collect leaves through argparse's exit, as `dpbench collect` does
        code = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert str(tmp_path / "ro") in lines[0]


def test_a_missing_folder_under_a_read_only_one_names_the_read_only_one(tmp_path, monkeypatch):
    def refuse_mkdir(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "mkdir", refuse_mkdir)
    with pytest.raises(R.NotWritable) as err:
        R.write_atomic(tmp_path / "ro" / "figures" / "x.png", b"")
    assert err.value.filename == str(tmp_path)   # the nearest folder that exists refused


# == row 11: a set compared with itself, or with another experiment's ========================

def test_a_set_compared_with_itself_says_so(tmp_path, capsys):
    write_set(tmp_path, "a", OK_RUNS)
    code, report, md, _ = compare_json(tmp_path, "a", "a", capsys)
    assert code == 0
    assert report["sets"]["same_set"] and report["sets"]["same_because"] == "same folder"


def test_a_copy_of_a_set_under_another_tag_is_the_same_set(tmp_path, capsys):
    write_set(tmp_path, "a", OK_RUNS)
    shutil.copytree(tmp_path / "a", tmp_path / "a-copy")
    code, report, md, _ = compare_json(tmp_path, "a", "a-copy", capsys)
    assert code == 0
    assert report["sets"]["same_set"] and report["sets"]["same_because"] == "identical records"
    assert not report["sets"]["experiments"]["differ"]


def test_two_launches_of_one_experiment_are_an_ordinary_comparison(tmp_path, capsys):
    write_set(tmp_path, "a", OK_RUNS)
    write_set(tmp_path, "b", [dict(r, images_per_s=r["images_per_s"] + 5) for r in OK_RUNS])
    code, report, md, _ = compare_json(tmp_path, "a", "b", capsys)
    sets = report["sets"]
    assert code == 0 and not sets["same_set"] and not sets["experiments"]["differ"]
    assert sets["shared_cells"] == 1 and sets["only_baseline"] == sets["only_candidate"] == []


def test_sets_of_different_experiments_say_which_cells_they_share(tmp_path, capsys):
    write_set(tmp_path, "scaling", OK_RUNS + [dict(variant="ddp", gpus=2, images_per_s=1700.0)])
    write_set(tmp_path, "smoke", OK_RUNS + [dict(variant="dp", gpus=2, images_per_s=1500.0),
                                            dict(variant="dp", gpus=1, images_per_s=900.0)])
    code, report, md, _ = compare_json(tmp_path, "scaling", "smoke", capsys)
    sets = report["sets"]
    assert code == 0 and not sets["same_set"]
    assert sets["experiments"]["differ"] and sets["shared_cells"] == 1
    assert sets["experiments"]["baseline"]["cells"] == 2 and sets["experiments"]["candidate"]["cells"] == 3
    assert sets["only_baseline"] == [{"variant": "ddp", "gpus": 2, "options": ""}]
    assert [c["variant"] for c in sets["only_candidate"]] == ["dp", "dp"]
    assert "`ddp g2`" in md   # the cell only the baseline has is named
