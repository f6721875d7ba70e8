"""The resolved configuration of one training run, and the schema that defines its keys.

The experiment schema (experiments/schema.yaml, shipped in the package as dpbench/plan/schema.yaml)
is the one source of the run options, their allowed values and limits: the pipeline validates
experiment files against it, and RunConfig.validate checks a run against its `train` definition.
RunConfig is what one run actually uses, stored whole in the run's metrics.json.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

SCHEMA_FILE = "schema.yaml"
# RunConfig keys that are not options of the schema's `train`: the plan sets them per run.
PLAN_KEYS = ("variant", "gpus", "repeat", "options", "max_cpu_ranks")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The experiment schema, as shipped in the package."""
    return yaml.safe_load((resources.files("dpbench.plan") / SCHEMA_FILE).read_text())


def train_schema() -> dict[str, dict[str, Any]]:
    """The schema of each run option (the `train` definition's properties)."""
    return schema()["definitions"]["train"]["properties"]


def variants() -> tuple[str, ...]:
    return tuple(schema()["definitions"]["variant"]["enum"])


def check_value(key: str, value: Any, spec: dict[str, Any]) -> str | None:
    """What is wrong with `value` under a schema property (enum, type, limits), or None."""
    if "enum" in spec:
        return None if value in spec["enum"] else " | ".join(map(str, spec["enum"]))
    types = spec.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    if value is None:
        return None if "null" in types or not types else f"a {' or '.join(types)}"
    checks = {"boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "string": lambda v: isinstance(v, str)}
    wanted = [t for t in types if t != "null"]
    if wanted and not any(checks[t](value) for t in wanted if t in checks):
        return f"a {' or '.join(wanted)}" + (" or null" if "null" in types else "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in spec and value < spec["minimum"]:
            return f"a value >= {spec['minimum']}"
        if "exclusiveMinimum" in spec and value <= spec["exclusiveMinimum"]:
            return f"a value > {spec['exclusiveMinimum']}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"a value <= {spec['maximum']}"
    return None


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
    fused_sgd: bool = False             # one fused kernel for the SGD update (False: PyTorch's foreach)
    # execution
    precision: str = "fp32"             # fp32 | bf16 (autocast)
    channels_last: bool = False
    tf32: bool = True                   # TF32 tensor cores in convolutions and matmuls ("fp32" is then TF32)
    cudnn_benchmark: bool = False
    deterministic: bool = False         # bit-exact reruns: deterministic kernels, fixed cuBLAS workspace
    compile: str = "none"               # a torch.compile mode (train.COMPILE_STEPS), or none
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
        """Problems a run cannot recover from, named with the way out. Allowed values and limits
        of the run options are the schema's; the rules between keys are here."""
        def bad(key, value, allowed):
            raise ValueError(f"run config: {key}={value!r} is not allowed; use {allowed}")

        if self.variant not in variants():
            bad("variant", self.variant, " | ".join(variants()))
        for key, spec in train_schema().items():
            problem = check_value(key, getattr(self, key), spec)
            if problem:
                bad(key, getattr(self, key), problem)
        if self.gpus < 1:
            bad("gpus", self.gpus, "an integer >= 1")
        if self.variant == "single" and self.gpus != 1:
            bad("gpus", self.gpus, "1 for the single variant")
        if self.global_batch < self.gpus:
            bad("global_batch", self.global_batch, f"at least gpus={self.gpus} (one sample per device)")
        if self.per_gpu_batch is not None and self.global_batch != self.per_gpu_batch * self.gpus:
            bad("global_batch", self.global_batch,
                f"per_gpu_batch x gpus = {self.per_gpu_batch * self.gpus} (weak scaling), or drop per_gpu_batch")
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
