"""Where a result came from: versions, devices, topology, flags, code revision, how its processes
were started. Only `collect` imports torch: a skipped run's record is written without it."""
from __future__ import annotations

import hashlib
import io
import os
import platform
import re
import socket
import subprocess
import tarfile
from pathlib import Path

from . import gpu_lease
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


PROJECT = Path(__file__).resolve().parents[2]   # the repository root, in a checkout


def is_source(path: str) -> bool:
    """The files that decide what a run computes (paths relative to the repository root, '/'-separated)."""
    return ((path.startswith("src/dpbench/") and path.endswith(".py"))
            or (path.startswith("experiments/") and path.count("/") == 1 and path.endswith(".yaml"))
            or path in ("Snakefile", "config.yaml"))


def digest(files: dict[str, bytes]) -> str:
    """One short hash of {path: content} for the source files among them."""
    h = hashlib.sha256()
    for path in sorted(p for p in files if is_source(p)):
        h.update(path.encode() + b"\0" + files[path] + b"\0")
    return h.hexdigest()[:16]


def source_digest(root: Path | None = None) -> str | None:
    """The digest of the source files as they are on disk: what a commit named by DPBENCH_GIT_SHA
    can be checked against later (tests/test_references.py), where that commit's files are
    known. None outside a checkout (an installed package has no Snakefile beside it)."""
    root = root or PROJECT
    if not (root / "Snakefile").is_file():
        return None
    files = {}
    for f in [root / "Snakefile", root / "config.yaml", *(root / "experiments").glob("*.yaml"),
              *(root / "src" / "dpbench").rglob("*.py")]:
        rel = f.relative_to(root).as_posix()
        if f.is_file() and not f.is_symlink() and is_source(rel) and "__pycache__" not in rel:
            files[rel] = f.read_bytes()
    return digest(files)


def source_digest_at(sha: str, root: Path | None = None) -> str | None:
    """The digest of the source files of commit `sha` (None where git does not know it), read in
    one `git archive` of the folders that hold them."""
    root = root or PROJECT
    try:
        out = subprocess.run(["git", "archive", "--format=tar", sha, "--", "src/dpbench", "experiments",
                              "Snakefile", "config.yaml"], cwd=str(root), capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    with tarfile.open(fileobj=io.BytesIO(out.stdout)) as tar:   # a link is no regular file: left out
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile() and is_source(m.name)}
    return digest(files)


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
        "source_digest": source_digest(),
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
