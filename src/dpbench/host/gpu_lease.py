"""Give each job its own GPUs: file locks over the machine's device ids.

Snakemake's `gpu` resource bounds how many GPUs the running jobs ask for in total; it does not
say *which* ones a job gets. A job takes k free ids here (one lock file per id, held for the
job's life, released by the kernel even if the job dies) and runs with CUDA_VISIBLE_DEVICES set
to them, so two timed runs never share a GPU. Exclusive mode takes every id and exposes k: the
run is then alone on the machine.

Inside a SLURM job the ids are the job's grant, which SLURM gives no other job, and which it may
number from 0 in every job: the locks are then the job's own (a folder per SLURM job id), so two
jobs on one node never wait for each other over ids that name different GPUs, while jobs of one
pipeline run inside a single allocation still share its GPUs one by one.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from dpbench.host.nvml import gpu_count

# One place per machine and user, so that two pipelines on one machine don't share GPUs either.
LOCK_DIR = Path(tempfile.gettempdir()) / f"dpbench-gpu-locks-{os.getuid()}"
# How many GPUs a launcher gave its DDP ranks without asking torch; each rank checks it.
LEASED_ENV = "DPBENCH_LEASED_GPUS"
# Set while a run holds every GPU of the machine (exclusive timing); its record says so.
EXCLUSIVE_ENV = "DPBENCH_EXCLUSIVE_GPUS"


def pool() -> list[str]:
    """The device ids this process may use: CUDA_VISIBLE_DEVICES (a scheduler's grant), else all."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(gpu_count())]


def scoped(lock_dir: Path) -> Path:
    """Where the locks of this process's GPU ids live: the machine's folder, or, in a SLURM job
    that was granted GPUs (CUDA_VISIBLE_DEVICES set there), that job's own: the grant is
    exclusive and its ids are the job's own numbering. A job without a GPU grant (a whole node
    taken with --exclusive) sees the node's GPUs by their machine ids and keeps the machine's."""
    job = os.environ.get("SLURM_JOB_ID")
    granted = os.environ.get("CUDA_VISIBLE_DEVICES") is not None
    return lock_dir / f"slurm-job-{job}" if job and granted else lock_dir


@contextmanager
def lease(count: int, lock_dir: Path, exclusive: bool = False, poll_s: float = 2.0,
          announce=print):
    """Hold `count` free GPU ids (all of them when exclusive); yields the ids exposed to the job."""
    ids = pool()
    if count > len(ids) or count == 0:
        yield ids[:count]      # the engine records the run as skipped, naming both numbers
        return
    lock_dir = scoped(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    want = len(ids) if exclusive else count
    held: list[tuple[str, int]] = []
    waited = False
    try:
        while True:
            for gpu in ids:
                if len(held) == want:
                    break
                fd = os.open(lock_dir / f"gpu{gpu}.lock", os.O_CREAT | os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append((gpu, fd))
                except BlockingIOError:
                    os.close(fd)
            if len(held) == want:
                break
            # All or nothing: two jobs each holding part of what they need would wait forever.
            for _, fd in held:
                os.close(fd)
            held = []
            if not waited:
                announce(f"waiting for {want} free GPU(s) of {ids}")
                waited = True
            time.sleep(poll_s)
        yield [gpu for gpu, _ in held[:count]]
    finally:
        for _, fd in held:
            os.close(fd)
