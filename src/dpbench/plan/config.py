"""The resolved configuration of one training run, and the schema that defines its keys.

The experiment schema (experiments/schema.yaml, shipped in the package as dpbench/plan/schema.yaml)
is the one source of the run options, their defaults, allowed values and limits (the variants'
names excepted: the registry, dpbench.plan.variants, fills in their enum as it loads): the pipeline
validates experiment files against it, RunConfig takes its field defaults from its `train`
properties, and RunConfig.validate checks a run with jsonschema against that definition plus
the keys the plan sets.
RunConfig is what one run actually uses, stored whole in the run's metrics.json.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.machinery
import importlib.util
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import yaml

from dpbench.plan import variants as variant_registry
from dpbench.workloads.registry import WorkloadError, _is_file, resolve

SCHEMA_FILE = "schema.yaml"
T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The experiment schema, as shipped in the package, with the registry's variant names as
    the variant's enum (the file leaves them to the registry: one list, not two in step)."""
    loaded = yaml.safe_load((resources.files("dpbench.plan") / SCHEMA_FILE).read_text())
    loaded["definitions"]["variant"]["enum"] = list(variant_registry.names())
    return loaded


def train_schema() -> dict[str, dict[str, Any]]:
    """The schema of each run option (the `train` definition's properties)."""
    return schema()["definitions"]["train"]["properties"]


def variants() -> tuple[str, ...]:
    return tuple(schema()["definitions"]["variant"]["enum"])


def _option(key: str) -> Any:
    """A run option's default, as the schema gives it."""
    return field(default=train_schema()[key]["default"])


def plan_schema() -> dict[str, dict[str, Any]]:
    """The schema of the keys the plan sets per run (not options of `train`)."""
    cpu = schema()["properties"]["cpu_plan"]["properties"]
    return {"variant": {"$ref": "#/definitions/variant", "default": "single"},
            "gpus": {"type": "integer", "minimum": 1, "default": 1},
            "repeat": {"type": "integer", "minimum": 0, "default": 0},
            "options": {"$ref": "#/definitions/train", "default": {}},
            "max_cpu_ranks": cpu["max_ranks"]}


@functools.lru_cache(maxsize=1)
def _run_validator() -> jsonschema.Draft202012Validator:
    run = {**schema()["definitions"]["train"], "definitions": schema()["definitions"]}
    run["properties"] = {**plan_schema(), **run["properties"]}
    return jsonschema.Draft202012Validator(run)


def _allowed(error: jsonschema.ValidationError) -> str:
    """What a schema keyword allows, in a few words."""
    rule, value = error.validator, error.validator_value
    if rule == "enum":
        return " | ".join(map(str, value))
    if rule == "type":
        return "a " + " or ".join([value] if isinstance(value, str) else value)
    words = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    return f"a value {words[rule]} {value}" if rule in words else error.message


def _module_found(dotted: str) -> bool:
    """Whether a module is on the Python path, found without importing it or its packages (a
    package's __init__ may import torch): the top-level name through importlib, the rest as
    folders and files under it. True where that cannot tell (a zip, a custom finder)."""
    top, *rest = dotted.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return True
    if spec is None:
        return False
    folders = list(spec.submodule_search_locations or [])
    suffixes = importlib.machinery.all_suffixes()
    for part in rest:
        if not folders:
            return False   # a module, not a package: it has no submodules
        if not all(Path(f).is_dir() for f in folders):
            return True
        package = [str(Path(f) / part) for f in folders if (Path(f) / part).is_dir()]
        if not package and not any((Path(f) / f"{part}{s}").is_file() for f in folders for s in suffixes):
            return False
        folders = package
    return True


def factory_problem(workload: Any) -> str | None:
    """Why a workload's factory cannot be found where the plan is made, in one line with the way
    out; None when it can, for a built-in's or plugin's name, and for a spec that resolve()
    refuses (RunConfig.validate names that). Nothing is imported: the run builds it."""
    try:
        name, ref, _ = resolve(workload)
    except WorkloadError:
        return None
    if name != ref:
        return None
    target = ref.rpartition(":")[0]
    if _is_file(target):
        path = Path(target)
        if path.is_file():
            return None
        return (f"workload factory {ref!r}: no file {path.resolve()} (a relative path is read from the "
                f"folder Snakemake runs in); give the file's path or a module 'pkg.module:function'")
    if _module_found(target):
        return None
    return (f"workload factory {ref!r}: no module {target!r} on the Python path; install its package "
            f"or put the folder above it on PYTHONPATH (docs/your-model.md)")


