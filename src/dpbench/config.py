"""The resolved configuration of one training run.

The pipeline validates experiment files against `experiments/schema.yaml`; this dataclass is
what one run actually uses, and it is stored whole in the run's metrics.json.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from . import VARIANTS


@dataclass
class RunConfig:
    # identity of the run inside the experiment matrix
    variant: str = "single"
    gpus: int = 1
    repeat: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    # data
    dataset: str = "synthetic"          # synthetic | cifar10
    data_root: str = "data"
    download: bool = True               # cifar10 absent: try torchvision's download first
    synthetic_size: int = 50000
    synthetic_test_size: int = 10000
    feed: str = "gpu"                   # gpu (device-resident) | torch (DataLoader + torchvision)
                                        # | fixed (one batch reused: the compute-only ceiling)
    workers: int = 2
    # optimisation
    epochs: int = 2
    max_steps: int | None = None        # stop after this many optimizer steps (all epochs)
    global_batch: int = 512
    per_gpu_batch: int | None = None    # weak scaling: the plan sets global_batch = per_gpu_batch x gpus
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "cosine"         # cosine | onecycle | constant
    # execution
    precision: str = "fp32"             # fp32 | bf16 (autocast)
    channels_last: bool = False
    tf32: bool = True                   # TF32 tensor cores in convolutions and matmuls ("fp32" is then TF32)
    cudnn_benchmark: bool = False
    deterministic: bool = False         # bit-exact reruns: deterministic kernels, fixed cuBLAS workspace
    compile: str = "none"               # none | default | max-autotune | reduce-overhead (torch.compile)
    # DistributedDataParallel's knobs (ddp only; None = PyTorch's default)
    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    broadcast_buffers: bool = True
    batchnorm: str = "train"            # train | eval (frozen statistics) | sync (SyncBatchNorm, ddp)
    seed: int = 0                       # the seed this run used (the plan adds the repeat under seeds: distinct)
    num_classes: int = 10               # width of the output layer (labels stay CIFAR's 0..9)
    warmup_steps: int = 5               # excluded from timing (autotuning, allocator growth)
    eval_each_epoch: bool = True
    eval_samples: int | None = None     # evaluate on at most this many test images (None: all)
    device: str = "auto"                # auto | cuda | cpu
    max_cpu_ranks: int = 2              # without CUDA, ddp on more gloo processes is skipped
    log_every: int = 50
    save_checkpoint: bool = False       # write the final weights (bare model) to model.pt

    def validate(self) -> None:
        """Problems a run cannot recover from, named with the way out."""
        def bad(key, value, allowed):
            raise ValueError(f"run config: {key}={value!r} is not allowed; use {allowed}")

        if self.variant not in VARIANTS:
            bad("variant", self.variant, " | ".join(VARIANTS))
        for key, allowed in (("dataset", ("synthetic", "cifar10")), ("feed", ("gpu", "torch", "fixed")),
                             ("lr_schedule", ("cosine", "onecycle", "constant")),
                             ("precision", ("fp32", "bf16")), ("batchnorm", ("train", "eval", "sync")),
                             ("device", ("auto", "cuda", "cpu")),
                             ("compile", ("none", "default", "max-autotune", "reduce-overhead"))):
            if getattr(self, key) not in allowed:
                bad(key, getattr(self, key), " | ".join(allowed))
        if self.gpus < 1:
            bad("gpus", self.gpus, "an integer >= 1")
        if self.variant == "single" and self.gpus != 1:
            bad("gpus", self.gpus, "1 for the single variant")
        if self.global_batch < self.gpus:
            bad("global_batch", self.global_batch, f"at least gpus={self.gpus} (one sample per device)")
        if self.max_steps is None and self.epochs < 1:
            bad("epochs", self.epochs, "an integer >= 1, or set max_steps")
        if self.per_gpu_batch is not None and self.global_batch != self.per_gpu_batch * self.gpus:
            bad("global_batch", self.global_batch,
                f"per_gpu_batch x gpus = {self.per_gpu_batch * self.gpus} (weak scaling), or drop per_gpu_batch")
        if self.num_classes < 10:
            bad("num_classes", self.num_classes, "an integer >= 10 (CIFAR-10 has 10 labels)")
        if self.batchnorm == "sync" and self.variant != "ddp":
            bad("batchnorm", "sync", "train or eval: SyncBatchNorm works only under ddp")

    @property
    def scaling(self) -> str:
        """weak: the per-GPU batch is fixed and the global batch grows with the GPUs; strong: the
        global batch is fixed and split across them."""
        return "weak" if self.per_gpu_batch is not None else "strong"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"run config: unknown key(s) {unknown}; known keys: {sorted(known)}")
        cfg = cls(**data)
        cfg.validate()
        return cfg
