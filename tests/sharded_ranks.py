"""gloo ranks that train every distributed variant on the same seed and global batches, through
the engine's own pieces (build_workload, build_model, Variant, make_optimizer, train_step and
the profiled step), and keep what a parity check compares: the global loss of every step, the
whole gradients of the first and last steps, the whole parameters after the last, and the
profiled step's collectives and memory rows. One spawn runs every case, so the ranks import
torch once; the two-rank cases of every module that shares them (`share_two_ranks`) train in
one spawn a session."""
from __future__ import annotations

import copy
import faulthandler
import json
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

TINY_LM = {"name": "transformer-lm", "args": {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 64}}
TINY_CNN = "sharded_ranks.py:tiny_cnn"   # resolved against this folder (the ranks' cwd)


def tiny_cnn(width: int = 8, classes: int = 10):
    """Two ResNet BasicBlocks (the units fully_shard wraps) on 8x8 images."""
    from dpbench.workloads.resnet import BasicBlock
    from dpbench.workloads.resnet_cifar import per_sample_cross_entropy
    from dpbench.workloads.spec import WorkloadSpec
    model = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                          BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))

    def batch(generator, n):
        return torch.randn(n, 3, 8, 8, generator=generator), torch.randint(0, classes, (n,), generator=generator)
    return WorkloadSpec(model=model, loss=per_sample_cross_entropy, batch=batch, shard_modules=(BasicBlock,))


@dataclass
class Case:
    name: str
    variant: str
    workload: object = field(default_factory=lambda: TINY_LM)
    options: dict = field(default_factory=dict)
    plant_scale: bool = False   # gradients world-size times too large (torch 2.7.1/2.8.0's FSDP2 on gloo)
    plant: str = ""             # run.knobs.PLANT_ENV while the case trains (a knob that does nothing)


@dataclass
class Trained:
    losses: list[float]
    grads: dict[int, dict[str, torch.Tensor]]   # step -> name -> whole gradient
    params: dict[str, torch.Tensor]
    collectives: list[dict]
    memory: list[dict]                          # one row per rank
    parameter_count: int = 0
    units: int = 0
    buckets: dict | None = None                 # DDP's all-reduce as its buckets tell it
    mechanisms: list[dict] = field(default_factory=list)   # the knobs' verdicts (run.mechanisms)
    micro: list[dict] = field(default_factory=list)        # the profiled step's micro-batches (StepProbe)
    config: dict = field(default_factory=dict)  # the case's RunConfig as its record would hold it


