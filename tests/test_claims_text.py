"""Each claim's words, one snapshot per claim: the ledger section its text.py renders from the
planted GPU evidence of tests/test_claims.py. The other claims tests assert the data (verdicts,
numbers, which evidence); a change of wording shows here, as a diff of one file per claim.

    DPBENCH_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_claims_text.py   # rewrite them
"""
import os
from pathlib import Path

import pytest
from test_claims import evidence, fake_gpu_probes, gpu_tag

from dpbench.claims import CLAIM_IDS
from dpbench.claims.ledger import build_sections, render_section

SNAPSHOTS = Path(__file__).resolve().parent / "fixtures" / "snapshots" / "claims"


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