# Options added after records existed: absent from a run's config while at their defaults, so
# that older records and their setup ids read as they did. The variants' own keys say so where
# they are declared (plan.variants.settings: knob(quiet_at_default=True)); the five written out
# are every variant's options (no spec owns them), a fact of the record format like the fields.
QUIET_AT_DEFAULT = ("workload", "memory_cap_gib", "environment", "accumulate", "checkpoint",
                    *variant_registry.quiet_keys())


@dataclass
class RunConfig:
    # identity of the run inside the experiment matrix (the plan sets these)
    variant: str = plan_schema()["variant"]["default"]
    gpus: int = plan_schema()["gpus"]["default"]
    repeat: int = plan_schema()["repeat"]["default"]
    options: dict[str, Any] = field(default_factory=dict)
    # The run options: defaults, allowed values and limits are the schema's `train` properties.
    # data
    dataset: str = _option("dataset")
    data_root: str = _option("data_root")
    download: bool = _option("download")                # cifar10 absent: try torchvision's download first
    synthetic_size: int = _option("synthetic_size")
    synthetic_test_size: int = _option("synthetic_test_size")
    feed: str = _option("feed")     # gpu (device-resident) | torch (DataLoader + torchvision)
                                    # | fixed (one batch reused: the compute-only ceiling)
    workers: int = _option("workers")
    # optimisation
    epochs: int = _option("epochs")
    max_steps: int | None = _option("max_steps")        # stop after this many optimizer steps (all epochs)
    global_batch: int = _option("global_batch")
    per_gpu_batch: int | None = _option("per_gpu_batch")  # weak scaling: the plan sets global_batch = per_gpu_batch x gpus
    lr: float = _option("lr")
    momentum: float = _option("momentum")
    weight_decay: float = _option("weight_decay")
    lr_schedule: str = _option("lr_schedule")
    fused_sgd: bool = _option("fused_sgd")              # one fused kernel for the SGD update (False: PyTorch's foreach)
    # execution
    precision: str = _option("precision")               # fp32 | bf16 (autocast)
    channels_last: bool = _option("channels_last")
    tf32: bool = _option("tf32")                        # TF32 tensor cores in convolutions and matmuls ("fp32" is then TF32)
    cudnn_benchmark: bool = _option("cudnn_benchmark")
    memory_cap_gib: float | None = _option("memory_cap_gib")  # per-device allocation cap (largest-batch searches)
    deterministic: bool = _option("deterministic")      # bit-exact reruns: deterministic kernels, fixed cuBLAS workspace
    compile: str = _option("compile")                   # a torch.compile mode (train.COMPILE_STEPS), or none
    # the knobs whose mechanism every run checks (run.mechanisms)
    accumulate: int = _option("accumulate")             # micro-batches per optimizer step, sync on the last
    checkpoint: str = _option("checkpoint")             # none | units (activation checkpointing per shard unit)
    # The variants' own keys, flat. Their owners are the specs' settings dataclasses
    # (plan.variants.settings: DDPSettings, FSDPSettings, HSDPSettings, ProcessGroupSettings), which
    # the runtimes take (cfg.variant_settings(DDPSettings)); they stay here, flat and under these
    # names, because this class is the record's config format: to_dict is stored in every record
    # and hashed into setup ids, so its keys and values are frozen.
    offload: bool = _option("offload")                  # fsdp/hsdp: CPUOffloadPolicy
    # DistributedDataParallel's knobs (ddp only; None = PyTorch's default)
    bucket_cap_mb: float | None = _option("bucket_cap_mb")
    gradient_as_bucket_view: bool = _option("gradient_as_bucket_view")
    static_graph: bool = _option("static_graph")
    broadcast_buffers: bool = _option("broadcast_buffers")
    find_unused_parameters: bool = _option("find_unused_parameters")   # ddp/zero1: parameters some forward leaves unused
    # the sharded variants' knobs (fsdp/hsdp), and every distributed variant's bounded wait
    reshard_after_forward: bool = _option("reshard_after_forward")
    hsdp_shard_size: int | None = _option("hsdp_shard_size")   # None: the ranks of one node
    collective_timeout_s: float = _option("collective_timeout_s")
    rehearse: bool = _option("rehearse")                # the ranks share one GPU over gloo (memory per rank, no speed)
    batchnorm: str = _option("batchnorm")               # train | eval (frozen statistics) | sync (SyncBatchNorm, ddp)
    seed: int = _option("seed")                         # the seed this run used (the plan adds the repeat under seeds: distinct)
    num_classes: int = _option("num_classes")           # width of the output layer (labels stay CIFAR's 0..9)
    warmup_steps: int = _option("warmup_steps")         # excluded from timing (autotuning, allocator growth)
    eval_each_epoch: bool = _option("eval_each_epoch")
    eval_samples: int | None = _option("eval_samples")  # evaluate on at most this many test images (None: all)
    device: str = _option("device")                     # auto | cuda | cpu
    max_cpu_ranks: int = plan_schema()["max_cpu_ranks"]["default"]   # without CUDA, ddp on more gloo processes is skipped
    log_every: int = _option("log_every")
    save_checkpoint: bool = _option("save_checkpoint")  # write the final weights (bare model) to model.pt
    workload: str | dict[str, Any] = _option("workload")   # what it trains: a name, a factory, or {name|factory, args}
    environment: str | None = _option("environment")   # a paired launch's environment (whose python runs it)

    def validate(self) -> None:
        """Problems a run cannot recover from, named with the way out. Allowed values and limits
        of the run options are the schema's; the rules between keys are here."""
        def bad(key, value, allowed):
            raise ValueError(f"run config: {key}={value!r} is not allowed; use {allowed}")

        error = jsonschema.exceptions.best_match(_run_validator().iter_errors(self.to_dict()))
        if error is not None:
            path = list(error.absolute_path)
            value = error.instance if path else None
            bad(".".join(map(str, path)) or "(top level)", value, _allowed(error))
        spec = variant_registry.spec(self.variant)   # a known name: the schema's enum checked it
        if spec.processes(self.gpus) == spec.devices_per_process(self.gpus) == 1 and self.gpus != 1:
            bad("gpus", self.gpus, f"1 for the {self.variant} variant")
        if self.global_batch < self.gpus:
            bad("global_batch", self.global_batch, f"at least gpus={self.gpus} (one sample per device)")
        if self.per_gpu_batch is not None and self.global_batch != self.per_gpu_batch * self.gpus:
            bad("global_batch", self.global_batch,
                f"per_gpu_batch x gpus = {self.per_gpu_batch * self.gpus} (weak scaling), or drop per_gpu_batch")
        if self.batchnorm == "sync" and not spec.sync_batchnorm:
            takers = [s.name for s in variant_registry.all_specs() if s.sync_batchnorm]
            bad("batchnorm", "sync", f"train or eval: SyncBatchNorm works only under {' and '.join(takers)}")
        if spec.takes("hsdp_shard_size") and self.hsdp_shard_size is not None and self.gpus % self.hsdp_shard_size:
            bad("hsdp_shard_size", self.hsdp_shard_size,
                f"a divisor of gpus={self.gpus} (the mesh is replicas x shard size), or null for one node")
        if self.rehearse and not spec.distributed:
            ranked = [s.name for s in variant_registry.all_specs() if s.distributed]
            bad("rehearse", True, f"false for {self.variant}: only {', '.join(ranked)} rehearse ranks")
        try:   # torch-free: the factory is found, not imported (the run builds it)
            resolve(self.workload)
        except WorkloadError as exc:
            raise ValueError(f"run config: {exc}") from None

    def variant_settings(self, kind: type[T]) -> T | None:
        """Its variant's own settings of `kind` (plan.variants.settings: DDPSettings, FSDPSettings,
        ProcessGroupSettings), typed, as the runtimes take them; None where the variant owns none."""
        return variant_registry.spec(self.variant).setting(kind, self)

    @property
    def gpus_held(self) -> int:
        """The GPUs the run occupies: its gpus, or one where its ranks rehearse on a shared GPU."""
        return 1 if self.rehearse else self.gpus

    @property
    def scaling(self) -> str:
        """weak: the per-GPU batch is fixed and the global batch grows with the GPUs; strong: the
        global batch is fixed and split across them."""
        return "weak" if self.per_gpu_batch is not None else "strong"

    def to_dict(self) -> dict[str, Any]:
        """The run's settings; keys newer than the first records are left out at their defaults
        (QUIET_AT_DEFAULT), so that a default run's config (in its record, its setup hash,
        compare's config check) reads as it did before them."""
        out = dataclasses.asdict(self)
        for key in QUIET_AT_DEFAULT:
            if out[key] == train_schema()[key]["default"]:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"run config: unknown key(s) {unknown}; known keys: {sorted(known)}")
        cfg = cls(**data)
        cfg.validate()
        return cfg
