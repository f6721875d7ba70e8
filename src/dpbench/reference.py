"""Turn a finished result set into a committed reference: small, and from a clean commit.

    python -m dpbench.reference results/<tag> results/reference/<name>

A reference is evidence: every run in it must name the commit that made it. A run whose
provenance says `+dirty` or has no git sha stops the copy (exit 2), naming the runs; rerun them
from a clean commit, or set DPBENCH_GIT_SHA=<commit> where the tree carries no .git. What can be
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

from . import results

CLEAN_SHA = re.compile(r"^[0-9a-f]{40}$")
KEEP_TOP = ("*.csv", "*.md", "*.json")
KEEP_DIRS = ("figures", "claims")
RUN_FILES = (results.METRICS, results.STEPS)


def unclean_runs(src: Path) -> list[str]:
    """Run ids whose record names no clean commit."""
    bad = []
    for rec, _ in results.iter_runs(src / "runs"):
        sha = (rec.get("provenance") or {}).get("git_sha") or ""
        if not CLEAN_SHA.match(sha):
            bad.append(f"{rec.get('run_id', '?')} ({sha or 'no git sha'})")
    return bad


def make_reference(src: Path, dest: Path) -> list[Path]:
    bad = unclean_runs(src)
    if bad:
        raise ValueError(f"{len(bad)} run(s) in {src} were not made from a clean commit: "
                         f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}; rerun them from a "
                         f"committed tree (or set DPBENCH_GIT_SHA=<commit> where the tree has no .git)")
    if not (src / "runs").is_dir():
        raise ValueError(f"{src} has no runs/ folder: not a result set")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for pattern in KEEP_TOP:
        for f in src.glob(pattern):
            written.append(Path(shutil.copy2(f, dest / f.name)))
    for name in KEEP_DIRS:
        if (src / name).is_dir():
            shutil.copytree(src / name, dest / name, dirs_exist_ok=True)
            written.append(dest / name)
    for _, rdir in results.iter_runs(src / "runs"):
        for name in RUN_FILES:
            if (rdir / name).exists():
                target = dest / "runs" / rdir.name / name
                target.parent.mkdir(parents=True, exist_ok=True)
                written.append(Path(shutil.copy2(rdir / name, target)))
    extras = [p for p in [src / "logs", src / "report.html"] if p.exists()]
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
