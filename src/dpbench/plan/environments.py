"""The Python environments of a paired launch (experiment key `environments`): each one checked
before anything trains, and the order their runs take within a cell (ABBA), so that a drift of
the machine over the launch falls on both sides alike.

A check is a bounded subprocess of the environment's own python, with the PYTHONPATH the train
rule gives it: it must import torch and dpbench's launcher. Torch-free here: only the child
imports torch.
"""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

CHECK_TIMEOUT_S = 180   # importing torch on a loaded machine takes seconds, never minutes
_NO_TORCH, _NO_DPBENCH = 3, 4
_PROBE = f"""
import sys
try:
    import torch
except Exception as exc:
    print(f"{{type(exc).__name__}}: {{exc}}"); sys.exit({_NO_TORCH})
try:
    import dpbench.run.launch
except Exception as exc:
    print(f"{{type(exc).__name__}}: {{exc}}"); sys.exit({_NO_DPBENCH})
print(torch.__version__)
"""


class EnvironmentProblem(ValueError):
    """A named environment cannot run dpbench; the message is one line with the way out. `name`
    and `python` say which, `problem` what (one of PROBLEMS), `fix` the command that mends it
    ("" where there is none to give)."""

    def __init__(self, message: str, *, name: str = "", python: str = "", problem: str = "", fix: str = ""):
        super().__init__(message)
        self.name, self.python, self.problem, self.fix = name, python, problem, fix


PROBLEMS = ("not_executable", "timed_out", "cannot_start", "no_torch", "no_dpbench", "failed")


def src_dir() -> Path:
    """The folder holding this dpbench package: what the train rule puts on PYTHONPATH."""
    return Path(__file__).resolve().parents[2]


def run_env(src: Path | str | None = None) -> dict[str, str]:
    """The environment variables an environment's python runs dpbench with (the train rule's)."""
    src = str(src or src_dir())
    old = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{src}:{old}" if old else src}


@functools.lru_cache(maxsize=None)
def torch_version_of(name: str, python: str, src: str | None = None) -> str:
    """The torch version that `python` runs dpbench with; EnvironmentProblem in one line when it
    does not exist, has no torch, cannot import dpbench, or does not answer in time."""
    repo = Path(src or src_dir()).parent
    install = f"{python} -m pip install -e {repo}"
    if not Path(python).is_file() or not os.access(python, os.X_OK):
        raise EnvironmentProblem(f"environment {name!r}: {python} is no executable python; give the "
                                 f"path of one (e.g. /path/to/venv/bin/python, `python -m venv` makes one)",
                                 name=name, python=python, problem="not_executable", fix="python -m venv")
    try:
        done = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=CHECK_TIMEOUT_S, env=run_env(src), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"environment {name!r}: {python} did not import torch within "
                                 f"{CHECK_TIMEOUT_S} s; try `{python} -c 'import torch'`",
                                 name=name, python=python, problem="timed_out",
                                 fix=f"{python} -c 'import torch'") from None
    except OSError as exc:
        raise EnvironmentProblem(f"environment {name!r}: {python} cannot be started ({exc.strerror})",
                                 name=name, python=python, problem="cannot_start") from None
    said = (done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or [""])[-1]
    if done.returncode == _NO_TORCH:
        raise EnvironmentProblem(f"environment {name!r}: {python} has no torch ({said}); install it: "
                                 f"{python} -m pip install torch",
                                 name=name, python=python, problem="no_torch", fix=f"{python} -m pip install torch")
    if done.returncode == _NO_DPBENCH:
        raise EnvironmentProblem(f"environment {name!r}: {python} cannot import dpbench ({said}); "
                                 f"install it there: {install}", name=name, python=python, problem="no_dpbench",
                                 fix=install)
    if done.returncode != 0 or not said:
        raise EnvironmentProblem(f"environment {name!r}: {python} failed to start "
                                 f"(exit {done.returncode}: {said or 'no output'}); try {install}",
                                 name=name, python=python, problem="failed", fix=install)
    return said


def check_environments(environments: dict[str, str]) -> dict[str, str]:
    """name -> torch version of each environment, all checked; the first problem raises."""
    return {name: torch_version_of(name, python) for name, python in environments.items()}


def interleaved(names: list[str], repeat: int) -> list[str]:
    """The environments' order within one repeat of a cell: forwards on even repeats, backwards
    on odd ones (A B, B A, A B: ABBA), so that a linear drift falls on every side alike."""
    return list(names) if repeat % 2 == 0 else list(reversed(names))
