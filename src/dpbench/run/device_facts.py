"""What torch knows of a run's provenance: its own version, CUDA, cuDNN, NCCL, the GPUs and the
numerics switches in force, over the host facts that the launcher records without torch."""
from __future__ import annotations

import torch

from dpbench.host.nvml import driver_version
from dpbench.run.provenance import host_facts, nvidia_smi_topology


def collect(dataset: dict | None = None, cfg=None) -> dict:
    """Versions, devices and the numerics switches in force (`cfg`: the run's RunConfig)."""
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
        "topology": nvidia_smi_topology() if cuda else None,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cpu_threads": torch.get_num_threads(),
        "dataset": dataset,
    }
