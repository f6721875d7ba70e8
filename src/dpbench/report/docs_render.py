"""Renders the docs pages whose numbers come from the references: docs/templates/<page>.md.in with
each {{query}} replaced by that named query's value (dpbench.report.docs_queries) on
results/reference, written to docs/<page>.md.

    python -m dpbench.report.docs_render            # writes every page
    python -m dpbench.report.docs_render --check    # exits 1 naming each page that differs
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

import dpbench.advise.docs  # noqa: F401  (registers docs/advise.md's queries)
import dpbench.claims.c9.docs  # noqa: F401  (registers docs/sharding.md's rehearsed-ranks queries)
import dpbench.claims.c9.replay_docs  # noqa: F401  (registers its reserved-replay queries)
import dpbench.report.bisect_queries  # noqa: F401  (registers docs/bisect.md's queries)
from dpbench.report.docs_queries import QUERIES, value

ROOT = Path(__file__).resolve().parents[3]
PLACEHOLDER = re.compile(r"\{\{\s*([a-z0-9_]+)\s*\}\}")


def render(template: str, ref: Path) -> str:
    """The template with each {{name}} filled in; an unknown name is an error, never left blank."""
    unknown = sorted({m for m in PLACEHOLDER.findall(template) if m not in QUERIES})
    if unknown:
        raise KeyError(f"no query named {', '.join(unknown)} (dpbench.report.docs_queries)")
    cache: dict[str, str] = {}

    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name not in cache:
            cache[name] = value(name, ref)
        return cache[name]
    return PLACEHOLDER.sub(fill, template)


def pages(root: Path = ROOT) -> dict[Path, Path]:
    """template -> the page it renders."""
    return {t: root / "docs" / t.name.removesuffix(".in") for t in sorted((root / "docs" / "templates").glob("*.md.in"))}


def differences(root: Path = ROOT, ref: Path | None = None) -> dict[str, str]:
    """page -> unified diff of the committed page against its re-render (empty: none differ)."""
    ref = ref or root / "results" / "reference"
    out = {}
    for template, page in pages(root).items():
        made = render(template.read_text(), ref)
        kept = page.read_text() if page.exists() else ""
        if made != kept:
            out[page.name] = "".join(difflib.unified_diff(kept.splitlines(True), made.splitlines(True),
                                                          f"{page.name} (committed)", f"{page.name} (rendered)"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs")
    args = p.parse_args(argv)
    if args.check:
        diffs = differences()
        for diff in diffs.values():
            sys.stdout.write(diff)
        return 1 if diffs else 0
    ref = ROOT / "results" / "reference"
    for template, page in pages().items():
        page.write_text(render(template.read_text(), ref))
        print(f"wrote {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
