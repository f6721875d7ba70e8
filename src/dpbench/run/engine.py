"""The engine of one run: set-up, the training loop, evaluation and what goes into its record.

The command line, GPU leases, log redirection, the torchrun relaunch and the skip policy live
in `dpbench.run.launch` (`python -m dpbench.run.launch ...`), which calls run_process here; the
engine never imports the launcher. One process here is a `single` or `dp*` run, or one DDP rank.
Its process layout is dpbench.run.context's, the record it fills dpbench.run.measured's, and the
reduction of each epoch's steps dpbench.run.epochs'.
"""
from __future__ import annotations

import math
import os
import time
import traceback
from contextlib import nullcontext, suppress
from pathlib import Path

import torch

from dpbench import results
from dpbench.host import gpu_lease
from dpbench.plan import variants
from dpbench.plan.config import RunConfig
from dpbench.plan.skips import refused, skip_reason
from dpbench.plan.variants.settings import DDPSettings, FSDPSettings
from dpbench.plan.variants.spec import AUTOCAST
from dpbench.results.errors import error_text
from dpbench.run import host_staging, measure, sharded
from dpbench.run.context import Context
from dpbench.run.data import WorkloadFeed, make_feed
from dpbench.run.datasets import load_dataset
from dpbench.run.epochs import COMPILE_STEPS, EpochLog, close_epoch
from dpbench.run.hooks import FaultInjection, StallGuard, WarmupProbes
from dpbench.run.measured import Measured
from dpbench.run.runlog import CHECKPOINT, log, since_launch
from dpbench.run.variants import Variant
from dpbench.run.waits import Waits
from dpbench.workloads import registry
from dpbench.workloads.calls import map_tensors, model_output
from dpbench.workloads.spec import build as spec_build

EVAL_BATCH = 1000


class WorkloadSkip(Exception):
    """A variant the workload cannot run: the run is recorded as skipped with this reason."""


# -- training -------------------------------------------------------------------------------------

def lr_at(cfg: RunConfig, step: int, total: int) -> float:
    t = step / max(total, 1)
    if cfg.lr_schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * t))
    if cfg.lr_schedule == "onecycle":   # linear up for 15% of the steps, then linearly down
        return cfg.lr * (t / 0.15 if t < 0.15 else max(0.0, (1 - t) / 0.85))
    return cfg.lr


def freeze_batchnorm(model: torch.nn.Module) -> None:
    """batchnorm=eval: running statistics instead of batch statistics, so the computation no
    longer depends on how a batch is split across devices."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()


def unseen_lease(cfg: RunConfig) -> str | None:
    """In a rank: when torch sees fewer GPUs than the launcher counted without it (a driver too
    old for torch's CUDA, ids it cannot open), the skip the launcher would have recorded had it
    asked torch; None when torch sees them, or the run can go on with what it sees."""
    leased = os.environ.get(gpu_lease.LEASED_ENV)
    seen = torch.cuda.device_count() if leased else 0
    if not leased or seen >= int(leased) or not (reason := skip_reason(cfg, seen)):
        return None
    where = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}; torch sees {seen}"
    return f"{reason} ({where})"



def set_numerics(cfg: RunConfig) -> None:
    """The switches that decide which kernels run: TF32, cuDNN autotuning, determinism. The
    environment part of deterministic mode (the cuBLAS workspace) is set by the launcher,
    before CUDA starts."""
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark and not cfg.deterministic
    torch.backends.cudnn.deterministic = cfg.deterministic
    if torch.are_deterministic_algorithms_enabled() != cfg.deterministic:
        # Only when it changes: the call imports torch._inductor's config, 1-2 s of every run.
        torch.use_deterministic_algorithms(cfg.deterministic)


def build_workload(cfg: RunConfig, device: torch.device | None = None):
    """The run's WorkloadSpec, its initial weights drawn from the seed (the same in every variant
    and rank). The default workload's output layer is the run's num_classes wide.

    device: where the factory builds the model. A workload other than the default draws its
    initial weights there (seconds a billion parameters on the host, none on a GPU); the default
    keeps drawing them on the CPU, so its curves stay bit-identical to the committed references."""
    name, _, args = registry.resolve(cfg.workload)
    extra = {"num_classes": cfg.num_classes} if name == registry.DEFAULT and "num_classes" not in args else {}
    torch.manual_seed(cfg.seed)
    on_device = device is not None and device.type == "cuda" and name != registry.DEFAULT
    with torch.device(device) if on_device else nullcontext():
        return spec_build(cfg.workload, **extra)


def unsupported(cfg: RunConfig, spec) -> str | None:
    """Why the workload cannot run this variant (None when it can); what the variant refuses
    whatever the workload is its spec's (plan.skips.refused)."""
    if reason := refused(cfg):
        return reason
    if variants.spec(cfg.variant).wrapper == "nn.DataParallel" and not spec.batch_first:
        return (f"nn.DataParallel gathers outputs on dim 0, and workload {registry.resolve(cfg.workload)[0]!r} "
                "says its outputs are not batch-first (batch_first=False); use single or ddp")
    if cfg.checkpoint == "units" and not spec.shard_modules:
        return (f"checkpoint: units recomputes each of the workload's shard_modules, and workload "
                f"{registry.resolve(cfg.workload)[0]!r} names none; run it with checkpoint: none")
    return None


