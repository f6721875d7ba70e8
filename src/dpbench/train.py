"""One training run of one variant, measured, written to its own folder.

    python -m dpbench.train --config run.json --out results/<tag>/runs/<run_id>
    python -m dpbench.train --config '{"variant": "ddp", "gpus": 2}' --out /tmp/run

`--config` is a JSON file or inline JSON with `dpbench.config.RunConfig` keys. The `ddp`
variant re-launches this module under torchrun (standalone rendezvous: a free port, so two
runs never collide). On several nodes, start it under torchrun yourself, on every node:

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m dpbench.train --config run.json --out /shared/results/run

Whatever happens, the folder ends with metrics.json (status ok / failed / skipped, and why),
written last so a half-written run is never mistaken for a finished one.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from contextlib import nullcontext, suppress
from pathlib import Path

import torch
import torch.distributed as dist

from . import DP_VARIANTS, gpu_lease, measure, provenance, results
from .config import RunConfig
from .data import load_dataset, make_feed
from .model import resnet18
from .variants import Variant

FAULT_ENV = "DPBENCH_FAULT"   # "RANK:STEP": raise at that step on that rank (tests of the failure path)
EVAL_BATCH = 1000
CHECKPOINT = "model.pt"


def log(msg: str) -> None:
    rank = f" rank {os.environ['RANK']}" if "RANK" in os.environ else ""
    print(f"[dpbench {time.strftime('%H:%M:%S')}{rank}] {msg}", flush=True)


# -- what can run here --------------------------------------------------------------------------

def skip_reason(cfg: RunConfig) -> str | None:
    """Why this run cannot run on this machine (None when it can)."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.batchnorm == "sync" and (visible == 0 or cfg.device == "cpu"):
        return "SyncBatchNorm needs CUDA devices (PyTorch has no CPU implementation)"
    if cfg.device == "cpu":
        if cfg.variant in DP_VARIANTS:
            return "nn.DataParallel needs CUDA devices; device=cpu was asked for"
        return None
    if visible == 0:
        if cfg.variant in DP_VARIANTS:
            return ("nn.DataParallel needs CUDA devices and none is visible "
                    "(torch.cuda.is_available() is False): DP variants run only on GPUs")
        if cfg.device == "cuda":
            return "device=cuda was asked for but no CUDA device is visible"
        if cfg.variant == "ddp" and cfg.gpus > cfg.max_cpu_ranks:
            return (f"needs {cfg.gpus} GPUs, 0 visible; without CUDA, ddp runs on at most "
                    f"max_cpu_ranks={cfg.max_cpu_ranks} gloo processes")
        return None
    needed = int(os.environ.get("LOCAL_WORLD_SIZE", cfg.gpus))
    if needed > visible:
        return f"needs {needed} GPUs, {visible} visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
    return None


def uses_cuda(cfg: RunConfig) -> bool:
    return cfg.device != "cpu" and torch.cuda.is_available()


# -- the record -----------------------------------------------------------------------------------

class Record:
    """Everything measured so far; written whole at the end, or as far as it got on failure."""

    def __init__(self, cfg: RunConfig, out: Path):
        self.cfg, self.out = cfg, out
        self.started = time.perf_counter()
        self.steps: list[dict] = []
        self.timed_ms: list[float] = []
        self.timed_batches: list[int] = []
        self.accuracy: list[dict] = []
        self.memory: list[dict] = []
        self.warnings: list[dict] = []
        self.dataset: dict | None = None
        self.device_type = "cuda" if uses_cuda(cfg) else "cpu"

    def write(self, status: str, reason: str = "") -> dict:
        cfg = self.cfg
        losses = [r["loss_global"] for r in self.steps[-20:]]
        rec = {
            "run_id": results.run_id(cfg.variant, cfg.gpus, cfg.repeat, cfg.options),
            "status": status, "reason": reason,
            "variant": cfg.variant, "gpus": cfg.gpus, "repeat": cfg.repeat, "options": cfg.options,
            "config": cfg.to_dict(), "device_type": self.device_type,
            "throughput": measure.throughput(self.timed_ms, self.timed_batches),
            "memory": self.memory, "warnings": self.warnings, "accuracy": self.accuracy,
            "final_loss": sum(losses) / len(losses) if losses else None,
            "steps": len(self.steps),
            "wall_s": time.perf_counter() - self.started,
            "provenance": provenance.collect(self.dataset),
        }
        if self.steps:
            results.write_csv(self.out / results.STEPS, results.STEP_COLUMNS, self.steps)
        results.write_json(self.out / results.METRICS, rec)  # last: marks the run finished
        return rec


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