def whole(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def train_case(case: Case, world: int, rank: int, steps: int, global_batch: int) -> Trained | None:
    from dpbench.plan.config import RunConfig
    from dpbench.plan.variants.settings import DDPSettings, FSDPSettings
    from dpbench.run import components, engine, mechanisms, sharded
    from dpbench.run.knobs import PLANT_ENV
    os.environ[PLANT_ENV] = case.plant
    from dpbench.run.data import WorkloadFeed
    from dpbench.run.step import train_step
    from dpbench.run.variants import Variant
    cfg = RunConfig.from_dict({"variant": case.variant, "gpus": world, "workload": case.workload,
                               "global_batch": global_batch, "synthetic_size": global_batch * steps,
                               "lr_schedule": "constant", "lr": 0.05, **case.options})
    cpu = torch.device("cpu")
    spec = engine.build_workload(cfg)
    model = engine.build_model(cfg, SimpleNamespace(device=cpu), spec)
    variant = Variant(cfg.variant, model, [cpu], world, cfg.variant_settings(DDPSettings), loss=spec.loss,
                      shard=sharded.ShardOptions(spec.shard_modules, cfg.variant_settings(FSDPSettings),
                                                 checkpoint=cfg.checkpoint == "units"))
    if case.plant_scale:
        losses_of = variant.losses

        def scaled(x, y, n):
            out = losses_of(x, y, n)
            out.optimised = out.optimised * world
            return out
        variant.losses = scaled
    opt = sharded.make_optimizer(cfg.variant, model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay, False)
    feed = WorkloadFeed(spec.batch, cfg.synthetic_size, cfg.global_batch, cfg.seed, cpu, world, rank)
    out = Trained([], {}, {}, [], [], sum(p.numel() for p in model.parameters()), len(variant.units))
    out.config = cfg.to_dict()
    for step, (x, y, n) in enumerate(feed.epoch(0)):
        if step == 1:
            probe = components.StepProbe()
            losses, row, out.collectives = components.profiled_step(variant, opt, x, y, n, nullctx, True,
                                                                    cfg.accumulate, probe)
            out.mechanisms = mechanisms.check(cfg, variant, opt, probe, row, cpu)
            out.micro = probe.micro
            rows = [None] * world
            dist.all_gather_object(rows, dict(row, device=rank))
            out.memory = rows
        else:
            losses = train_step(variant, opt, x, y, n, accumulate=cfg.accumulate)
        total = losses.global_sum.detach().double().clone()
        dist.all_reduce(total)
        out.losses.append(total.item() / n)
        if step in (0, steps - 1):
            out.grads[step] = {k: whole(p.grad) for k, p in model.named_parameters()}
    out.params = {k: whole(p) for k, p in model.named_parameters()}
    out.buckets = components.ddp_buckets(variant)
    os.environ[PLANT_ENV] = ""
    return out if rank == 0 else None


def nullctx():
    from contextlib import nullcontext
    return nullcontext()


def _rank(rank: int, world: int, store: str, cases: list[Case], steps: int, global_batch: int, save: str):
    os.environ.update(LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        done = {c.name: train_case(c, world, rank, steps, global_batch) for c in cases}
        if rank == 0:
            torch.save(done, save)
    finally:
        dist.destroy_process_group()


def train_all(cases: list[Case], world: int, steps: int = 3, global_batch: int = 8) -> dict[str, Trained]:
    """Every case on `world` gloo ranks, one after the other in one spawn (one rank: in this
    process, whose switches are set back after); rank 0's results."""
    from dpbench.run.knobs import PLANT_ENV
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        save = str(Path(tmp) / "trained.pt")
        args = (world, str(Path(tmp) / "store"), cases, steps, global_batch, save)
        patch.chdir(Path(__file__).parent)   # TINY_CNN's file resolves from here
        if world == 1:
            for var, value in {"LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", PLANT_ENV: ""}.items():
                patch.setenv(var, value)   # what _rank sets, undone on leaving
        on_ranks(_rank, world, args)
        return torch.load(save, weights_only=False)


def on_ranks(target, world: int, args: tuple) -> None:
    """target(rank, *args) on `world` ranks: one rank in this process, its torch threads set back
    after (a spawn's start-up, an interpreter importing torch, costs more than the work), more
    spawned. args[1] is the ranks' FileStore path (every target here takes (world, store, ...)):
    the spawned ranks' stack dumps go beside it."""
    if world == 1:
        threads = torch.get_num_threads()
        try:
            target(0, *args)
        finally:
            torch.set_num_threads(threads)
        return
    store = Path(args[1])
    for attempt in (1, 2):
        try:
            mp.spawn(_with_stacks, args=(target, *args), nprocs=world)
            return
        except mp.ProcessExitedException as exc:
            # A rank killed by a signal died in torch's C++, not in dpbench's Python (CI saw gloo
            # ranks abort, "terminate called without an active exception", with no Python frame
            # left: in teardown, which _with_stacks now skips). Once, the whole spawn again, with
            # the dead rank's Python stack in the warnings summary; a Python error or a second
            # death fails the test.
            if exc.signal_name is None or attempt == 2:
                raise
            dump = _stack_file(store, exc.error_index)
            stack = dump.read_text()[-3000:] if dump.exists() else "(no stack written)"
            warnings.warn(f"{world} gloo ranks: rank {exc.error_index} died by {exc.signal_name}, "
                          f"spawning them all again; its stack:\n{stack}", stacklevel=2)
            store.unlink(missing_ok=True)   # the dead spawn's FileStore would not rendezvous again


def _stack_file(store: Path, rank: int) -> Path:
    return store.with_name(f"{store.name}.stacks-rank{rank}.txt")


_STACKS = []   # the open dump file: faulthandler writes to it when the rank dies


def _with_stacks(rank: int, target, world: int, store: str, *rest) -> None:
    """A spawned rank that, dying by a signal in C++, first writes every thread's Python stack,
    and that, its work done, leaves without the interpreter's teardown: there torch's C++ has
    aborted finished ranks (CI, two runs of .ci/run: the dump showed no Python frame)."""
    _STACKS.append(open(_stack_file(Path(store), rank), "w"))   # open until the rank exits
    faulthandler.enable(_STACKS[-1], all_threads=True)
    target(rank, world, store, *rest)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)   # an exception above never gets here: spawn reports it as it would


def _rehearse_rank(rank: int, world: int, store: str, cases: list[dict], save: str) -> None:
    from dpbench.claims.c9.rehearsal import run_case
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        records = {c["name"]: run_case(c, torch.device("cpu"), world, rank) for c in cases
                   if world >= c.get("min_ranks", 1)}
        if rank == 0:
            torch.save(records, save)
    finally:
        dist.destroy_process_group()


def rehearse_cases(cases: list[dict], world: int) -> dict[str, dict]:
    """Rehearsal cases (claims.c9.rehearsal's plan entries; `min_ranks`: fewer ranks skip it) on
    `world` gloo ranks of this CPU, one spawn (one rank: in this process, its threads set back
    after): rank 0's records by case name."""
    with tempfile.TemporaryDirectory() as tmp:
        args = (world, str(Path(tmp) / "store"), cases, str(Path(tmp) / "records.pt"))
        on_ranks(_rehearse_rank, world, args)
        return torch.load(args[-1], weights_only=False)


# The modules whose cases train on 2 ranks at train_all's defaults register them at import
# (collection imports every test module before any test runs); the first to ask trains every
# distinct case of them all in one spawn: a spawn (two interpreters importing torch, a process
# group) costs seconds, and the modules share their ddp, zero1 and fsdp cases.
_SHARED_CASES: dict[str, list[Case]] = {}
_SHARED_TRAINED: dict[str, Trained] = {}


def _case_key(case: Case) -> str:
    """What a case trains, whatever it is called."""
    return json.dumps([case.variant, case.workload, case.options, case.plant_scale, case.plant], sort_keys=True)


def share_two_ranks(owner: str, cases: list[Case]) -> None:
    """Register `owner`'s two-rank cases for the session's one spawn."""
    _SHARED_CASES[owner] = cases


def two_rank_results(owner: str) -> dict[str, Trained]:
    """`owner`'s registered cases by their names, trained on 2 ranks (train_all's steps and
    global batch) in the session's one spawn; each owner gets its own copies."""
    wanted = {_case_key(c): c for cases in _SHARED_CASES.values() for c in cases}
    missing = [replace(c, name=key) for key, c in wanted.items() if key not in _SHARED_TRAINED]
    if missing:
        _SHARED_TRAINED.update(train_all(missing, world=2))
    return {c.name: copy.deepcopy(_SHARED_TRAINED[_case_key(c)]) for c in _SHARED_CASES[owner]}


def max_differences(ref: Trained, other: Trained) -> dict[str, float]:
    """The parity check: the largest absolute difference of the losses at every step, of the
    gradients at the first and last steps, and of the parameters after the last."""
    def diff(a: dict, b: dict) -> float:
        assert a.keys() == b.keys()
        return max((a[k] - b[k]).abs().max().item() for k in a)
    return {"loss": max(abs(a - b) for a, b in zip(ref.losses, other.losses, strict=True)),
            **{f"grad_step{s}": diff(ref.grads[s], other.grads[s]) for s in ref.grads},
            "params": diff(ref.params, other.params)}


class Inner(nn.Module):
    """A unit nested in Outer (fully_shard wraps both: Inner's parameters are its own)."""

    def __init__(self, width: int):
        super().__init__()
        self.a = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.a(x))


class Outer(nn.Module):
    """A unit holding a nested unit (Inner) and two layers of its own."""

    def __init__(self, width: int):
        super().__init__()
        self.inner, self.b, self.c = Inner(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.c(torch.relu(self.b(self.inner(x))))


def nested_mlp(width: int = 16, classes: int = 10):
    """Two Outer units, each with an Inner unit nested in it, between an input layer and a head
    that the root holds: shard_modules (Outer, Inner)."""
    from dpbench.workloads.resnet_cifar import per_sample_cross_entropy
    from dpbench.workloads.spec import WorkloadSpec
    model = nn.Sequential(nn.Linear(8, width), Outer(width), Outer(width), nn.Linear(width, classes))

    def batch(generator, n):
        return torch.randn(n, 8, generator=generator), torch.randint(0, classes, (n,), generator=generator)
    return WorkloadSpec(model=model, loss=per_sample_cross_entropy, batch=batch, shard_modules=(Outer, Inner))


NESTED = "sharded_ranks.py:nested_mlp"
