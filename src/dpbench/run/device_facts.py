"""What torch knows of a run's provenance: its own version, CUDA, cuDNN, NCCL, the GPUs and the
numerics switches in force, over the host facts that the launcher records without torch; and
DDP's default bucket size as this torch builds it (the perf targets' word for a run that left
bucket_cap_mb unset)."""
from __future__ import annotations

import functools
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

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


@functools.lru_cache(maxsize=1)
def ddp_default_bucket_mb() -> tuple[float | None, str]:
    """DDP's bucket size where a run leaves bucket_cap_mb unset, as the torch here builds it (a
    one-rank gloo group around a one-parameter model): (MB, torch's version), or (None, why)."""
    def built() -> float:
        return DistributedDataParallel(torch.nn.Linear(1, 1)).bucket_bytes_cap / 2**20

    try:
        if dist.is_initialized():
            return built(), torch.__version__
        with tempfile.TemporaryDirectory() as folder:
            dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
            try:
                return built(), torch.__version__
            finally:
                dist.destroy_process_group()
    except (RuntimeError, ValueError) as exc:
        return None, f"no DDP could be built here ({exc})"


