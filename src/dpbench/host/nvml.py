"""NVML access without torch: planning on a login node, GPU leases, provenance and the memory
probes (what the driver says a process holds) use it.

NVML numbers GPUs in PCI order; the lease sets CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA agrees.
"""
from __future__ import annotations

import os
import subprocess

try:
    import pynvml
except ImportError:   # nvidia-ml-py missing from an environment: no GPUs counted, as without a driver
    pynvml = None

MIB = 2 ** 20


def nvml():
    """The initialised NVML bindings, or None where there is no driver or no bindings."""
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_count() -> int:
    lib = nvml()
    return lib.nvmlDeviceGetCount() if lib else 0


def gpu_names() -> list[str]:
    """Every GPU's name, in NVML (PCI) order; [] without a driver."""
    lib = nvml()
    if lib is None:
        return []
    return [_text(lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(i)))
            for i in range(lib.nvmlDeviceGetCount())]


def driver_version() -> str | None:
    lib = nvml()
    return _text(lib.nvmlSystemGetDriverVersion()) if lib else None


def nvml_process_mib(pid: int | None = None) -> float | None:
    """What the driver says process `pid` (default: this one) holds on the GPU, its CUDA context
    included: NVML's per-process accounting, else nvidia-smi's; None where neither names the pid
    (a container may show other pids than its own)."""
    pid = os.getpid() if pid is None else pid
    lib = nvml()
    try:
        if lib is not None:
            for i in range(lib.nvmlDeviceGetCount()):
                for p in lib.nvmlDeviceGetComputeRunningProcesses(lib.nvmlDeviceGetHandleByIndex(i)):
                    if p.pid == pid and p.usedGpuMemory:
                        return p.usedGpuMemory / MIB
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        for line in out.splitlines():
            got, _, used = line.partition(",")
            if got.strip() == str(pid):
                return float(used)
    except Exception:   # no NVML, no nvidia-smi, or no per-process accounting
        return None
    return None
