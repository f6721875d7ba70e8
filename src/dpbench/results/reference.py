"""Turn a finished result set into a committed reference: small, and from a clean commit.

    python -m dpbench.results.reference results/<tag> results/reference/<name>

A reference is evidence: every run in it must name the commit that made it. A run whose
provenance says `+dirty` or has no git sha stops the copy (exit 2), naming the runs; rerun them
from a clean commit, or set DPBENCH_GIT_SHA=<commit> where the tree carries no .git. Where git
knows the commit, each run's digest of its source files must be that commit's (a copied tree
with changes, labelled with a clean commit, is refused too). What can be
regenerated or is large stays out or is compressed: checkpoints are dropped, per-run logs and
Snakemake's report go into one logs.tar.gz.
"""
from __future__ import annotations

import argparse
import re
import shutil
import sys
import tarfile
from pathlib import Path

from dpbench import results
from dpbench.host.source import source_digest_at

# A commit, in full or abbreviated as git prints it (7 hex digits or more); no "+dirty".
CLEAN_SHA = re.compile(r"^[0-9a-f]{7,40}$")
KEEP_TOP = ("*.csv", "*.md", "*.json")


def unclean_runs(src: Path) -> list[str]:
    """Run ids whose record names no clean commit."""
    bad = []
    for rec, _ in results.ResultSet.at(src).runs():
        sha = (rec.get("provenance") or {}).get("git_sha") or ""
        if not CLEAN_SHA.match(sha):
            bad.append(f"{rec.get('run_id', '?')} ({sha or 'no git sha'})")
    return bad


def mislabelled_runs(src: Path) -> list[str]:
    """Run ids whose source files were not those of the commit they name (DPBENCH_GIT_SHA set on
    a tree with changes). Only where git knows the commit; records without a source digest
    (made before dpbench kept one) cannot be checked."""
    at: dict[str, str | None] = {}
    bad = []
    for rec, _ in results.ResultSet.at(src).runs():
        prov = rec.get("provenance") or {}
        sha, made = prov.get("git_sha") or "", prov.get("source_digest")
        if not made or not CLEAN_SHA.match(sha):
            continue
        if sha not in at:
            at[sha] = source_digest_at(sha)
        if at[sha] is not None and at[sha] != made:
            bad.append(f"{rec.get('run_id', '?')} ({sha})")
    return bad


def _named(bad: list[str]) -> str:
    """The first five of the runs named, and '...' for more."""
    return f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}"


def make_reference(src: Path, dest: Path) -> list[Path]:
    bad = unclean_runs(src)
    if bad:
        raise ValueError(f"{len(bad)} run(s) in {src} were not made from a clean commit: {_named(bad)}; rerun "
                         f"them from a committed tree (or set DPBENCH_GIT_SHA=<commit> where the tree has no .git)")
    bad = mislabelled_runs(src)
    if bad:
        raise ValueError(f"{len(bad)} run(s) in {src} ran source files other than those of the commit they name: "
                         f"{_named(bad)}; commit the changes and rerun, naming the new commit in DPBENCH_GIT_SHA")
    have, ref = results.ResultSet.at(src), results.ResultSet.at(dest)
    if not have.runs_dir.is_dir():
        raise ValueError(f"{src} has no runs/ folder: not a result set")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for pattern in KEEP_TOP:   # the tables, provenance.json, summary.md, claims.md/json
        for f in have.dir.glob(pattern):
            written.append(Path(shutil.copy2(f, ref.dir / f.name)))
    for folder, target in ((have.figures_dir, ref.figures_dir), (have.probes_dir, ref.probes_dir),
                           (have.benchmarks_dir, ref.benchmarks_dir)):
        if folder.is_dir():
            shutil.copytree(folder, target, dirs_exist_ok=True)
            written.append(target)
    for _, rdir in have.runs():
        rid = rdir.name   # the folder, as it was (a record's run_id could differ from it)
        for source, target in ((have.metrics_path(rid), ref.metrics_path(rid)),
                               (have.steps_path(rid), ref.steps_path(rid))):
            if source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                written.append(Path(shutil.copy2(source, target)))
    extras = [p for p in [have.logs_dir, have.report_html] if p.exists()]
    if extras:
        with tarfile.open(dest / "logs.tar.gz", "w:gz") as tar:
            for p in extras:
                tar.add(p, arcname=p.name)
        written.append(dest / "logs.tar.gz")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", type=Path, help="a finished result set, results/<tag>")
    p.add_argument("dest", type=Path, help="where the reference goes, results/reference/<name>")
    args = p.parse_args(argv)
    try:
        written = make_reference(args.src, args.dest)
    except (ValueError, OSError) as exc:
        print(f"dpbench reference: {exc}", file=sys.stderr)
        return 2
    print(f"dpbench reference: {len(written)} entries in {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
