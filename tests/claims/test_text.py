"""Each claim's words, one snapshot per claim: the ledger section its text.py renders from the
planted GPU evidence of tests/claims/planted.py. The other claims tests assert the data (verdicts,
numbers, which evidence); a change of wording shows here, as a diff of one file per claim.

    DPBENCH_UPDATE_SNAPSHOTS=1 python -m pytest tests/claims/test_text.py   # rewrite them
"""
import os
from pathlib import Path

import pytest
from committed import REFERENCE, committed_sections
from claims.planted import evidence, fake_gpu_probes, gpu_tag

from dpbench.claims import CLAIM_IDS
from dpbench.claims.ledger import build_sections, render_section

SNAPSHOTS = Path(__file__).resolve().parents[1] / "fixtures" / "snapshots" / "claims"


@pytest.fixture(scope="module")
def sections(tmp_path_factory):
    ev = evidence(tmp_path_factory.mktemp("claims"), gpu_tag(), fake_gpu_probes())
    return {s.id: s for s in build_sections(ev)}


@pytest.mark.parametrize("cid", CLAIM_IDS)
def test_claim_text_matches_its_snapshot(sections, cid):
    text = render_section(sections[cid])
    path = SNAPSHOTS / f"{cid}.md"
    if os.environ.get("DPBENCH_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path}: run with DPBENCH_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"{cid}'s text changed: rerun with DPBENCH_UPDATE_SNAPSHOTS=1 if meant"


# Every committed claims ledger, judged by today's code: each summary cell says what its own
# verdict data say (the 2x H200 page printed "0 calls misbehave" beside "refuted", "no
# wrong-device case erred" beside an error, and `None` / `loads` for values it never found).
LEDGERS = sorted(p.parent.name for p in REFERENCE.glob("*/claims.json") if "claims" in p.parent.name)


def _observations(section):
    probe = (section.data or {}).get("probe") or {}
    return list((probe.get("observations") or {}).values())


@pytest.mark.parametrize("name", LEDGERS)
def test_each_committed_summary_cell_agrees_with_its_verdict_data(name):
    import re
    checked = 0
    for s in committed_sections(name):
        cell = s.summary
        assert not re.search(r"\bNone\b|\bloads\b|Nonex", cell), f"{s.id}: {cell}"
        obs = _observations(s)
        if not obs or s.not_run:
            continue
        errors = [o for o in obs if o.get("error")]
        if m := re.search(r"(\d+|none) of (\d+) observations erred", cell):
            assert (m[1], int(m[2])) == (str(len(errors)) if errors else "none", len(obs)), f"{s.id}: {cell}"
            checked += 1
        if m := re.search(r"(\d+)(?: of (\d+))? calls on the wrapper misbehave", cell):
            listed = next((o for o in obs if o.get("what", "").startswith("calls that misbehave")), None)
            flagged = [o for o in obs if o.get("misbehaves")]
            assert int(m[1]) == (len(listed["result"]) if listed and "result" in listed and not m[2] else len(flagged))
            checked += 1
        if m := re.search(r"(\d+)/(\d+) other (?:loads|round trips)", cell):
            exact = [o for o in obs if "round_trip_bit_exact" in o]
            assert (int(m[1]), int(m[2])) == (sum(bool(o["round_trip_bit_exact"]) for o in exact), len(exact))
            checked += 1
        if s.id == "C3" and s.verdict == "refuted":   # the advice is refuted by calls that misbehave
            assert not re.search(r"\b0 (?:of \d+ )?calls", cell), cell
        if s.id == "C2" and "no wrong-device case erred" in cell:
            assert not errors, cell
    assert checked, f"{name}: no summary cell was checked against its data"
