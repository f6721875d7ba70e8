"""Failures a test asks a run for, through one environment variable (torch-free: the launcher reads it).

    DPBENCH_FAULT=RANK:STEP        that rank raises at that step (run.hooks.FaultInjection)
    DPBENCH_FAULT=RANK:STEP:hang   that rank never joins its peers' next collective
    DPBENCH_FAULT=RANK:exit        that rank exits with EXIT_FAULT_CODE once its run has ended, its
                                   record written: a crash at teardown (run.launch)
"""
from __future__ import annotations

import os

FAULT_ENV = "DPBENCH_FAULT"
EXIT_FAULT_CODE = 3


def exit_fault(rank: int) -> int | None:
    """The exit code FAULT_ENV asks this rank to end with after its run ("RANK:exit"), else None."""
    at_rank, _, what = os.environ.get(FAULT_ENV, "").partition(":")
    return EXIT_FAULT_CODE if what == "exit" and at_rank == str(rank) else None