class Context:
    """Process layout: the devices this process drives, and its place in a DDP group."""

    def __init__(self, cfg: RunConfig):
        self.distributed = "LOCAL_RANK" in os.environ
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.rank = int(os.environ.get("RANK", 0))
        local = int(os.environ.get("LOCAL_RANK", 0))
        cuda = uses_cuda(cfg)
        if cfg.variant in DP_VARIANTS:
            self.devices = [torch.device("cuda", i) for i in range(cfg.gpus)]
        elif cuda:
            self.devices = [torch.device("cuda", local)]
        else:
            self.devices = [torch.device("cpu")]
        self.device = self.devices[0]
        if cuda:
            torch.cuda.set_device(self.device)   # before the process group: NCCL binds to it
        if self.distributed:
            dist.init_process_group("nccl" if cuda else "gloo",
                                    device_id=self.device if cuda else None)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(t, op=op)
        return t

    def gather(self, obj):
        """Every rank's object, on every rank (one item when not distributed)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def build_model(cfg: RunConfig, ctx: Context) -> torch.nn.Module:
    torch.manual_seed(cfg.seed)   # same initial weights in every variant and rank
    model = resnet18()
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
def evaluate(model, feed, ctx: Context, autocast) -> tuple[float, float]:
    was_training = [m.training for m in model.modules()]
    model.eval()
    totals = torch.zeros(3, device=ctx.device, dtype=torch.float64)
    for x, y, _ in feed.epoch(0):
        with autocast():
            logits = model(x).float()
        totals += torch.stack([(logits.argmax(1) == y).sum().double(),
                               torch.nn.functional.cross_entropy(logits, y, reduction="sum").double(),
                               torch.tensor(len(y), device=ctx.device, dtype=torch.float64)])
    ctx.all_reduce(totals)
    for m, flag in zip(model.modules(), was_training):
        m.training = flag
    correct, loss_sum, n = totals.tolist()
    return correct / n, loss_sum / n


def _fault_step(ctx: Context) -> int | None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    rank, step = (int(v) for v in spec.split(":"))
    return step if rank == ctx.rank else None


def train(cfg: RunConfig, ctx: Context, rec: Record, warn: measure.WarningRecorder) -> None:
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    dataset = load_dataset(cfg)
    rec.dataset = dataset.provenance()
    warn.drain()   # set-up warnings (a checksum mismatch) keep step -1
    model = build_model(cfg, ctx)
    variant = Variant(cfg.variant, model, ctx.devices, ctx.world)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    feed = make_feed(cfg.feed, dataset.train, cfg.global_batch, cfg.seed, ctx.device,
                     ctx.world, ctx.rank, augment=True, workers=cfg.workers)
    test_feed = make_feed("gpu" if cfg.feed == "fixed" else cfg.feed, dataset.test, EVAL_BATCH, cfg.seed, ctx.device,
                          ctx.world, ctx.rank, augment=False, workers=cfg.workers)
    data_mib = {0: 0.0}
    if cfg.feed != "torch" and ctx.device.type == "cuda":
        data_mib = {0: (feed.resident_bytes + test_feed.resident_bytes) / measure.MIB}
    total = len(feed) * cfg.epochs if cfg.max_steps is None else cfg.max_steps
    epochs = math.ceil(total / len(feed))
    bf16 = cfg.precision == "bf16"
    autocast = (lambda: torch.autocast(ctx.device.type, dtype=torch.bfloat16)) if bf16 else nullcontext
    fault = _fault_step(ctx)
    cuda_ids = [d.index for d in ctx.devices if d.type == "cuda"]
    peaks = measure.TrainingPeaks(cuda_ids) if cuda_ids else None
    log(f"{rec.cfg.variant} on {len(ctx.devices) if cfg.variant in DP_VARIANTS else ctx.world} "
        f"{ctx.device.type} device(s) {[str(d) for d in ctx.devices]}: {total} steps, "
        f"{epochs} epoch(s) of {len(feed)}, global batch {cfg.global_batch}")

    step = 0
    nvml = measure.NvmlSampler(cuda_ids) if cuda_ids else None
    try:
        with nvml or nullcontext():
            for epoch in range(epochs):
                ep = EpochLog(measure.StepClock(ctx.device))
                try:
                    for x, y, n_global in feed.epoch(epoch):
                        if step >= total:
                            break
                        warn.drain()   # what came before this step keeps its own step
                        warn.step = step
                        if step == fault:
                            raise RuntimeError(f"fault injected by {FAULT_ENV} at step {step} on rank {ctx.rank}")
                        lr = lr_at(cfg, step, total)
                        for group in opt.param_groups:
                            group["lr"] = lr
                        if cfg.channels_last:
                            x = x.contiguous(memory_format=torch.channels_last)
                        with autocast():
                            losses = variant.losses(x, y, n_global)
                        opt.zero_grad(set_to_none=True)
                        losses.optimised.backward()
                        opt.step()
                        ep.add(losses, n_global, lr)
                        step += 1
                        if step % cfg.log_every == 0:
                            # No loss here: reading it would synchronise the host; the epoch's
                            # end logs the global loss.
                            log(f"epoch {epoch + 1}/{epochs} step {step}/{total} "
                                f"{sum(ep.sizes) / (time.perf_counter() - ep.started):.0f} images/s (host clock)")
                except Exception:
                    if not ctx.distributed:   # keep the steps that completed (peers can't be reduced with)
                        with suppress(Exception):
                            _close_epoch(cfg, ctx, rec, epoch, ep)
                    raise
                _close_epoch(cfg, ctx, rec, epoch, ep)
                warn.drain()
                if cfg.eval_each_epoch or epoch == epochs - 1:
                    with peaks.left_out() if peaks else nullcontext():
                        acc, loss = evaluate(model, test_feed, ctx, autocast)
                    rec.accuracy.append({"epoch": epoch + 1, "test_acc": acc, "test_loss": loss})
                    log(f"epoch {epoch + 1}/{epochs}: test accuracy {acc:.4f}, test loss {loss:.4f}")
        if cfg.save_checkpoint and ctx.is_main:
            torch.save(model.state_dict(), rec.out / CHECKPOINT)
    finally:   # peak memory matters most when the run ran out of it
        if peaks:
            rec.memory = measure.memory_rows(peaks, nvml)
            for row in rec.memory:
                row["data_mib"] = data_mib.get(row["device"] if cfg.variant in DP_VARIANTS else 0, 0.0)


class EpochLog:
    """One epoch's per-step values, kept on the device until the epoch ends."""

    def __init__(self, clock: measure.StepClock):
        self.clock, self.started = clock, time.perf_counter()
        self.sums, self.reported, self.sizes, self.lrs = [], [], [], []
        clock.mark()

    def add(self, losses, n_global: int, lr: float) -> None:
        self.clock.mark()
        self.sums.append(losses.global_sum)
        self.reported.append(losses.reported)
        self.sizes.append(n_global)
        self.lrs.append(lr)


