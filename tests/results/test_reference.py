import subprocess

import pytest

from dpbench import results
from dpbench.host import source as provenance
from dpbench.results import reference


def _run(root, rid, sha):
    results.write_json(root / "runs" / rid / results.METRICS,
                       {"run_id": rid, "status": "ok", "provenance": {"git_sha": sha}})
    results.write_csv(root / "runs" / rid / results.STEPS, ["step"], [{"step": 0}])


def test_a_reference_from_a_dirty_tree_is_refused(tmp_path, capsys):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "a" * 40)
    _run(src, "ddp-g2-r0", "a" * 40 + "+dirty")
    assert reference.main([str(src), str(tmp_path / "ref")]) == 2
    err = capsys.readouterr().err
    assert "ddp-g2-r0" in err and "clean commit" in err and "single-g1-r0" not in err
    assert not (tmp_path / "ref").exists()


def test_a_commit_may_be_named_as_git_abbreviates_it(tmp_path, capsys):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "2951eab")               # DPBENCH_GIT_SHA=$(git rev-parse --short HEAD)
    assert reference.main([str(src), str(tmp_path / "ref")]) == 0
    for rid, sha in (("dp-g1-r0", "2951eab+dirty"), ("ddp-g1-r0", "abc"), ("dp_sum-g1-r0", "n/a")):
        _run(src, rid, sha)
    assert reference.main([str(src), str(tmp_path / "ref2")]) == 2
    err = capsys.readouterr().err
    assert all(rid in err for rid in ("dp-g1-r0", "ddp-g1-r0", "dp_sum-g1-r0")) and "single-g1-r0" not in err


def test_a_clean_reference_keeps_records_and_packs_logs(tmp_path):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "b" * 40)
    (src / "summary.md").write_text("# s\n")
    (src / "logs").mkdir()
    (src / "logs" / "single-g1-r0.log").write_text("log\n")
    (src / "runs" / "single-g1-r0" / "model.pt").write_bytes(b"x" * 1000)
    assert reference.main([str(src), str(tmp_path / "ref")]) == 0
    ref = tmp_path / "ref"
    assert (ref / "runs" / "single-g1-r0" / results.METRICS).exists()
    assert (ref / "summary.md").exists() and (ref / "logs.tar.gz").exists()
    assert not (ref / "runs" / "single-g1-r0" / "model.pt").exists() and not (ref / "logs").exists()


def test_a_reference_keeps_the_step_benchmarks_made_with_it(tmp_path):
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", "b" * 40)
    saved = results.ResultSet.at(src).benchmarks_dir / "Linux-CPython-3.12-64bit" / "0001_torch-2.11.0.json"
    saved.parent.mkdir(parents=True)
    saved.write_text("{}")
    assert reference.main([str(src), str(tmp_path / "ref")]) == 0
    assert (results.ResultSet.at(tmp_path / "ref").benchmarks_dir / saved.relative_to(saved.parents[1])).is_file()


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    """A tiny repository with the files a source digest covers, one commit."""
    root = tmp_path / "repo"
    (root / "src" / "dpbench").mkdir(parents=True)
    (root / "experiments").mkdir()
    (root / "Snakefile").write_text("rule all:\n")
    (root / "config.yaml").write_text("experiment: scaling\n")
    (root / "experiments" / "scaling.yaml").write_text("repeats: 3\n")
    (root / "src" / "dpbench" / "train.py").write_text("LR = 0.1\n")
    (root / "src" / "dpbench" / "schema.yaml").symlink_to("../../experiments/scaling.yaml")
    (root / "README.md").write_text("not source\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


def test_the_source_digest_of_a_tree_is_that_of_its_commit_until_a_source_file_changes(checkout):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    clean = provenance.source_digest(checkout)
    assert clean == provenance.source_digest_at(head, checkout)
    (checkout / "README.md").write_text("changed, but not source\n")
    assert provenance.source_digest(checkout) == clean
    (checkout / "src" / "dpbench" / "train.py").write_text("LR = 0.2\n")
    assert provenance.source_digest(checkout) != clean
    assert provenance.source_digest_at("f" * 40, checkout) is None   # a commit git does not know


def test_a_run_labelled_with_a_commit_whose_sources_it_did_not_run_is_refused(checkout, tmp_path, capsys, monkeypatch):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(provenance, "PROJECT", checkout)
    src = tmp_path / "results" / "t"
    _run(src, "single-g1-r0", head)
    rec = results.read_json(src / "runs" / "single-g1-r0" / results.METRICS)
    rec["provenance"]["source_digest"] = provenance.source_digest(checkout)
    results.write_json(src / "runs" / "single-g1-r0" / results.METRICS, rec)
    assert reference.main([str(src), str(tmp_path / "ref")]) == 0
    rec["provenance"]["source_digest"] = "0" * 16            # what a tree with changes would record
    results.write_json(src / "runs" / "single-g1-r0" / results.METRICS, rec)
    assert reference.main([str(src), str(tmp_path / "ref2")]) == 2
    assert "single-g1-r0" in capsys.readouterr().err


# Every committed reference folder says how it was made: what, the command, the commit, the
# machine and the date. READMEs written after the fact (tools/reference_readmes.py) carry the five
# as fields; older ones say them in prose, and where an older one gives no date, the commit that
# added the folder does (git log), which a shallow clone may lack.
import re  # noqa: E402
from pathlib import Path  # noqa: E402

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference"
FOLDERS = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir())
FIELDS = ("**What.**", "**Command.**", "**Commit.**", "**Machine.**", "**Date.**")


def _added_on(name: str) -> str | None:
    out = subprocess.run(["git", "log", "--format=%ad", "--date=short", "--", f"results/reference/{name}"],
                         cwd=REFERENCE.parents[1], capture_output=True, text=True)
    dates = out.stdout.split()
    return dates[-1] if out.returncode == 0 and dates else None


@pytest.mark.parametrize("name", FOLDERS)
def test_every_reference_folder_has_a_readme_saying_how_it_was_made(name):
    path = REFERENCE / name / "README.md"
    assert path.is_file(), f"results/reference/{name} has no README.md (python tools/reference_readmes.py)"
    text = path.read_text()
    if "tools/reference_readmes.py" in text:
        assert all(f in text for f in FIELDS), f"{name}: fields missing"
        assert re.search(r"\*\*Date\.\*\* committed \d{4}-\d{2}-\d{2}", text)
    what = text.lstrip().startswith("# ")
    command = re.search(r"^    \S|^```|`(?:snakemake|dpbench|python3?|bash|tools/|LIMIT=|GPUS=|DPBENCH_GIT_SHA=)[^`]*`", text, re.M)
    commit = re.search(r"\b[0-9a-f]{7,40}\b|not recorded", text)
    machine = re.search(r"H100|H200|CPU", text)
    date = re.search(r"\d{4}-\d{2}-\d{2}|\b(?:Nov|Dec)[a-z]* \d", text) or _added_on(name)
    missing = [k for k, v in (("what", what), ("command", command), ("commit", commit), ("machine", machine),
                              ("date", date)) if not v]
    assert not missing, f"results/reference/{name}/README.md lacks: {missing}"
