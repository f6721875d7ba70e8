"""Which runs cannot run with a given number of visible CUDA devices, and why: the one rule,
asked by the plan (with the GPUs it is made for, without torch), by the launcher (with the GPUs
its process sees) and by a DDP rank (when torch sees fewer GPUs than its launcher counted).
What a variant needs and refuses is its spec's (plan.variants); the rules here ask it.
torch-free: the torch release it knows is read from torch's version file (host.torch_facts.torch_version)."""
from __future__ import annotations

import re

from dpbench.host.torch_facts import torch_version
from dpbench.plan import variants
from dpbench.plan.config import RunConfig, train_schema

FULLY_SHARD_SINCE = (2, 4)   # torch.distributed._composable.fsdp (public as torch.distributed.fsdp from 2.6)
FSDP_ON_GLOO_SINCE = (2, 9)
FSDP_ON_GLOO = ("FSDP2 on gloo is correct only from torch 2.9.0 (2.4-2.6 need CUDA streams; 2.7.1 and "
                "2.8.0 produce gradients world-size times too large, pytorch/pytorch#162338)")


def torch_release() -> tuple[int, ...]:
    """The installed torch's (major, minor, patch), without importing it; () when unknown."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch_version()["version"] or "")
    return tuple(int(p or 0) for p in found.groups()) if found else ()


def fully_shard_reason(cuda: bool) -> str | None:
    """Why this torch cannot run fully_shard (FSDP2) here (None when it can): too old a torch,
    or FSDP2 on gloo before its fix."""
    release = torch_release()
    if release and release[:2] < FULLY_SHARD_SINCE:
        return f"fully_shard (FSDP2) needs torch >= 2.4; this is torch {'.'.join(map(str, release))}"
    if not cuda and release and release[:2] < FSDP_ON_GLOO_SINCE:
        return FSDP_ON_GLOO
    return None


def refused(cfg: RunConfig) -> str | None:
    """Why the variant refuses the run's options (its spec's refusals; None when it takes them)."""
    return variants.spec(cfg.variant).refusal(cfg, {k: v.get("default") for k, v in train_schema().items()})


def knob_reason(cfg: RunConfig) -> str | None:
    """Why the run's knobs (accumulate, offload) cannot run as asked (None when they can)."""
    if cfg.offload and not variants.spec(cfg.variant).takes("offload"):
        return (f"offload is FSDP2's CPUOffloadPolicy ({', '.join(variants.takers('offload'))}); {cfg.variant} keeps its parameters and "
                "optimizer state on the device: run it with offload: false")
    if cfg.accumulate > 1 and cfg.global_batch % (cfg.gpus * cfg.accumulate):
        return (f"accumulate={cfg.accumulate} does not divide the per-rank batch (global_batch="
                f"{cfg.global_batch} over {cfg.gpus} rank(s)): every rank's micro-batches must be equal for "
                "the global batch and its gradient to stay those of one step")
    return None


def skip_reason(cfg: RunConfig, visible: int) -> str | None:
    """Why this run cannot run with `visible` CUDA devices (None when it can)."""
    spec = variants.spec(cfg.variant)
    if reason := knob_reason(cfg):
        return reason
    if spec.wrapper == "fully_shard" and (reason := fully_shard_reason(visible > 0 and cfg.device != "cpu")):
        return reason
    if reason := refused(cfg):
        return reason
    if cfg.batchnorm == "sync" and (visible == 0 or cfg.device == "cpu"):
        return "SyncBatchNorm needs CUDA devices (PyTorch has no CPU implementation)"
    if cfg.memory_cap_gib is not None and (visible == 0 or cfg.device == "cpu"):
        # A skip, not a refusal: the same experiment caps on a GPU machine (a largest-batch
        # search), and its CPU plan still runs everything else; the row says why this one did not.
        return ("memory_cap_gib caps what PyTorch may allocate on a CUDA device; on the CPU nothing "
                "would cap it, so the run would not answer what it asks: run it on a GPU, or set "
                "memory_cap_gib: null")
    if cfg.device == "cpu":
        if spec.needs_cuda:
            return f"{spec.wrapper or cfg.variant} needs CUDA devices; device=cpu was asked for"
        return None
    if visible == 0:
        if spec.needs_cuda:
            return (f"{spec.wrapper or cfg.variant} needs CUDA devices and none is visible: "
                    f"{cfg.variant} runs only on GPUs")
        if cfg.device == "cuda":
            return "device=cuda was asked for but no CUDA device is visible"
        if spec.distributed and cfg.gpus > cfg.max_cpu_ranks:
            return (f"needs {cfg.gpus} GPUs, 0 visible; without CUDA, {cfg.variant} runs on at most "
                    f"max_cpu_ranks={cfg.max_cpu_ranks} gloo processes")
        return None
    if cfg.gpus_held > visible:   # rehearsed ranks share one GPU
        return f"needs {cfg.gpus_held} GPUs, {visible} visible"
    return None


def world_mismatch(cfg: RunConfig, world: int) -> str | None:
    """Why a rank must not train (None when it may): torchrun started `world` processes for a
    run planned on another number of GPUs, which would label the run as what it is not."""
    if world == cfg.gpus:
        return None
    return (f"the run config says gpus={cfg.gpus} but torchrun started {world} processes; set gpus "
            f"to the world size (nnodes x nproc-per-node) so that the run is labelled as what it is")
