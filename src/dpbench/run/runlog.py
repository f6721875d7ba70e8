"""What the launcher and the engine both know: the run's log line, its checkpoint's name and
when it was launched (a leaf module, so that neither has to import the other for them)."""
from __future__ import annotations

import os
import time

CHECKPOINT = "model.pt"
# Wall-clock time (time.time()) at which the launcher, holding the run's GPUs, started the run;
# torchrun's ranks inherit it. The engine records how long the run took to its first step.
LAUNCHED_AT_ENV = "DPBENCH_LAUNCHED_AT"


def mark_launch() -> None:
    os.environ[LAUNCHED_AT_ENV] = repr(time.time())


def since_launch() -> float | None:
    """Seconds since mark_launch() in this process or the launcher that started it."""
    try:
        return time.time() - float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return None


def log(msg: str) -> None:
    """One line of the run's log, tagged with the rank under torchrun."""
    rank = f" rank {os.environ['RANK']}" if "RANK" in os.environ else ""
    print(f"[dpbench {time.strftime('%H:%M:%S')}{rank}] {msg}", flush=True)
