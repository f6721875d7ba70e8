"""Where a result came from: versions, devices, topology, flags, code revision, how its processes
were started. Only `collect` imports torch: a skipped run's record is written without it."""
from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from pathlib import Path

from .nvml import driver_version


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _plain(text: str | None) -> str | None:
    """nvidia-smi underlines its header with terminal escapes even into a pipe."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text) if text else text


def git_sha() -> str | None:
    """The project's revision, with '+dirty' when the working tree has changes. DPBENCH_GIT_SHA,
    where set, wins: a tree copied to a GPU machine may carry no .git, or a stale one (an older
    commit, the newer code then showing as '+dirty')."""
    if explicit := os.environ.get("DPBENCH_GIT_SHA"):
        return explicit
    here = str(Path(__file__).resolve().parent)
    sha = _run(["git", "rev-parse", "HEAD"], cwd=here)
    if sha and _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here):
        sha += "+dirty"
    return sha


def launch_facts(hosts: list[str]) -> dict:
    """How the run's processes were started: world size, nodes and hosts (multi-node DDP)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return {"launcher": "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
            else "local", "world_size": world, "nodes": max(1, world // max(local, 1)),
            "hosts": sorted(set(hosts))}


def host_facts(cfg=None) -> dict:
    """What is known without importing torch: torch's version (its version.py, read as text),
    the host, the code revision and the environment switches."""
    from .plan import torch_version
    torch = torch_version()
    return {
        "torch": torch["version"],
        "torch_git": torch["git"],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "compile": getattr(cfg, "compile", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
    }


def collect(dataset: dict | None = None, cfg=None) -> dict:
    """Versions, devices and the numerics switches in force (`cfg`: the run's RunConfig)."""
    import torch

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        **host_facts(cfg),
        "torch": torch.__version__,   # the imported torch's own word over its version.py's
        "torch_git": torch.version.git_version,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": nccl,
        "driver": driver_version() if cuda else None,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "topology": _plain(_run(["nvidia-smi", "topo", "-m"])) if cuda else None,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cpu_threads": torch.get_num_threads(),
        "dataset": dataset,
    }