def _close_epoch(cfg, ctx, rec, epoch, ep: EpochLog) -> None:
    """Reduce the epoch's per-step values once (no host sync inside the loop) and record them."""
    sums, reported, sizes, lrs = ep.sums, ep.reported, ep.sizes, ep.lrs
    if not sums:
        return
    step_ms = torch.tensor(ep.clock.step_ms(), dtype=torch.float64)
    sums = ctx.all_reduce(torch.stack(sums).double())
    # The slowest rank sets the pace of a synchronous step.
    step_ms = ctx.all_reduce(step_ms.to(ctx.device), dist.ReduceOp.MAX).cpu().tolist()
    loss_global = (sums.cpu() / torch.tensor(sizes, dtype=torch.float64)).tolist()
    loss_reported = loss_global if cfg.variant == "ddp" else torch.stack(reported).double().cpu().tolist()
    first = len(rec.steps)
    for i, n in enumerate(sizes):
        step = first + i
        rec.steps.append({"epoch": epoch + 1, "step": step, "loss_global": loss_global[i],
                          "loss_reported": loss_reported[i], "lr": lrs[i], "step_ms": step_ms[i]})
        if step >= cfg.warmup_steps:
            rec.timed_ms.append(step_ms[i])
            rec.timed_batches.append(n)
    bad = [r["step"] for r in rec.steps[first:] if not math.isfinite(r["loss_global"])]
    if bad:
        raise FloatingPointError(f"loss became non-finite at step {bad[0]}")
    timed = rec.timed_ms[-len(sizes):] if rec.timed_ms else []
    if timed:
        ips = sum(rec.timed_batches[-len(timed):]) / (sum(timed) / 1e3)
        log(f"epoch {epoch + 1}: {ips:.0f} images/s over its timed steps (device clock), "
            f"loss {loss_global[-1]:.4f}")


def run_process(cfg: RunConfig, out: Path) -> int:
    """Train in this process (single, dp*, or one DDP rank) and write the record."""
    rec = Record(cfg, out)
    ctx = None
    # From the environment, not the Context: a rank whose set-up fails must still know its place.
    distributed, rank = "LOCAL_RANK" in os.environ, int(os.environ.get("RANK", 0))
    with measure.WarningRecorder() as warn:
        try:
            ctx = Context(cfg)
            train(cfg, ctx, rec, warn)
            status, reason = results.STATUS_OK, ""
        except Exception as exc:   # OOM, NaN, a crashed peer: a failed record, never a missing one
            status, reason = results.STATUS_FAILED, error_text(exc)
            log(f"run failed: {reason}")
            traceback.print_exc()
            if distributed:
                (out / f"rank{rank}.error.txt").write_text(reason + "\n")
                if rank == 0:   # what this rank measured, without collectives that would hang
                    rec.warnings = warn.rows(rank)
                    rec.write(status, reason)
                # Peers are blocked in a collective that will never complete: torchrun ends
                # them once this rank exits, and the launcher completes the record.
                return 1
    if distributed:
        rec.warnings = [w for rows in ctx.gather(warn.rows(rank)) for w in rows]
        mem = ctx.gather(rec.memory)
        rec.memory = [dict(row, device=r) for r, rows in enumerate(mem) for row in rows]
    else:
        rec.warnings = warn.rows()
    if rank == 0:
        rec.write(status, reason)
    if ctx is not None:
        ctx.close()
    return 0


