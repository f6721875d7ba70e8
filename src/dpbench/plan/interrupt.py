"""The pipeline's process and its runs: names the pipeline to the runs it starts, and passes a
SIGINT to Snakemake on to the run launchers below it."""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from dpbench.host import PIPELINE_PID_ENV

def name_the_pipeline() -> None:
    """Tell every run this process starts which process is the pipeline: its watchdog
    (dpbench.run.watchdog) stops the run when that process is gone."""
    os.environ[PIPELINE_PID_ENV] = str(os.getpid())


LAUNCHER = "dpbench.run.launch"   # a run's launcher names its module in its command line


def _children() -> dict[int, list[int]]:
    """Each live process's children, from /proc (empty where there is no /proc)."""
    kids: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            ppid = int(text[text.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def launchers_below(root: int) -> list[int]:
    """The run launchers started below `root` (through its job shells): the top launcher of
    each run, not the ranks under its torchrun (the launcher stops those)."""
    kids, found, todo = _children(), [], [root]
    while todo:
        for pid in kids.get(todo.pop(), []):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"-m {LAUNCHER} " in f"{cmd} ":
                found.append(pid)   # its torchrun and ranks are its own to stop
            else:
                todo.append(pid)
    return found


def stop_runs_on_interrupt() -> None:
    """SIGINT to Snakemake (Ctrl-C, `kill -INT`) stops the running trainings within seconds.

    Snakemake's own SIGINT handling ("Terminating processes on user request") only waits for
    its running jobs: a SIGINT sent to Snakemake's pid alone (not to the terminal's whole
    process group, as Ctrl-C does) left a training running to its last step. This handler
    passes the SIGINT on to every run launcher below this process (each stops its torchrun and
    ranks and writes a failed record, "stopped by SIGINT") and then lets Snakemake handle it as
    before (KeyboardInterrupt). Installed from the Snakefile, in its main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "dpbench_stops_runs", False):
        return

    def interrupt(signum, frame):
        for pid in launchers_below(os.getpid()):
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    interrupt.dpbench_stops_runs = True   # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, interrupt)