def wrap(cfg: RunConfig, spec, model: torch.nn.Module, devices: list[torch.device],
         world: int) -> tuple[Variant, torch.optim.Optimizer]:
    """The variant around `model` and its optimizer, as every run builds them (the engine, its
    profiled steps, the rehearsal and the workload check take this one recipe)."""
    variant = Variant(cfg.variant, model, devices, world, cfg.variant_settings(DDPSettings),
                      autocast_dtype=torch.bfloat16 if cfg.precision == "bf16" else None, loss=spec.loss,
                      shard=sharded.ShardOptions(spec.shard_modules, cfg.variant_settings(FSDPSettings),
                                                 checkpoint=cfg.checkpoint == "units", compile=cfg.compile),
                      output=spec.output)
    # After the wrapping: FSDP2's parameters are then the shards (DTensors) the optimizer updates.
    opt = sharded.make_optimizer(cfg.variant, model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay,
                                 cfg.fused_sgd)
    return variant, opt


def build_model(cfg: RunConfig, ctx: Context, spec) -> torch.nn.Module:
    model = spec.model
    if cfg.batchnorm == "sync":
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(ctx.device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    if cfg.batchnorm == "eval":
        freeze_batchnorm(model)
    return model


@torch.no_grad()
def evaluate(model, feed, ctx: Context, autocast, output=None) -> tuple[float, float]:
    was_training = [m.training for m in model.modules()]
    model.eval()
    totals = torch.zeros(3, device=ctx.device, dtype=torch.float64)
    for x, y, _ in feed.epoch(0):
        with autocast():
            logits = model_output(model, x, output).float()
        totals += torch.stack([(logits.argmax(1) == y).sum().double(),
                               torch.nn.functional.cross_entropy(logits, y, reduction="sum").double(),
                               torch.tensor(len(y), device=ctx.device, dtype=torch.float64)])
    ctx.all_reduce(totals)
    for m, flag in zip(model.modules(), was_training):
        m.training = flag
    correct, loss_sum, n = totals.tolist()
    return correct / n, loss_sum / n


def train(cfg: RunConfig, ctx: Context, rec: Measured, warn: measure.WarningRecorder) -> None:
    variant_spec = variants.spec(cfg.variant)
    set_numerics(cfg)
    ctx.waits.at("building the workload (its factory)")
    spec = build_workload(cfg, ctx.device)   # a factory that fails is a failed record naming it (WorkloadError)
    if reason := unsupported(cfg, spec):
        raise WorkloadSkip(reason)
    rec.workload_sizes(spec)     # before the model is moved or wrapped
    rec.phase_done("workload")
    if reason := sharded.rehearsal_misfit(cfg, rec.sizes, ctx.device):   # N x per-rank > the GPU
        raise WorkloadSkip(reason)
    # The default workload trains on its dataset (CIFAR-10, or synthetic CIFAR-shaped images) as
    # before workloads; others on their own synthetic batches.
    dataset = load_dataset(cfg) if spec.dataset == "cifar10" else None
    rec.phase_done("data")
    rec.dataset = dataset.provenance() if dataset else {
        "name": "synthetic", "checksum": "n/a", "detail": f"the workload's batch maker, seed={cfg.seed}",
        "train_size": cfg.synthetic_size, "test_size": 0}
    warn.drain()   # set-up warnings (a checksum mismatch) keep step -1
    model = build_model(cfg, ctx, spec)
    bf16 = cfg.precision == "bf16"
    ctx.waits.at(f"wrapping the model for {cfg.variant}")
    variant, opt = wrap(cfg, spec, model, ctx.devices, ctx.world)
    if ctx.device.type == "cuda":   # a model built whole on the device and then sharded leaves
        torch.cuda.empty_cache()    # its unsharded blocks cached: not the training's reserved memory
        if cfg.rehearse and ctx.distributed:   # gloo's page-locked staging, N times on one host
            host_staging.release_around_steps(opt)
    rec.phase_done("model")
    test_feed = None
    if dataset is None:
        samples_feed = WorkloadFeed(spec.batch, cfg.synthetic_size, cfg.global_batch, cfg.seed, ctx.device,
                                    ctx.world, ctx.rank, fixed=cfg.feed == "fixed")
        samples_feed.total = len(samples_feed) * cfg.epochs if cfg.max_steps is None else cfg.max_steps
        feed = samples_feed
    else:
        feed = make_feed(cfg.feed, dataset.train, cfg.global_batch, cfg.seed, ctx.device,
                         ctx.world, ctx.rank, augment=True, workers=cfg.workers)
        test_split = dataset.test
        if cfg.eval_samples is not None:   # a CPU run would spend most of its time on the test pass
            test_split = type(test_split)(test_split.images[:cfg.eval_samples], test_split.labels[:cfg.eval_samples])
        test_feed = make_feed("gpu" if cfg.feed == "fixed" else cfg.feed, test_split, EVAL_BATCH, cfg.seed,
                              ctx.device, ctx.world, ctx.rank, augment=False, workers=cfg.workers)
    rec.phase_done("feed")
    if cfg.compile != "none":
        variant.compile(cfg.compile)
    data_mib = {0: 0.0}
    if cfg.feed != "torch" and ctx.device.type == "cuda" and test_feed is not None:
        data_mib = {0: (feed.resident_bytes + test_feed.resident_bytes) / measure.MIB}
    total = len(feed) * cfg.epochs if cfg.max_steps is None else cfg.max_steps
    epochs = math.ceil(total / len(feed))
    # fsdp/hsdp compute in bf16 through MixedPrecisionPolicy (the Variant's), not autocast
    autocast = (lambda: torch.autocast(ctx.device.type, dtype=torch.bfloat16)) \
        if bf16 and variant_spec.mixed_precision == AUTOCAST else nullcontext
    # Beside the step: the probes of warm-up steps, an injected fault, the stall guard.
    probes = WarmupProbes(rec, cfg, variant, opt, autocast, ctx.device, ctx.rank, ctx.distributed,
                          untimed=range(COMPILE_STEPS[cfg.compile], cfg.warmup_steps))
    fault = FaultInjection(ctx.rank, ctx.waits)
    # every variant's step is bounded by the collective timeout (its default where no process group)
    stall = StallGuard(ctx.waits, COMPILE_STEPS[cfg.compile], cfg.collective_timeout_s)
    cuda_ids = [d.index for d in ctx.devices if d.type == "cuda"]
    peaks = measure.TrainingPeaks(cuda_ids) if cuda_ids else None
    log(f"{rec.cfg.variant} on {ctx.world if variant_spec.distributed else len(ctx.devices)} "
        f"{ctx.device.type} device(s) {[str(d) for d in ctx.devices]}: {total} steps, "
        f"{epochs} epoch(s) of {len(feed)}, global batch {cfg.global_batch}")

    step = 0
    nvml = measure.NvmlSampler(cuda_ids) if cuda_ids else None
    try:
        with nvml or nullcontext():
            for epoch in range(epochs):
                batches = feed.epoch(epoch)   # the epoch's set-up, before its clock starts
                ep = EpochLog(measure.StepClock(ctx.device))
                ctx.waits.at(f"training, epoch {epoch + 1} from step {step}")
                try:
                    for x, y, n_global in batches:
                        if step >= total:
                            break
                        warn.drain()   # what came before this step keeps its own step
                        warn.step = step
                        if step == 0:
                            rec.start_s = since_launch()
                            if rec.start_s is not None and ctx.is_main:
                                log(f"first step {rec.start_s:.1f} s after the launch (imports, "
                                    f"{'torchrun, ' if ctx.distributed else ''}devices, data, model)")
                        fault.before_step(step)
                        lr = lr_at(cfg, step, total)
                        for group in opt.param_groups:
                            group["lr"] = lr
                        if cfg.channels_last:   # images: the 4-d tensors of the inputs
                            x = map_tensors(x, lambda t: t.contiguous(memory_format=torch.channels_last)
                                            if t.dim() == 4 else t)
                        stall.before_step(step)
                        losses = probes.step(step, x, y, n_global)
                        ep.add(losses, n_global, lr)
                        step += 1
                        stall.after_step()
                        if step % cfg.log_every == 0:
                            # No loss here: reading it would synchronise the host; the epoch's
                            # end logs the global loss.
                            log(f"epoch {epoch + 1}/{epochs} step {step}/{total} "
                                f"{sum(ep.sizes) / (time.perf_counter() - ep.started):.0f} images/s (host clock)")
                except Exception:
                    if not ctx.distributed:   # keep the steps that completed (peers can't be reduced with)
                        with suppress(Exception):
                            close_epoch(cfg, ctx, rec, epoch, ep)
                    raise
                stall.after_epoch()
                close_epoch(cfg, ctx, rec, epoch, ep)
                warn.drain()
                if dataset is None and ctx.device.type == "cuda":   # drawn per epoch, so counted per epoch
                    data_mib = {0: max(data_mib[0], feed.resident_bytes / measure.MIB)}
                if test_feed is not None and (cfg.eval_each_epoch or epoch == epochs - 1):
                    ctx.waits.at(f"evaluation after epoch {epoch + 1}")
                    with peaks.left_out() if peaks else nullcontext():
                        acc, loss = evaluate(model, test_feed, ctx, autocast, spec.output)
                    rec.accuracy.append({"epoch": epoch + 1, "test_acc": acc, "test_loss": loss})
                    log(f"epoch {epoch + 1}/{epochs}: test accuracy {acc:.4f}, test loss {loss:.4f}")
        if cfg.save_checkpoint:   # fsdp/hsdp gather the whole weights: every rank takes part
            ctx.waits.at("checkpoint (gathering the full state dict)")
            state = sharded.full_state_dict(cfg.variant, model)
            if ctx.is_main:
                torch.save(state, rec.out / CHECKPOINT)
    finally:   # peak memory matters most when the run ran out of it
        if peaks:
            rec.memory = measure.memory_rows(peaks, nvml)
            for row in rec.memory:
                one_process = variant_spec.devices_per_process(cfg.gpus) > 1   # the data sits on each device
                row["data_mib"] = data_mib.get(row["device"] if one_process else 0, 0.0)



def preload() -> None:
    """Imports the run makes anyway, made before the start-up's "imports" phase ends, so that
    the later phases time their own work: the optimizer's first add_param_group imports
    torch._dynamo, and torch.use_deterministic_algorithms torch._inductor's config (seconds each;
    seen on the H200 as a 4 s "model" phase in fast runs and a 5 s "data" phase in deterministic ones)."""
    import torch._dynamo  # noqa: F401


def run_process(cfg: RunConfig, out: Path) -> int:
    """Train in this process (single, dp*, or one DDP rank) and write the record."""
    rec = Measured(cfg, out)
    preload()
    rec.phase_done("imports")
    # From the environment, not the Context: a rank whose set-up fails must still know its place.
    distributed, rank = "LOCAL_RANK" in os.environ, int(os.environ.get("RANK", 0))
    waits = Waits(out if distributed else None, rank)
    if distributed and (reason := unseen_lease(cfg)):   # every rank sees the same: all stop here
        log(f"skipped: {reason}")
        if rank == 0:
            rec.write(results.STATUS_SKIPPED, reason)
        return 0
    with measure.WarningRecorder() as warn:
        try:
            with Context(cfg, waits) as ctx:
                rec.phase_done("devices")
                try:
                    train(cfg, ctx, rec, warn)
                except WorkloadSkip as exc:   # every rank builds the same workload: all stop here
                    log(f"skipped: {exc}")
                    if rank == 0:
                        rec.write(results.STATUS_SKIPPED, str(exc))
                    return 0
                except Exception as exc:   # OOM, NaN, a crashed peer: a failed record, never a missing one
                    return _failed(rec, warn, exc, distributed, rank, waits)
                if distributed:
                    waits.at("gathering the record from the ranks")
                    comps = ctx.gather(rec.memory_components)
                    rec.memory_components = None if None in comps else [r for rows in comps for r in rows]
                    rec.warnings = [w for rows in ctx.gather(warn.rows(rank)) for w in rows]
                    mem = ctx.gather(rec.memory)
                    rec.memory = [dict(row, device=r) for r, rows in enumerate(mem) for row in rows]
                    rec.hosts = [h for hosts in ctx.gather(rec.hosts) for h in hosts]
                else:
                    rec.warnings = warn.rows()
                if rank == 0:
                    rec.write(results.STATUS_OK)
                waits.done()
        except Exception as exc:   # the process group or the device could not be set up
            return _failed(rec, warn, exc, distributed, rank, waits)
    return 0


def _failed(rec: Measured, warn: measure.WarningRecorder, exc: Exception, distributed: bool, rank: int,
            waits: Waits | None = None) -> int:
    reason = error_text(exc)
    if distributed and waits is not None:   # where it was waiting (a peer's timeout names the place)
        waits.disarm()
        reason = f"at {waits.where}: {reason}"
    log(f"run failed: {reason}")
    traceback.print_exc()
    if not distributed:
        rec.warnings = warn.rows()
        rec.write(results.STATUS_FAILED, reason)
        return 0
    (rec.out / f"rank{rank}.error.txt").write_text(reason + "\n")
    if rank == 0:   # what this rank measured, without collectives that would hang
        rec.warnings = warn.rows(rank)
        rec.write(results.STATUS_FAILED, reason)
    # Peers are blocked in a collective that will never complete: torchrun ends them once
    # this rank exits, and the launcher completes the record.
    return 1

