"""The estimators people reach for, called where installed (the optional extra [advise]), never
re-implemented: DeepSpeed's model-state estimates (estimate_zero2_model_states_mem_needs and
estimate_zero3_model_states_mem_needs, what its *_all_cold functions print, from parameter
counts alone) and accelerate's training rule (accelerate.commands.estimate.estimate_training_usage,
what `accelerate estimate-memory` prints as the peak for Adam). Each returns bytes per GPU, or
None where the package is not installed (NOT_INSTALLED says which). Torch-free here: the
packages import torch themselves, only when called."""
from __future__ import annotations

import importlib.metadata
import importlib.util
from typing import Any

NOT_INSTALLED = "not installed"


def version(package: str) -> str:
    """The installed version, or NOT_INSTALLED."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def deepspeed_bytes(variant: str, parameters: int, largest_layer_parameters: int | None, gpus: int) -> float | None:
    """DeepSpeed's GPU bytes of model states per GPU: ZeRO-2's for ddp and zero1 (the closest
    it has: replicated parameters), ZeRO-3's for fsdp and hsdp, no offload."""
    if not _installed("deepspeed"):
        return None
    if variant in ("fsdp", "hsdp"):
        # the optional [advise] extra, and it imports torch: only here, once _installed found it
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        _, gpu, _ = estimate_zero3_model_states_mem_needs(parameters, largest_layer_parameters or parameters,
                                                          num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False)
        return float(gpu)
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs   # as above
    _, gpu = estimate_zero2_model_states_mem_needs(parameters, num_gpus_per_node=gpus, num_nodes=1, cpu_offload=False)
    return float(gpu)


def accelerate_bytes(parameter_bytes: float, precision: str) -> float | None:
    """accelerate's peak training bytes for a model of `parameter_bytes` (as `accelerate
    estimate-memory` prints it: the largest of its model, gradient, optimizer and step terms)."""
    if not _installed("accelerate"):
        return None
    from accelerate.commands.estimate import estimate_training_usage   # as deepspeed's: optional, imports torch
    sizes: dict[str, Any] = estimate_training_usage(int(parameter_bytes), "bfloat16" if precision == "bf16" else "float32")
    return float(max(sizes.values()))
