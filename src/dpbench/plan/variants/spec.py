"""What a variant is, as data: the VariantSpec every module of this package declares.

Torch-free (planning reads it); what a spec means at run time is `dpbench.run.variants`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

from dpbench.plan.variants.settings import Knob, knobs_of, read

T = TypeVar("T")

# How a run's processes and devices are laid out.
ONE_DEVICE = "one device"                        # one process, one device (CPU or GPU)
ALL_DEVICES_ONE_PROCESS = "one process, every GPU"   # nn.DataParallel: one process drives k GPUs
PROCESS_PER_GPU = "one process per GPU"          # under torchrun: one rank per GPU (or gloo process)

# How the loss that backward() sees is reduced from the per-sample losses.
GLOBAL_MEAN = "global mean"              # the sum over the global batch / its size
REPLICA_MEANS_MEAN = "mean of replica means"   # dp_mean: each replica's mean, averaged (biased if uneven)
REPLICA_SUMS_OVER_BATCH = "replica sums / global batch"   # dp_sum: each replica's sum, over the global batch
RANK_SUM_SCALED = "rank sum x world / global batch"   # a rank's sum scaled so that averaging over ranks
                                                       # gives the gradient of the global mean

# The mixed-precision mechanism a bf16 run uses.
AUTOCAST = "autocast"                     # torch.autocast around the forward
PARAM_DTYPE = "param_dtype"               # FSDP2's MixedPrecisionPolicy(param_dtype=bf16)


@dataclass(frozen=True)
class Refusal:
    """An option this variant cannot honour: a run setting `key` to other than its default is
    recorded as skipped with `reason`."""
    key: str
    reason: str


@dataclass(frozen=True)
class VariantSpec:
    """One variant: how it lays out processes, wraps the model, reduces the loss, builds the
    optimizer and shards, its own config keys and the options it refuses.

    `runtime` names the module under dpbench.run.variants that wraps the model for it (torch)."""
    name: str
    order: int                     # its place in tables, figures and the docs' table
    summary: str                   # one line of markdown: the docs' variant table
    layout: str
    wrapper: str                   # what wraps the model, as PyTorch names it ("" for none)
    runtime: str                   # dpbench.run.variants.<runtime>: wrap(...)
    loss: str
    needs_cuda: bool = False
    optimizer: str = "SGD"         # or ZeroRedundancyOptimizer (SGD's state sharded over the ranks)
    mesh: tuple[str, ...] = ()     # the DeviceMesh's dimension names (fully_shard); () without one
    shards: tuple[str, ...] = ()   # what each rank keeps only its share of
    compiles: str = "module"       # what torch.compile compiles: the module, or each shard unit
    mixed_precision: str = AUTOCAST
    sync_batchnorm: bool = False   # SyncBatchNorm works under it
    config: tuple[type, ...] = ()  # its own config: settings dataclasses (settings.py) whose fields
                                   # are the run options only it (and its kin) take
    refuses: tuple[Refusal, ...] = ()

    @property
    def distributed(self) -> bool:
        """One process per rank, under torchrun (with a process group)."""
        return self.layout == PROCESS_PER_GPU

    def processes(self, gpus: int) -> int:
        return gpus if self.distributed else 1

    def devices_per_process(self, gpus: int) -> int:
        return gpus if self.layout == ALL_DEVICES_ONE_PROCESS else 1

    @property
    def shards_parameters(self) -> bool:
        return "parameters" in self.shards

    @property
    def sharded(self) -> bool:
        return bool(self.shards)

    @property
    def knobs(self) -> tuple[Knob, ...]:
        """Its config's keys, as its settings classes declare them."""
        return tuple(k for settings in self.config for k in knobs_of(settings))

    @property
    def knob_keys(self) -> tuple[str, ...]:
        return tuple(k.key for k in self.knobs)

    def takes(self, option: str) -> bool:
        return option in self.knob_keys

    def settings(self, options: Any, defaults: Mapping[str, Any] | None = None) -> tuple[Any, ...]:
        """Its own config, typed: each of its settings classes read from a run's config (a
        RunConfig, or a mapping whose missing keys take `defaults`' values)."""
        return tuple(read(settings, options, defaults) for settings in self.config)

    def setting(self, kind: type[T], options: Any, defaults: Mapping[str, Any] | None = None) -> T | None:
        """Its settings of `kind` (DDPSettings, FSDPSettings, ...: a class it lists, or their
        base) read from a run's config; None where it owns none of that kind."""
        return next((read(settings, options, defaults) for settings in self.config if issubclass(settings, kind)),
                    None)

    def refusal(self, options: Any, defaults: Mapping[str, Any]) -> str | None:
        """Why it cannot run with these options (None when it can)."""
        get = options.get if isinstance(options, Mapping) else (lambda k: getattr(options, k))
        return next((r.reason for r in self.refuses if get(r.key) != defaults.get(r.key)), None)
