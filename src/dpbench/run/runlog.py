"""What the launcher and the engine both know: the run's log line, its checkpoint's name and
when it was launched (a leaf module, so that neither has to import the other for them)."""
from __future__ import annotations

import os
import sys
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
    """One line of the run's log, tagged with the rank under torchrun, written whole: one
    write() of the line and its newline, so that two ranks sharing the log (unbuffered output,
    PYTHONUNBUFFERED=1, writes text and newline apart) never glue their lines together."""
    rank = f" rank {os.environ['RANK']}" if "RANK" in os.environ else ""
    line = f"[dpbench {time.strftime('%H:%M:%S')}{rank}] {msg}\n"
    out = sys.stdout
    out.flush()   # what was printed before comes before
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):   # not a file (a test's capture): one write() still
        out.write(line)
        out.flush()
        return
    data = line.encode(getattr(out, "encoding", None) or "utf-8", errors="replace")
    while data:
        data = data[os.write(fd, data):]
