"""Helpers shared by the probes: the record layout, device facts, exact error text."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from typing import Any

import torch

from dpbench.claims import ADVICE, CLAIMS, NOT_RUN, needs_text
from dpbench.claims.records import Observation, ProbeRecord
from dpbench.results.errors import error_text  # noqa: F401  (the probes report errors as the engine does)

TIMEOUT_S = 600   # one probe subprocess; the pipeline's jobs have their own limits


def gpus_visible() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ran_on() -> dict[str, Any]:
    n = gpus_visible()
    return {
        "device_type": "cuda" if n else "cpu",
        "gpus_visible": n,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if n else None,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(n)],
        "python": platform.python_version(),
    }


def needs(n: int, found: int | None = None) -> str:
    return needs_text(n, gpus_visible() if found is None else found)


def record(claim: str, observations: list[Observation], verdict: str,
           not_run: str | None = None, parts_not_run: list[str] | None = None) -> ProbeRecord:
    """The probe output contract (see the ledger): observations under stable ids."""
    return ProbeRecord(claim=claim, title=CLAIMS[claim][0], ran_on=ran_on(), observations=observations,
                       verdict=NOT_RUN if not_run else verdict, advice=ADVICE[claim], not_run=not_run,
                       parts_not_run=parts_not_run or [])


def run_python(code: str, env: dict[str, str] | None = None, args: list[str] | None = None) -> dict[str, Any]:
    """Run code (or `-m module` with args) in a fresh interpreter (CUDA state is per process);
    it prints one JSON line last."""
    argv = [sys.executable, *(args if args is not None else ["-c", code])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:   # one part of a probe, not the whole record
        return {"rc": 124, "stderr_tail": [f"timed out after {TIMEOUT_S} s"]}
    out: dict[str, Any] = {"rc": proc.returncode}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        out.update(json.loads(lines[-1]))
    else:
        out["stderr_tail"] = proc.stderr.strip().splitlines()[-3:]
    return out
