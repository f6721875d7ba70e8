"""Which runs cannot run with a given number of visible CUDA devices, and why: the one rule,
asked by the plan (with the GPUs it is made for, without torch), by the launcher (with the GPUs
its process sees) and by a DDP rank (when torch sees fewer GPUs than its launcher counted)."""
from __future__ import annotations

from dpbench import DISTRIBUTED_VARIANTS, DP_VARIANTS
from dpbench.plan.config import RunConfig


def skip_reason(cfg: RunConfig, visible: int) -> str | None:
    """Why this run cannot run with `visible` CUDA devices (None when it can)."""
    if cfg.compile != "none" and cfg.variant in DP_VARIANTS:
        return ("torch.compile does not support nn.DataParallel (its replicas are made anew every "
                "step, outside the compiled graph); use compile with single or ddp")
    if cfg.batchnorm == "sync" and (visible == 0 or cfg.device == "cpu"):
        return "SyncBatchNorm needs CUDA devices (PyTorch has no CPU implementation)"
    if cfg.device == "cpu":
        if cfg.variant in DP_VARIANTS:
            return "nn.DataParallel needs CUDA devices; device=cpu was asked for"
        return None
    if visible == 0:
        if cfg.variant in DP_VARIANTS:
            return "nn.DataParallel needs CUDA devices and none is visible: DP variants run only on GPUs"
        if cfg.device == "cuda":
            return "device=cuda was asked for but no CUDA device is visible"
        if cfg.variant in DISTRIBUTED_VARIANTS and cfg.gpus > cfg.max_cpu_ranks:
            return (f"needs {cfg.gpus} GPUs, 0 visible; without CUDA, {cfg.variant} runs on at most "
                    f"max_cpu_ranks={cfg.max_cpu_ranks} gloo processes")
        return None
    if cfg.gpus > visible:
        return f"needs {cfg.gpus} GPUs, {visible} visible"
    return None


def world_mismatch(cfg: RunConfig, world: int) -> str | None:
    """Why a rank must not train (None when it may): torchrun started `world` processes for a
    run planned on another number of GPUs, which would label the run as what it is not."""
    if world == cfg.gpus:
        return None
    return (f"the run config says gpus={cfg.gpus} but torchrun started {world} processes; set gpus "
            f"to the world size (nnodes x nproc-per-node) so that the run is labelled as what it is")
