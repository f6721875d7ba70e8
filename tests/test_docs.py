"""The README and docs/: short, links that resolve, and the test command CI runs."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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
