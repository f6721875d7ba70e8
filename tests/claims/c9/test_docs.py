"""docs/sharding.md's rehearsed ranks (issue 38), from the committed references: the combined
launches give every N measured (11.7M and 42.3M at 1, 2, 4, 8; 236M at 1, 2), the page
holds those tables as rendered, the failed N = 8 sizes are rows with reasons, and the page's
figures exist where it links them."""
from __future__ import annotations

import re
from pathlib import Path

from dpbench.analysis import rehearsal
from dpbench.claims.c9 import docs

REPO = Path(__file__).resolve().parents[3]
REF = REPO / "results" / "reference"
PAGE = REPO / "docs" / "sharding.md"


def n_column(table: str) -> set[int]:
    rows = [line.split("|") for line in table.splitlines()[2:]]
    return {int(cells[2]) for cells in rows}


def test_the_page_holds_every_n_the_references_measured_per_size():
    """Per model size, the table's N are those at which some launch's record ran (read from the
    launches' tars here, not through the page's combination)."""
    measured: dict[str, set[int]] = {}
    for reference, tar in docs.LAUNCHES:
        records, _ = rehearsal.read_launch(REF / reference / tar)
        for r in records:
            if r.get("status") == "ok" and r.get("size"):
                measured.setdefault(r["size"], set()).add(r["gpus"])
    assert measured["256x4"] == {1, 2, 4, 8}   # the smallest model ran at every N rehearsed on the H200
    page = PAGE.read_text()
    for size, ns in measured.items():
        table = docs.memory_table(REF, size)
        assert n_column(table) == ns, size
        assert table in page


def test_failed_n8_cases_are_rows_from_the_newest_launch_with_reasons():
    c = docs.combined(REF)
    failed = rehearsal.not_ok_rows(c.records)
    assert {(f["size"], f["gpus"]) for f in failed} == {("512x8", 8), ("1024x16", 8)}
    assert all(f["reason"] for f in failed)
    by_size = {f["size"]: f[rehearsal.SOURCE] for f in failed}
    assert by_size["512x8"].startswith("h200-rehearsal-n8-7288c44/")    # the later launch of 42.3M at N = 8
    ok8 = {rehearsal.variant_label(r) for r in c.records
           if r.get("status") == "ok" and r["gpus"] == 8 and r["size"] == "256x4"}
    assert ok8 == {"ddp", "zero1", "fsdp", "fsdp-keep", "hsdp"}
    sentences = docs.rehearsal_not_run(REF)
    assert all(s in PAGE.read_text() for s in sentences.splitlines())


def test_the_crossover_table_has_every_budget_and_n_searched():
    table = docs.rehearsal_crossover_table(REF)
    pairs = {(cells[1].strip(), int(cells[3])) for cells in (line.split("|") for line in table.splitlines()[2:])}
    assert pairs == {("16GB", 2), ("16GB", 4), ("16GB", 8), ("24GB", 2), ("24GB", 4)}


def test_the_pages_figures_exist_where_it_links_them():
    linked = set(re.findall(r"\((figures/rehearsal-[^)]+\.png)\)", PAGE.read_text()))
    assert linked == {p.relative_to(REPO / "docs").as_posix() for p in docs.figure_paths(REPO).values()}
    assert all((REPO / "docs" / p).stat().st_size > 10_000 for p in linked)
