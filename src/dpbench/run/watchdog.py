"""A run never outlives the process that started it: the launcher watches its starters (its
parent, the parent's parent where the parent is a shell, and the pipeline named by
DPBENCH_PIPELINE_PID) and, when one is gone, stops torchrun and its ranks and says why; signals
to the launcher reach torchrun's whole group."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from dpbench.host import PIPELINE_PID_ENV
from dpbench.run.runlog import log

OUTLIVE_ENV = "DPBENCH_OUTLIVE_STARTER"     # "1": no watchdog (a run started by hand, under nohup)
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
STOP_GRACE_S = 10.0   # from the stop's SIGTERM to SIGKILL of whatever of the run is left


class forward_signals:
    """While a child runs: SIGTERM, SIGINT and SIGHUP to this process go to the child's whole
    process group (torchrun then stops its ranks), the first one only: a Ctrl-C reaches the
    launcher twice (from the terminal and from the pipeline's handler, see
    `dpbench.plan.pipeline.stop_runs_on_interrupt`), and a second signal would cut torchrun's
    own shutdown short. A SIGKILL of this process reaches torchrun through PR_SET_PDEATHSIG
    (see `die_with_parent`); `stop_run` kills what is left after its grace."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.saved, self.forwarded = proc, {}, False

    def _forward(self, signum, _frame):
        STOP.reason = STOP.reason or f"stopped by {signal.Signals(signum).name}"
        if self.forwarded:
            return
        self.forwarded = True
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def __enter__(self):
        for s in self.SIGNALS:
            self.saved[s] = signal.signal(s, self._forward)
        return self

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)


def die_with_parent() -> None:
    """Linux: end this process when its parent dies, even by SIGKILL (a killed Snakemake or
    launcher must not leave ranks training on a GPU for the rest of the run)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        pass


class Stopped(Exception):
    """This run was stopped from outside: a signal, or the loss of the process that started it."""


class _Stop:
    """Why this launcher is stopping its run (None: it is not), and torchrun's pid while it runs."""

    def __init__(self):
        self.reason: str | None = None
        self.torchrun: int | None = None


STOP = _Stop()


@dataclass(frozen=True)
class ProcStat:
    name: str
    ppid: int
    start: int   # clock ticks after boot: a pid taken again by a new process is not the old one


def proc_stat(pid: int) -> ProcStat | None:
    """A live process's name, parent and start time from /proc (None: gone, or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if rest[0] in ("Z", "X"):
            return None
        return ProcStat(name, int(rest[1]), int(rest[19]))
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Watched:
    """A process the run must not outlive: gone when it has exited, when its pid names another
    process, or when `child` (the process it started on the way to this run) is no longer its."""
    pid: int
    start: int | None
    what: str
    child: int | None = None

    def gone(self) -> bool:
        if self.child == os.getpid() and os.getppid() != self.pid:
            return True
        if self.start is None:   # no /proc: the parent's pid is all there is to watch
            return False
        now = proc_stat(self.pid)
        if now is None or now.start != self.start:
            return True
        if self.child is not None and self.child != os.getpid():
            child = proc_stat(self.child)
            return child is None or child.ppid != self.pid
        return False


def starters(env=None) -> list[Watched]:
    """The processes this run must not outlive, as it starts: its parent; the parent's parent
    where the parent is a shell (Snakemake's job shell where bash does not exec the command:
    a killed Snakemake leaves it behind, reparented); the pipeline process `PIPELINE_PID_ENV`
    names, whatever stands in between. Init (pid 1) is never watched."""
    env = os.environ if env is None else env
    watched, parent = [], os.getppid()
    if parent <= 1:
        return []
    stat = proc_stat(parent)
    if stat is None:   # no /proc here: the parent's pid alone
        return [Watched(parent, None, f"the process that started this run (pid {parent})", os.getpid())]
    watched.append(Watched(parent, stat.start, f"the process that started this run ({stat.name}, pid {parent})",
                           os.getpid()))
    if stat.name in SHELLS and stat.ppid > 1 and (up := proc_stat(stat.ppid)):
        watched.append(Watched(stat.ppid, up.start, f"the process that started this run's shell "
                                                    f"({up.name}, pid {stat.ppid})", parent))
    try:
        named = int(env.get(PIPELINE_PID_ENV, ""))
    except ValueError:
        named = 0
    if named > 1 and named not in {w.pid for w in watched} and (pipe := proc_stat(named)):
        watched.append(Watched(named, pipe.start, f"the pipeline ({pipe.name}, pid {named}, "
                                                  f"named by {PIPELINE_PID_ENV})"))
    return watched


def descendants(root: int) -> list[int]:
    """Every process below `root` (torchrun's ranks sit in sessions of their own, but below it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))):
            children.setdefault(stat.ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def stop_run(reason: str, grace_s: float = STOP_GRACE_S) -> None:
    """Stop this run from outside the training: SIGTERM to torchrun's group (or to this process,
    where it trains itself: `Stopped` is raised and the record says why); what is left after
    `grace_s` is killed, and this process ends after a failed record if nobody wrote one."""
    STOP.reason = reason
    log(f"stopping the run: {reason}")
    target = STOP.torchrun
    try:
        if target is not None:
            os.killpg(target, signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
    except ProcessLookupError:
        pass
    proc = Path("/proc").exists()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (threading.main_thread().is_alive() or proc and descendants(os.getpid())):
        time.sleep(0.2)
    for pid in descendants(os.getpid()) if proc else []:   # what did not stop by itself
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(2)   # the main thread writes the record and returns; if it has not by now:
    log(f"the run did not stop within {grace_s + 2:.0f} s of being told: ending it")
    os._exit(1)


def stop_with_pipeline(poll_s: float = 2.0, grace_s: float = STOP_GRACE_S):
    """Stop this run within seconds of losing a process that started it (`starters`): a killed
    Snakemake, or any starter killed -9, must not leave a run training with nobody waiting for it.
    Returns a function that ends the watch (None: nothing to watch)."""
    watched = starters()
    if not watched:
        return None
    done = threading.Event()

    def watch():
        while not done.wait(poll_s):
            if lost := next((w for w in watched if w.gone()), None):
                stop_run(f"stopped: {lost.what} is gone", grace_s)
                return

    threading.Thread(target=watch, daemon=True, name="dpbench-watchdog").start()
    return done.set


class stop_on_signals:
    """While this process trains itself (or waits for its lease): SIGTERM, SIGINT and SIGHUP
    raise `Stopped`, once, so that the run ends as a failed record saying why (launch_ddp
    forwards them to torchrun instead, see `forward_signals`)."""

    def __init__(self):
        self.saved, self.raised = {}, False

    def _raise(self, signum, _frame):
        if self.raised:   # the first one is handled: a second must not cut the record short
            return
        self.raised = True
        STOP.reason = STOP.reason or f"stopped by {signal.Signals(signum).name}"
        raise Stopped(STOP.reason)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in forward_signals.SIGNALS:
                self.saved[s] = signal.signal(s, self._raise)
        return self

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)
