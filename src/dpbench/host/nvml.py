"""NVML access without torch: planning on a login node, GPU leases and provenance use it.

NVML numbers GPUs in PCI order; the lease sets CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA agrees.
"""
from __future__ import annotations

try:
    import pynvml
except ImportError:   # nvidia-ml-py missing from an environment: no GPUs counted, as without a driver
    pynvml = None


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
