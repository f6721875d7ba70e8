"""NCCL's own device memory at one rank, measured: what a process group adds to NVML's memory of a
process beyond PyTorch's allocator (NCCL's communicator, its buffers, the kernels it loads).

In a fresh process (so the caller keeps none of NCCL's memory while it goes on): CUDA starts and a
small tensor is made, NVML reads the process's memory; a one-rank NCCL process group comes up and
runs one all_reduce, all_gather_into_tensor and reduce_scatter_tensor on small CUDA tensors; NVML
reads again. The difference, less what the allocator reserved meanwhile, is `process_group_mib`.

    python -m dpbench.advise.process_group_probe [--device-index I] [--timeout S]   # prints JSON

At N > 1 ranks NCCL's buffers grow with the peers and channels: a one-rank group is a lower
bound. Without CUDA or NVML there is nothing to measure: 0 MiB and the reason, no process started.
A child that fails or outlives its timeout gives the same, with its reason: never a hang.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import dpbench
from dpbench.host.nvml import MIB, nvml, nvml_process_mib
from dpbench.results.errors import error_text

TIMEOUT_S = 60.0        # the child's whole life: importing torch, CUDA, NCCL's set-up, three collectives
INIT_TIMEOUT_S = 30     # NCCL's own bound on its set-up and collectives, inside the child's
ELEMENTS = 1 << 10      # the collectives' tensors: small, so the allocator's share stays one block


def not_measured(reason: str) -> dict[str, Any]:
    """The result where nothing was measured: no memory added, and why."""
    return {"process_group_mib": 0.0, "nccl": None, "reason": reason}


def measure_here(index: int = 0, init_timeout_s: float = INIT_TIMEOUT_S) -> dict[str, Any]:
    """The measurement in this process (the child's job: it brings up NCCL here)."""
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    x = torch.ones(ELEMENTS, device=device)
    torch.cuda.synchronize(device)
    before, reserved_before = nvml_process_mib(), torch.cuda.memory_reserved(device)
    if before is None:
        return not_measured("NVML does not name this process (a container may show other pids)")
    # one rank: an in-process store, no port to find or collide on
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device,
                            timeout=timedelta(seconds=init_timeout_s))
    try:
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(ELEMENTS, device=device), x)
        dist.reduce_scatter_tensor(torch.empty(ELEMENTS, device=device), x)
        torch.cuda.synchronize(device)
        after, reserved_after = nvml_process_mib(), torch.cuda.memory_reserved(device)
    finally:
        dist.destroy_process_group()
    if after is None:
        return not_measured("NVML stopped naming this process after the group came up")
    allocator = (reserved_after - reserved_before) / MIB
    return {"process_group_mib": max(0.0, after - before - allocator), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "reason": "", "nvml_before_mib": before, "nvml_after_mib": after, "allocator_mib": allocator,
            "device_name": torch.cuda.get_device_name(device), "torch": torch.__version__}


def parse(stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    """The child's result: the last JSON object it printed (NCCL may print lines of its own), else
    why there is none."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict) and "process_group_mib" in got:
                return got
    tail = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    return not_measured(f"the measuring process exited {returncode} without a result: {tail}")


def child_command(index: int) -> list[str]:
    return [sys.executable, "-m", "dpbench.advise.process_group_probe", "--child", "--device-index", str(index)]


class Measurement:
    """A measurement under way in a child process, or already known (nothing to measure, or done).
    `result()` waits at most until the timeout given at the start, then ends the child; as a
    context manager, leaving it ends a child still running."""

    def __init__(self, command: list[str] | None, timeout_s: float = TIMEOUT_S, known: dict[str, Any] | None = None):
        self.timeout_s, self.known = timeout_s, known
        self.deadline = time.monotonic() + timeout_s
        self.proc: subprocess.Popen | None = None
        if known is None and command is not None:
            # the child imports this package as its parent does, whatever the working directory
            src = str(Path(dpbench.__file__).resolve().parents[1])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
            try:
                self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env=env)
            except OSError as exc:
                self.known = not_measured(f"the measuring process did not start: {error_text(exc)}")

    def __enter__(self) -> "Measurement":
        return self

    def __exit__(self, *exc: Any) -> None:
        """A child still running when its caller gives up (the probe failed) is ended."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def result(self) -> dict[str, Any]:
        if self.known is not None:
            return self.known
        assert self.proc is not None
        try:
            out, err = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
            self.known = parse(out, err, self.proc.returncode)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            self.known = not_measured(f"the measuring process outlived its {self.timeout_s:g} s timeout")
        return self.known


def start(device_type: str, index: int = 0, timeout_s: float = TIMEOUT_S) -> Measurement:
    """The measurement for a run on `device_type`: started in a child on CUDA with NVML readable
    (the caller goes on meanwhile), else known at once to be 0."""
    if device_type != "cuda":
        return Measurement(None, known=not_measured("no CUDA: a CPU run's process group (gloo) holds no device memory"))
    if nvml() is None and shutil.which("nvidia-smi") is None:
        return Measurement(None, known=not_measured("no NVML: a process's GPU memory cannot be read"))
    return Measurement(child_command(index), timeout_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device-index", type=int, default=0, help="the CUDA device (as this process sees them)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds the measuring process may take")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)   # measure in this process
    args = ap.parse_args(argv)
    if args.child:
        try:
            got = measure_here(args.device_index)
        except Exception as exc:   # NCCL's or CUDA's failure: a reason for the parent, not a traceback
            got = not_measured(f"measuring failed: {error_text(exc)}")
        print(json.dumps(got))
        return 0 if not got["reason"] else 1
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    print(json.dumps(start(device_type, args.device_index, args.timeout).result()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
