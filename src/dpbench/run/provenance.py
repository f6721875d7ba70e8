"""Where a result came from: versions, devices, topology, flags, code revision, how its processes
were started, as far as they are known without torch (a skipped run's record is written
without it; run.device_facts adds what torch knows)."""
from __future__ import annotations

import os
import platform
import re
import socket

from dpbench.host import gpu_lease
from dpbench.host.source import command_output, git_sha, source_digest
from dpbench.plan.matrix import torch_version


def _plain(text: str | None) -> str | None:
    """nvidia-smi underlines its header with terminal escapes even into a pipe."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text) if text else text


def launch_facts(hosts: list[str]) -> dict:
    """How the run's processes were started: world size, nodes and hosts (multi-node DDP), and
    whether the run held every GPU of its machine (exclusive timing: no other run beside it)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return {"launcher": "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
            else "local", "world_size": world, "nodes": max(1, world // max(local, 1)),
            "hosts": sorted(set(hosts)), "exclusive": os.environ.get(gpu_lease.EXCLUSIVE_ENV) == "1"}


def host_facts(cfg=None) -> dict:
    """What is known without importing torch: torch's version (its version.py, read as text),
    the host, the code revision and the environment switches."""
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
        "source_digest": source_digest(),
    }


def nvidia_smi_topology() -> str | None:
    """`nvidia-smi topo -m`, as text (None where nvidia-smi is missing or fails)."""
    return _plain(command_output(["nvidia-smi", "topo", "-m"]))
