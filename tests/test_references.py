"""The committed references reproduce from their records.

Every pipeline result set under results/reference (one with runs/ and summary.csv) is collected
and summarised again from a copy of its runs/, and each table, provenance.json and summary.md
must come out byte for byte as committed. The claims ledger (claims.md/json) is left out: it
stays as it was made, with the ledger's groups of that day. Figures are not byte-checked (the
fonts differ between machines); each pipeline figure must exist, and drawn again from the
committed tables it must read right (a slow test; fakes' checks: points inside their axes, no
panel without data, no overlapping texts, no note over data). The committed comparison reports
are made again from the committed result sets with the thresholds they record.
"""
from __future__ import annotations

import csv
import difflib
import shutil
from pathlib import Path

import pytest
from fakes import empty_panels, is_placeholder, notes_over_data, outside_points, overlapping_texts

from dpbench import compare_cli, results
from dpbench.analysis import collect
from dpbench.report import plots, summarize
from dpbench.report.figstyle import save, style
from dpbench.results import reference

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
NAMES = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir() and p.name != results.COMPARE_DIR)
# Tag-dependent outputs of collect and summary; the tables keep the order of results.TABLES.
FILES = [f"{name}.csv" for name in results.TABLES] + [results.PROVENANCE, results.SUMMARY_MD]
REPORTS = sorted(p.stem for p in (REFERENCE / results.COMPARE_DIR).glob("*.json"))
# Records of runs made before the engine kept a steps.csv beside metrics.json: the tidy
# steps.csv is then the only copy of their loss curves and cannot be remade from records.
STEP_IDENT = ["run_id", "variant", "gpus", "options", "repeat"]


def is_pipeline_set(ref: Path) -> bool:
    return (ref / "runs").is_dir() and (ref / "summary.csv").is_file()


def has_step_records(ref: Path) -> bool:
    return any((run / results.STEPS).is_file() for run in (ref / "runs").iterdir())


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    """name -> the folder where that reference's tables and summary were made again."""
    root = tmp_path_factory.mktemp("references")
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            shutil.copytree(REFERENCE / name / "runs", results.runs_dir(root, name))
            collect.collect(root, name)
            summarize.write_summary_md(root, name)
            made[name] = results.tag_dir(root, name)
        return made[name]
    return make


def first_difference(committed: bytes, made: bytes, label: str) -> str:
    lines = difflib.unified_diff(committed.decode().splitlines(), made.decode().splitlines(),
                                 f"committed {label}", f"regenerated {label}", lineterm="", n=0)
    return "\n".join(list(lines)[:20])


@pytest.mark.parametrize("name,file", [(n, f) for n in NAMES for f in FILES],
                         ids=[f"{n}/{f}" for n in NAMES for f in FILES])
def test_tables_and_summary_reproduce_from_the_records(regenerated, name, file):
    ref = REFERENCE / name
    if not is_pipeline_set(ref):
        pytest.skip(f"{name} is not a pipeline result set (no runs/ and summary.csv to remake)")
    made = regenerated(name)
    if file == "steps.csv" and not has_step_records(ref):
        # The curves cannot be remade: check instead that the committed table has today's
        # columns and names only runs that the records hold.
        with open(ref / file, newline="") as f:
            steps = csv.DictReader(f)
            assert steps.fieldnames == results.TABLES["steps"]
            named = {tuple(row[c] for c in STEP_IDENT) for row in steps}
        with open(made / "summary.csv", newline="") as f:
            known = {tuple(row[c] for c in STEP_IDENT) for row in csv.DictReader(f)}
        assert named and named <= known, f"{name}/steps.csv names runs the records lack"
        return
    committed, again = (ref / file).read_bytes(), (made / file).read_bytes()
    assert committed == again, first_difference(committed, again, f"{name}/{file}")


@pytest.mark.parametrize("name", NAMES)
def test_every_pipeline_figure_is_there(name):
    figures = results.figures_dir(REFERENCE, name)
    if not figures.is_dir():
        pytest.skip(f"{name} has no figures/")
    missing = [n for n, p in results.ResultSet(REFERENCE, name).figure_paths().items()
               if not p.is_file()]
    assert not missing, f"{name}: figures missing: {missing}"