def error_text(exc: BaseException) -> str:
    """`Type: first line of the message`, the way a user sees it at the top of a traceback."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip()


def launch_ddp(cfg: RunConfig, out: Path) -> int:
    """Start `gpus` ranks under torchrun; write a failed record if none was written."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
           f"--nproc-per-node={cfg.gpus}", "-m", "dpbench.train",
           "--config", json.dumps(cfg.to_dict()), "--out", str(out)]
    env = dict(os.environ)
    if not uses_cuda(cfg):   # the ranks share the job's threads (Snakemake sets these to them)
        threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(max(1, threads // cfg.gpus))
    log(f"launching {cfg.gpus} DDP rank(s) under torchrun (standalone rendezvous, free port)")
    started = time.perf_counter()
    code = subprocess.run(cmd, env=env).returncode
    # Ranks that failed left a note; the first to fail is the root cause, the others its echo.
    errors = sorted(out.glob("rank*.error.txt"), key=lambda p: p.stat().st_mtime)
    reason = "; ".join(f"{p.name.split('.')[0]}: {p.read_text().strip()}" for p in errors) \
        or f"torchrun exited with code {code} before any rank wrote a record (see the run's log)"
    rec = results.read_metrics(out)
    if rec is None:
        fallback = Record(cfg, out)
        fallback.started = started
        fallback.write(results.STATUS_FAILED, reason)
    elif rec["status"] == results.STATUS_FAILED and errors:
        rec["reason"] = reason
        results.write_json(out / results.METRICS, rec)
    return 0


def run(cfg: RunConfig, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    if "LOCAL_RANK" not in os.environ:
        # A rerun starts clean: an old curve or checkpoint must not pass for this run's.
        for stale in [out / results.METRICS, out / results.STEPS, out / CHECKPOINT,
                      *out.glob("rank*.error.txt")]:
            stale.unlink(missing_ok=True)
        reason = skip_reason(cfg)
        if reason:
            log(f"skipped: {reason}")
            Record(cfg, out).write(results.STATUS_SKIPPED, reason)
            return 0
        if cfg.variant == "ddp":
            return launch_ddp(cfg, out)
    return run_process(cfg, out)


def parse_config(text: str) -> RunConfig:
    data = json.loads(text) if text.lstrip().startswith("{") else json.loads(Path(text).read_text())
    return RunConfig.from_dict(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="RunConfig as a JSON file or inline JSON")
    p.add_argument("--out", required=True, type=Path, help="the run's folder")
    p.add_argument("--lease", action="store_true",
                   help="take free GPUs from this machine's lease (the pipeline sets it)")
    p.add_argument("--exclusive", action="store_true", help="hold every GPU while this run runs")
    p.add_argument("--log", type=Path, help="send the run's output here (placement stays on stderr)")
    args = p.parse_args(argv)
    try:
        cfg = parse_config(args.config)
    except (ValueError, TypeError, OSError) as exc:
        p.error(str(exc))
    rid = results.run_id(cfg.variant, cfg.gpus, cfg.repeat, cfg.options)
    if args.log:
        _redirect_output(args.log)
    if not args.lease or cfg.device == "cpu" or not gpu_lease.pool():
        return run(cfg, args.out)
    # The lease comes before any CUDA call: CUDA reads CUDA_VISIBLE_DEVICES once, when it starts.
    with gpu_lease.lease(cfg.gpus, gpu_lease.LOCK_DIR, args.exclusive, announce=log) as ids:
        if len(ids) == cfg.gpus:
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"   # the lease numbers GPUs as NVML does
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
            print(f"dpbench: {rid} on GPU(s) {','.join(ids)}", file=sys.__stderr__, flush=True)
            log(f"placed on GPU(s) {','.join(ids)}{' (exclusive)' if args.exclusive else ''}")
        return run(cfg, args.out)


def _redirect_output(path: Path) -> None:
    """Point this process's stdout/stderr (and so torchrun's ranks') at the run's log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.__stderr__.flush()
    keep = os.dup(2)
    sys.__stderr__ = os.fdopen(keep, "w")   # placement lines still reach the pipeline's output
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
