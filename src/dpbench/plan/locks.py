"""One pipeline per result set: its lock (results/<tag>/.pipeline.lock), whether a live pipeline
holds it, and the stale Snakemake locks a killed pipeline leaves behind."""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

from dpbench.plan.experiment import ConfigError

PIPELINE_LOCK = ".pipeline.lock"
_HELD: dict[str, int] = {}   # lock file -> its open descriptor, held for the life of the process
# Targets that write nothing into the pipeline's own result set: no lock (compare writes under
# results/compare/ and only reads the sets).
LOCK_FREE_TARGETS = frozenset({"compare"})


class PipelineBusy(ConfigError):
    """Another pipeline holds the result set: its runs would train twice at once, timed together.
    `tag` is the result set's, `holder` the holding process's pid as its lock file says it ("": unknown)."""

    def __init__(self, message: str, *, tag: str = "", holder: str = ""):
        super().__init__(message)
        self.tag, self.holder = tag, holder


def needs_pipeline_lock(targets: Any) -> bool:
    """Whether a Snakemake run of `targets` (empty: the default target) writes into the result set."""
    return not targets or not set(targets) <= LOCK_FREE_TARGETS


def hold_pipeline_lock(set_dir: Path | str, tag: str) -> Path:
    """Takes results/<tag>/.pipeline.lock (a non-blocking flock) for the life of this process, or
    raises PipelineBusy naming the tag and the holder's pid. The kernel lets it go when the
    process ends, however it ends (kill -9 included): no stale lock to remove. The descriptor is
    not inherited by the jobs (Python opens it close-on-exec). Taken again in one process: kept."""
    path = Path(set_dir) / PIPELINE_LOCK
    if str(path) in _HELD:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"result set {tag!r}: cannot open {path} ({exc.strerror}); "
                          f"choose a writable results_dir or another tag") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        for _ in range(20):   # the holder writes its pid just after it locks: a bounded wait
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if holder:
                break
            time.sleep(0.05)
        os.close(fd)
        raise PipelineBusy(f"result set {tag!r} is in use by another pipeline (pid {holder or 'unknown'}, "
                           f"{path}): wait for it, stop it (kill {holder or '<pid>'}), or use "
                           f"--config tag=<another>", tag=tag, holder=holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[str(path)] = fd
    return path


def pipeline_alive(set_dir: Path | str) -> bool:
    """Whether a live pipeline holds results/<tag>/.pipeline.lock (see `hold_pipeline_lock`):
    the kernel lets the lock go when its holder dies, however it dies."""
    path = Path(set_dir) / PIPELINE_LOCK
    if str(path) in _HELD:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False   # no lock file: no pipeline ever got as far as taking it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _set_dir_of(path: str, results_dir: Path) -> Path | None:
    """results_dir/<tag> for a file under it (None: elsewhere)."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(results_dir)))
    except ValueError:
        return None
    return Path(results_dir) / rel.parts[0] if len(rel.parts) >= 2 and rel.parts[0] != "compare" else None


def clear_stale_snakemake_locks(results_dir: Path | str, workdir: Path | str = ".") -> list[Path]:
    """Removes the lock files a killed Snakemake left in <workdir>/.snakemake/locks (its default
    file backend) when every file a lock names lies in a result set that no live pipeline holds
    (`pipeline_alive`): after `kill -9` of a pipeline, the same command with
    `--rerun-incomplete` runs instead of stopping at Snakemake's LockException. A lock naming
    any other file (another workflow's, a compare's) is left for `snakemake --unlock`.
    Returns the lock files removed."""
    lockdir = Path(workdir) / ".snakemake" / "locks"
    removed = []
    for lock in sorted(lockdir.glob("*.*put.lock")) if lockdir.is_dir() else []:
        try:
            files = [line.strip() for line in lock.read_text().splitlines() if line.strip()]
        except OSError:
            continue
        sets = {_set_dir_of(f, Path(results_dir)) for f in files}
        if not files or None in sets or any(pipeline_alive(d) for d in sets):
            continue
        try:
            lock.unlink()
        except OSError:
            continue
        removed.append(lock)
    return removed