@pytest.mark.slow   # about 35 s for every reference on 2 cores
@pytest.mark.parametrize("name", NAMES)
def test_figures_drawn_again_read_right(tmp_path, name):
    if not is_pipeline_set(REFERENCE / name):
        pytest.skip(f"{name} is not a pipeline result set (no tables to draw from)")
    tables = plots.load_tables(REFERENCE, name)
    problems = {}
    for figure, draw in plots.DRAW.items():
        with style():
            fig = draw(tables)
        save(fig, tmp_path / f"{figure}.png")   # drawn as the pipeline saves it
        found = outside_points(fig) + overlapping_texts(fig) + notes_over_data(fig) + \
            ([] if is_placeholder(fig) else empty_panels(fig))
        if found:
            problems[figure] = found[:5]
    assert not problems, f"{name}: {problems}"


@pytest.mark.parametrize("stem", REPORTS)
def test_comparison_reports_reproduce(tmp_path, stem):
    """A committed report's verdicts (its JSON) come out again from the committed result sets and
    its thresholds; its prose may be worded anew."""
    js = REFERENCE / results.COMPARE_DIR / f"{stem}.json"
    report = results.read_json(js)
    launches = (report.get("noise") or {}).get("launches", [])
    for tag in dict.fromkeys([report["baseline"], report["candidate"], *launches]):
        (tmp_path / tag).symlink_to(REFERENCE / tag, target_is_directory=True)
    argv = ["--results-dir", str(tmp_path), "--baseline", report["baseline"],
            "--candidate", report["candidate"]]
    argv += ["--noise-from", ",".join(launches)] if launches else []
    argv += ["--fail-on", ",".join(report["fail_on"])] if report["fail_on"] else []
    argv += [a for k, v in report["thresholds"].items() for a in (f"--{k.replace('_', '-')}", repr(v))]
    assert compare_cli.main(argv) in (0, 1)
    made_md, made_js = results.compare_paths(tmp_path, report["baseline"], report["candidate"])
    a, b = js.read_bytes(), made_js.read_bytes()
    assert a == b, first_difference(a, b, js.name)
    assert made_md.is_file()


# Made before a reference had to name a clean commit (dpbench.results.reference refuses them now); each
# says so in the README or its NOTE.md. A new reference never joins this list.
MADE_BEFORE_THE_CLEAN_COMMIT_RULE = {
    "h200x2-torch-2.11.0+cu130": "the first 2-GPU reference (2026-11-29), made before runs recorded a git sha",
    "h200x2-claims-torch-2.11.0+cu130": "the first claims ledger, partly from a tree with changes",
    "cpu_check-torch-2.13.0+cpu": "the first CPU regression example, from a tree with changes",
    "cpu_check-torch-2.14.1+cu130": "the first CPU regression example, from a tree with changes",
}


@pytest.mark.parametrize("name", [n for n in NAMES if (REFERENCE / n / "runs").is_dir()])
def test_every_reference_names_the_clean_commit_that_made_it(name):
    unclean = reference.unclean_runs(REFERENCE / name)
    if name in MADE_BEFORE_THE_CLEAN_COMMIT_RULE:
        assert unclean, f"{name} names clean commits now: take it off MADE_BEFORE_THE_CLEAN_COMMIT_RULE"
        return
    assert not unclean, f"{name}: runs without a clean commit: {unclean[:3]}"


@pytest.mark.parametrize("name", [n for n in NAMES if (REFERENCE / n / "runs").is_dir()])
def test_every_reference_ran_the_source_files_of_the_commit_it_names(name):
    """A tree copied to a GPU machine is labelled by DPBENCH_GIT_SHA: the digest each run took of
    its source files must be that commit's, or the label lies. Records older than the digest,
    and commits this clone does not have (a shallow clone), cannot be checked."""
    assert not reference.mislabelled_runs(REFERENCE / name)
