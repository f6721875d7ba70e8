"""The evidence archive: every committed reference under results/reference reads through today's
readers, and what it decided is what today's code decides from it.

A reference is never regenerated: its tables, summary and reports stay as they were made, in
the words of their day. What must hold is that today's code can still read every record, table
and probe of it, that each committed comparison (compare/*.json) reaches the same verdict per
aspect and cell from the committed result sets, and that each committed claims ledger's verdict
per claim is still what today's ledger computes from its set, with the experiment's groups as
they were when that ledger was made (tests/fixtures/archive/). A verdict that today's rules
change on purpose is named in SUPERSEDED, with why. And every reference names the clean commit
that made it, whose source files its runs ran.
"""
from __future__ import annotations


import pytest
from committed import REFERENCE, committed_sections
from verdicts import compare_verdicts, run_compare

from dpbench import results
from dpbench.analysis import collect
from dpbench.claims import NOT_RUN
from dpbench.claims.records import ProbeRecord
from dpbench.results import reference

NAMES = sorted(p.name for p in REFERENCE.iterdir() if p.is_dir() and p.name != results.COMPARE_DIR)
RUN_SETS = [n for n in NAMES if (REFERENCE / n / "runs").is_dir()]
TABLE_SETS = [n for n in NAMES if (REFERENCE / n / "summary.csv").is_file()]
PROBE_SETS = [n for n in NAMES if list((REFERENCE / n).glob("C[0-9].json"))
              or list((REFERENCE / n / "claims").glob("C[0-9].json"))]
LEDGERS = [n for n in NAMES if (REFERENCE / n / results.CLAIMS_JSON).is_file()]
REPORTS = sorted(p.stem for p in (REFERENCE / results.COMPARE_DIR).glob("*.json"))

# (reference, claim) -> (verdict committed, verdict today, why today's ledger decides otherwise).
# A ledger stays as it was made; an entry here says which rule changed since.
SUPERSEDED = {
    ("h200x2-claims-torch-2.11.0+cu130", "C6"): (
        "confirmed", "needs nuance",
        "C6 is no longer confirmed where no seed-to-seed spread weighs the effect (one seed per reduction here)"),
    ("h200x2-claims-torch-2.11.0+cu130", "C8"): (
        "refuted", "needs nuance",
        "a C8 speed-up is now judged by its range's confidence; one repeat a side has none"),
}


@pytest.mark.parametrize("name", RUN_SETS)
def test_every_run_record_reads(name):
    rs = results.ResultSet(REFERENCE, name)
    rids = sorted(p.name for p in rs.runs_dir.iterdir() if p.is_dir())
    records = {rid: rs.record(rid) for rid in rids}
    assert rids and all(records.values()), f"{name}: records missing: {[r for r, v in records.items() if not v]}"
    assert {r.status for r in records.values()} <= {results.STATUS_OK, results.STATUS_FAILED, results.STATUS_SKIPPED}
    runs = collect.find_runs(rs.runs_dir)
    damaged = [rdir.name for rec, rdir in runs if rec.get("damaged")]
    assert not damaged, f"{name}: collect cannot read {damaged}"
    assert sorted(r["run_id"] for r in collect.tables(runs)["summary"]) == rids


@pytest.mark.parametrize("name", TABLE_SETS)
def test_every_table_reads(name):
    rs = results.ResultSet(REFERENCE, name)
    tables = {t: rs.table(t) for t in results.TABLES if rs.table_path(t).is_file()}
    assert not tables["summary"].empty
    assert rs.provenance()
    if (REFERENCE / name / "runs").is_dir():
        assert set(tables["summary"]["run_id"]) <= {p.name for p in rs.runs_dir.iterdir()}


@pytest.mark.parametrize("name", PROBE_SETS)
def test_every_probe_record_reads(name):
    paths = list((REFERENCE / name).glob("C[0-9].json")) + list((REFERENCE / name / "claims").glob("C[0-9].json"))
    probes = {p.stem: ProbeRecord.from_json(results.read_json(p)) for p in paths}
    assert all(p.ran_on for p in probes.values())


@pytest.mark.parametrize("stem", REPORTS)
def test_each_comparison_decides_as_committed(tmp_path, stem):
    """Made again from the committed result sets with the thresholds, A/A launches and report
    format it records, a report reaches the same verdict per aspect and cell; its words may be new."""
    kept = results.read_json(REFERENCE / results.COMPARE_DIR / f"{stem}.json")
    code, made, _ = run_compare(tmp_path, REFERENCE, kept["baseline"], kept["candidate"],
                                noise_from=kept.get("noise_from") or (kept.get("noise") or {}).get("launches", []),
                                fail_on=kept["fail_on"], thresholds=kept["thresholds"],
                                report_format=kept.get("format", 1))  # made before `format`: 1
    assert compare_verdicts(made) == compare_verdicts(kept)
    assert code == (1 if any(kept["verdict"]["counts"][k] for k in kept["fail_on"]) else 0)


@pytest.mark.parametrize("name", LEDGERS)
def test_each_ledger_decides_as_committed(name):
    today = {s.id: s.verdict for s in committed_sections(name)}
    kept = {c["id"]: c["verdict"] for c in results.read_json(REFERENCE / name / results.CLAIMS_JSON)["claims"]}
    added = today.keys() - kept.keys()   # claims added since the ledger was made: nothing measured for them
    assert kept.keys() <= today.keys() and all(today[cid] == NOT_RUN for cid in added)
    for cid in kept:
        if (name, cid) in SUPERSEDED:
            was, now, why = SUPERSEDED[(name, cid)]
            assert (kept[cid], today[cid]) == (was, now), f"{cid}: SUPERSEDED is out of date ({why})"
        else:
            assert today[cid] == kept[cid], f"{cid}: committed {kept[cid]!r}, today's ledger {today[cid]!r}"


# Made before a reference had to name a clean commit (dpbench.results.reference refuses them now); each
# says so in the README or its NOTE.md. A new reference never joins this list.
MADE_BEFORE_THE_CLEAN_COMMIT_RULE = {
    "h200x2-torch-2.11.0+cu130": "the first 2-GPU reference (2026-11-29), made before runs recorded a git sha",
    "h200x2-claims-torch-2.11.0+cu130": "the first claims ledger, partly from a tree with changes",
    "cpu_check-torch-2.13.0+cpu": "the first CPU regression example, from a tree with changes",
    "cpu_check-torch-2.14.1+cu130": "the first CPU regression example, from a tree with changes",
}


@pytest.mark.parametrize("name", RUN_SETS)
def test_every_reference_names_the_clean_commit_that_made_it(name):
    unclean = reference.unclean_runs(REFERENCE / name)
    if name in MADE_BEFORE_THE_CLEAN_COMMIT_RULE:
        assert unclean, f"{name} names clean commits now: take it off MADE_BEFORE_THE_CLEAN_COMMIT_RULE"
        return
    assert not unclean, f"{name}: runs without a clean commit: {unclean[:3]}"


@pytest.mark.parametrize("name", RUN_SETS)
def test_every_reference_ran_the_source_files_of_the_commit_it_names(name):
    """A tree copied to a GPU machine is labelled by DPBENCH_GIT_SHA: the digest each run took of
    its source files must be that commit's, or the label lies. Records older than the digest,
    and commits this clone does not have (a shallow clone), cannot be checked."""
    assert not reference.mislabelled_runs(REFERENCE / name)
