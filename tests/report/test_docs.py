"""The README and docs/: short, links that resolve, and the test command CI runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and ![alt](target); the target ends at whitespace or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def readme_test_command() -> str:
    """The README's set-up line that runs the tests, without its comment."""
    lines = [line for line in (REPO / "README.md").read_text().splitlines() if "&& python -m pytest" in line]
    assert len(lines) == 1, lines
    return lines[0].split("#", 1)[0].strip()


def test_the_readme_is_at_most_150_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_the_readme_gives_the_set_up_commands_on_its_first_screen():
    first = "\n".join((REPO / "README.md").read_text().splitlines()[:40])
    assert 'pip install -e ".[all]" && snakemake --cores all' in first
    assert readme_test_command() in first


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_points_at_a_file(doc):
    targets = [t for t in LINK.findall(doc.read_text()) if not re.match(r"[a-z]+:", t)]
    missing = [t for t in targets if not (doc.parent / t.split("#", 1)[0]).exists()]
    assert not missing, f"{doc.name}: {missing}"


def test_ci_runs_the_readmes_test_command():
    command = readme_test_command()
    assert command.startswith("pip install -e ")
    # .ci/run runs each part on a line of its own (pytest_ok: exit 5, no tests selected, is ok).
    ci = {line.strip().removeprefix("pytest_ok ") for line in (REPO / ".ci" / "run").read_text().splitlines()}
    assert [part for part in command.split(" && ") if part not in ci] == []


def test_the_pages_rendered_from_references_are_as_rendered():
    """docs/findings.md and docs/sharding.md are their templates with each named query filled in
    from results/reference: a hand edit of a number (or a reference that changed) shows here."""
    from dpbench.report import docs_render
    assert {p.name for p in docs_render.pages().values()} >= {"findings.md", "sharding.md", "bisect.md"}
    diffs = docs_render.differences()
    assert not diffs, "re-render with `python -m dpbench.report.docs_render`:\n" + "\n".join(diffs.values())


def test_a_planted_edit_of_a_rendered_number_is_caught(tmp_path):
    import shutil

    from dpbench.report import docs_render
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "docs").mkdir()
    shutil.copytree(root / "docs" / "templates", tmp_path / "docs" / "templates")
    for page in docs_render.pages(root).values():
        shutil.copy(page, tmp_path / "docs" / page.name)
    ref = root / "results" / "reference"
    assert docs_render.differences(tmp_path, ref) == {}
    page = tmp_path / "docs" / "findings.md"
    page.write_text(page.read_text().replace("36.7–63.4k", "51–63k"))    # the audit's drifted number
    diffs = docs_render.differences(tmp_path, ref)
    assert list(diffs) == ["findings.md"] and "-skipped; each panel" in diffs["findings.md"]


def test_every_query_a_page_uses_names_a_reference_the_page_links():
    from dpbench.report import docs_queries, docs_render
    for template, page in docs_render.pages().items():
        text = page.read_text()
        for name in set(docs_render.PLACEHOLDER.findall(template.read_text())):
            ref = docs_queries.QUERIES[name].reference
            assert not ref or f"results/reference/{ref}" in text, f"{page.name}: {name} from {ref}, not linked"
