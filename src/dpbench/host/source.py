"""The project's source as git knows it: the revision a run came from, and one digest of the files
that decide what a run computes, on disk or at a commit (what a reference is checked against)."""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path


def command_output(cmd: list[str], cwd: str | None = None) -> str | None:
    """A command's stdout, stripped; None where it is missing, fails or hangs (20 s)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_sha() -> str | None:
    """The project's revision, with '+dirty' when the working tree has changes. DPBENCH_GIT_SHA,
    where set, wins: a tree copied to a GPU machine may carry no .git, or a stale one (an older
    commit, the newer code then showing as '+dirty')."""
    if explicit := os.environ.get("DPBENCH_GIT_SHA"):
        return explicit
    here = str(Path(__file__).resolve().parent)
    sha = command_output(["git", "rev-parse", "HEAD"], cwd=here)
    if sha and command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here):
        sha += "+dirty"
    return sha


PROJECT = Path(__file__).resolve().parents[3]   # the repository root, in a checkout


def is_source(path: str) -> bool:
    """The files that decide what a run computes (paths relative to the repository root, '/'-separated)."""
    return ((path.startswith("src/dpbench/") and path.endswith(".py"))
            or (path.startswith("experiments/") and path.count("/") == 1 and path.endswith(".yaml"))
            or (path.startswith("rules/") and path.count("/") == 1 and path.endswith(".smk"))
            or path in ("Snakefile", "config.yaml"))


def digest(files: dict[str, bytes]) -> str:
    """One short hash of {path: content} for the source files among them."""
    h = hashlib.sha256()
    for path in sorted(p for p in files if is_source(p)):
        h.update(path.encode() + b"\0" + files[path] + b"\0")
    return h.hexdigest()[:16]


def source_digest(root: Path | None = None) -> str | None:
    """The digest of the source files as they are on disk: what a commit named by DPBENCH_GIT_SHA
    can be checked against later (tests/results/test_archive.py), where that commit's files are
    known. None outside a checkout (an installed package has no Snakefile beside it)."""
    root = root or PROJECT
    if not (root / "Snakefile").is_file():
        return None
    files = {}
    for f in [root / "Snakefile", root / "config.yaml", *(root / "experiments").glob("*.yaml"),
              *(root / "rules").glob("*.smk"),
              *(root / "src" / "dpbench").rglob("*.py")]:
        rel = f.relative_to(root).as_posix()
        if f.is_file() and not f.is_symlink() and is_source(rel) and "__pycache__" not in rel:
            files[rel] = f.read_bytes()
    return digest(files)


def source_digest_at(sha: str, root: Path | None = None) -> str | None:
    """The digest of the source files of commit `sha` (None where git does not know it), read in
    one `git archive` of the folders that hold them."""
    root = root or PROJECT
    # rules/ exists from issue 37 on: an older commit's archive of a path it lacks would fail
    has_rules = command_output(["git", "cat-file", "-t", f"{sha}:rules"], cwd=str(root)) == "tree"
    try:
        out = subprocess.run(["git", "archive", "--format=tar", sha, "--", "src/dpbench", "experiments",
                              "Snakefile", "config.yaml", *(["rules"] if has_rules else [])],
                             cwd=str(root), capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:   # a link is no regular file: left out
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and is_source(m.name)}
    return digest(files)


