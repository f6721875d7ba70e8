"""The command line of one run: where it runs, how it starts, what it cannot do here.

    python -m dpbench.run.launch --config run.json --out results/<tag>/runs/<run_id>
    python -m dpbench.run.launch --config '{"variant": "ddp", "gpus": 2}' --out /tmp/run

`--config` is a JSON file or inline JSON with `dpbench.plan.config.RunConfig` keys. This module takes
the run's GPUs (the pipeline's lease), sends its output to the run's log, records runs that
cannot run here as skipped, sets the process-wide switches that must precede CUDA
(deterministic mode), and starts the ranks of every distributed variant (ddp, zero1, fsdp,
hsdp) under torchrun (standalone
rendezvous: a free port, so two runs never collide). The training itself is `dpbench.run.engine`.

On several nodes, start it under torchrun yourself, on every node (`gpus` = the world size):

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m dpbench.run.launch --config run.json --out /shared/results/run

Whatever happens, the folder ends with metrics.json (status ok / failed / skipped, and why),
written last so a half-written run is never mistaken for a finished one.

A run does not outlive the process that started it (see `stop_with_pipeline`): its parent, the
parent's parent where the parent is a shell, and the pipeline process the environment names
(`DPBENCH_PIPELINE_PID`, which the Snakefile sets). Within seconds of losing one, the run is
stopped (torchrun and its ranks too) and leaves a failed record naming the lost process.
`DPBENCH_OUTLIVE_STARTER=1` lets a run started by hand train on (under nohup, say).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpbench import DISTRIBUTED_VARIANTS, results
from dpbench.host import gpu_lease
from dpbench.host.torch_facts import torch_version   # torch's version facts, read without importing it
from dpbench.plan.config import RunConfig
from dpbench.plan.skips import skip_reason, world_mismatch
from dpbench.results.identity import Identity
from dpbench.results.record import Record, planned_identity, record_fields, write_record
from dpbench.run import provenance, waits
from dpbench.run.faults import exit_fault
from dpbench.run.runlog import CHECKPOINT, log, mark_launch
from dpbench.run.watchdog import (OUTLIVE_ENV, STOP, Stopped, die_with_parent, forward_signals,
                                  stop_on_signals, stop_with_pipeline)

CUBLAS_WORKSPACE = ":4096:8"   # the fixed cuBLAS workspace that deterministic cuBLAS needs


def cuda_devices() -> int:
    import torch   # the launcher is torch-free (lint-imports): torch loads only where asked to count
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_gpus(planned: int | None, counted: int | None = None) -> int:
    """The CUDA devices this run may use: what torch sees (0 with a CPU-only torch on a GPU
    machine), and no more than the plan was made for, so that a run the plan counted as skipped
    (and gave no GPU) is skipped here too. `counted`: GPUs counted without asking torch (see
    `counted_lease`)."""
    if planned == 0:
        return 0
    seen = counted if counted is not None else cuda_devices()
    return seen if planned is None else min(seen, planned)


def counted_lease(cfg: RunConfig, leased: int | None) -> int | None:
    """The GPUs a distributed run's launcher counts as seen without importing torch: the lease's, with a
    CUDA build of torch. Importing torch here would cost every DDP run seconds that its ranks
    pay again; the ranks confirm the count instead (`train.unseen_lease`)."""
    if cfg.variant in DISTRIBUTED_VARIANTS and leased and torch_is_cuda_build():
        return leased
    return None


def torch_is_cuda_build() -> bool:
    return bool(torch_version()["cuda"])


def where(planned: int | None) -> str:
    """What limited the visible count, for a skip reason."""
    text = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}"
    return text if planned is None else f"{text}; the plan was made for {planned} GPU(s)"


def set_process_switches(cfg: RunConfig) -> None:
    """What must be set before CUDA starts, in every process of the run (torchrun's ranks inherit
    the environment and set it again here)."""
    if cfg.deterministic:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE


def clear_stale(out: Path) -> None:
    """A rerun starts clean: an old curve or checkpoint must not pass for this run's."""
    for stale in [out / results.METRICS, out / results.STEPS, out / CHECKPOINT,
                  *out.glob("rank*.error.txt")]:
        stale.unlink(missing_ok=True)
    waits.clear(out)


def launch_ddp(cfg: RunConfig, out: Path, visible: int, counted: int | None = None) -> int:
    """Start `gpus` ranks under torchrun; write a failed record if none was written. `counted`:
    the GPUs counted without torch, which the ranks check (None: torch counted them here)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
           f"--nproc-per-node={cfg.gpus}", "-m", "dpbench.run.launch",
           "--config", json.dumps(cfg.to_dict()), "--out", str(out)]
    env = dict(os.environ)
    env.pop(gpu_lease.LEASED_ENV, None)
    if counted:
        env[gpu_lease.LEASED_ENV] = str(counted)
    if visible == 0 or cfg.device == "cpu":   # the ranks share the job's threads
        threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(max(1, threads // cfg.gpus))
    shared = f", rehearsed on {max(1, visible)} shared GPU(s) over gloo" if cfg.rehearse and visible else ""
    log(f"launching {cfg.gpus} {cfg.variant} rank(s) under torchrun (standalone rendezvous, free port){shared}")
    started = time.perf_counter()
    # A session of its own, so that a signal to this launcher reaches every rank too.
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent)
    STOP.torchrun = proc.pid
    with forward_signals(proc):
        code = proc.wait()
    STOP.torchrun = None
    # Ranks that failed left a note; the first to fail is the root cause, the others its echo.
    errors = sorted(out.glob("rank*.error.txt"), key=lambda p: p.stat().st_mtime)
    reason = "; ".join(f"{p.name.split('.')[0]}: {p.read_text().strip()}" for p in errors) \
        or f"torchrun exited with code {code} before any rank wrote a record (see the run's log)"
    if not errors and (waited := waits.waited_text(out, cfg.collective_timeout_s)):
        reason += f"; {waited}"   # a rank aborted by its collective timeout (NCCL) names no error
    if STOP.reason:   # stopped from outside: that is why, whatever the ranks said as they went
        reason = f"{STOP.reason} (torchrun exited with code {code})"
    rec = results.read_metrics(out)
    if rec is None:   # the torch-free facts, as in a skipped record: importing torch here costs seconds
        Record(cfg, out, device_type(cfg, visible), started=started).write(
            results.STATUS_FAILED, reason, launch=provenance.launch_facts([socket.gethostname()]),
            provenance=provenance.host_facts(cfg))
    elif rec["status"] == results.STATUS_FAILED and (errors or STOP.reason):
        rec["reason"] = reason
        write_record(out, rec)
    elif rec["status"] == results.STATUS_OK and code:
        # Whole (rank 0 wrote it after every collective), but a rank ended badly after that, at
        # its teardown: the record stands, and says so where a reader of its warnings looks.
        said = f": {reason}" if errors else " (see the run's log)"
        rec.setdefault("warnings", []).append(
            {"category": "RankExit", "message": f"torchrun exited with code {code} after the record was written{said}",
             "count": 1, "first_step": None, "location": "torchrun", "rank": None})
        rec.setdefault("launch", {})["exit_code"] = code
        write_record(out, rec)
    return 0


def record_skip(cfg: RunConfig, out: Path, reason: str, planned: int | None, visible: int) -> int:
    """A skipped run's record, written without importing torch (seconds for every skipped run,
    on a host where timed runs may be running)."""
    if reason.startswith("needs"):   # too few GPUs: say what limited them
        reason += f" ({where(planned)})"
    log(f"skipped: {reason}")
    write_record(out, record_fields(
        cfg, planned_identity(cfg, out), results.STATUS_SKIPPED, reason, device_type=device_type(cfg, visible),
        launch=provenance.launch_facts([socket.gethostname()]), provenance=provenance.host_facts(cfg)))
    return 0


def record_world_mismatch(cfg: RunConfig, out: Path, reason: str) -> int:
    """Every rank sees the mismatch; each writes the same failed record (atomically), without
    importing torch and before any exits: once one rank has exited, torchrun's agents may end
    the others (the agent that held the rendezvous store ends it), so the record cannot wait
    for rank 0."""
    log(f"run failed: {reason}")
    write_record(out, record_fields(
        cfg, planned_identity(cfg, out), results.STATUS_FAILED, reason, device_type=device_type(cfg, 0 if cfg.device == "cpu" else 1),
        launch=provenance.launch_facts([socket.gethostname()]), provenance=provenance.host_facts(cfg)))
    return 1


def device_type(cfg: RunConfig, visible: int) -> str:
    """The device a record the launcher writes names: CUDA when the run had GPUs to use."""
    return "cuda" if visible and cfg.device != "cpu" else "cpu"


def place_identity(out: Path, identity: Identity | None) -> None:
    """The plan's ids of the run in its folder (identity.json), which its record copies, the
    ranks' too; a stale copy goes where this launch brought none."""
    out.mkdir(parents=True, exist_ok=True)
    if identity is None:
        (out / results.IDENTITY).unlink(missing_ok=True)
    else:
        identity.write(out)


def run(cfg: RunConfig, out: Path, planned: int | None = None, leased: int | None = None) -> int:
    """One run; `planned`: the GPUs its plan was made for (None: this machine's); `leased`: the
    GPUs the lease gave it (None: no lease)."""
    out.mkdir(parents=True, exist_ok=True)
    set_process_switches(cfg)
    if "LOCAL_RANK" in os.environ:   # one rank under torchrun
        die_with_parent()
        if reason := world_mismatch(cfg, int(os.environ.get("WORLD_SIZE", 1))):
            return record_world_mismatch(cfg, out, reason)
        return train_here(cfg, out)
    clear_stale(out)
    mark_launch()   # with its GPUs held: what follows is the run's own start-up
    if planned is not None and (reason := skip_reason(cfg, planned)):
        # the plan counted it as skipped (and gave it no GPU): no need to ask torch
        return record_skip(cfg, out, reason, planned, planned)
    counted = counted_lease(cfg, leased)
    visible = visible_gpus(planned, counted)
    if reason := skip_reason(cfg, visible):
        return record_skip(cfg, out, reason, planned, visible)
    if cfg.variant in DISTRIBUTED_VARIANTS:
        return launch_ddp(cfg, out, visible, counted)
    return train_here(cfg, out)


def train_here(cfg: RunConfig, out: Path) -> int:
    """Train in this process (a one-process variant, or a rank under torchrun)."""
    # Imported here, not at the top: the engine imports torch, which the launcher of a skipped
    # run or of torchrun's ranks never needs (seconds each); the engine never imports this module.
    from dpbench.run.engine import run_process
    return run_process(cfg, out)


def record_of_fresh_run(cfg: dict, timeout_s: float, prefix: str = "dpbench-") -> dict:
    """One run through this launcher in a fresh process (its own CUDA context and allocator),
    in a temporary folder: its record, or a failed one naming why there is none."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cmd = [sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg), "--out", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": results.STATUS_FAILED, "reason": f"timed out after {timeout_s:g} s"}
        tail = " / ".join(proc.stderr.strip().splitlines()[-2:])
        return results.read_metrics(tmp) or {"status": results.STATUS_FAILED,
                                             "reason": f"no record (exit code {proc.returncode}): {tail}"}


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
    p.add_argument("--identity", help="the run's ids as its plan decided them (JSON: run_id, cell_id, "
                   "setup_id, group; the pipeline sets it); without it, those its settings give")
    p.add_argument("--log", type=Path, help="send the run's output here (placement stays on stderr)")
    p.add_argument("--planned-gpus", type=int, metavar="N",
                   help="the GPUs the run's plan was made for (the pipeline sets it): a run the plan "
                        "counted as skipped is skipped, even where this machine has more")
    args = p.parse_args(argv)
    try:
        cfg = parse_config(args.config)
        args.identity = Identity.from_dict(json.loads(args.identity)) if args.identity else None
    except (ValueError, TypeError, KeyError, OSError) as exc:
        p.error(str(exc))
    if args.log:
        redirect_output(args.log)
    if "LOCAL_RANK" in os.environ:   # one rank under torchrun: its agent starts and stops it
        code = start(cfg, args)
        return exit_fault(int(os.environ.get("RANK", 0))) or code
    place_identity(args.out, args.identity)
    STOP.__init__()
    unwatch = None if os.environ.get(OUTLIVE_ENV) == "1" else stop_with_pipeline()
    try:
        with stop_on_signals():
            code = start(cfg, args)
    except Stopped as exc:   # where the training did not catch it (the lease's wait, the imports)
        visible = 0 if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else cfg.gpus
        args.out.mkdir(parents=True, exist_ok=True)
        Record(cfg, args.out, device_type(cfg, visible)).write(
            results.STATUS_FAILED, str(exc), launch=provenance.launch_facts([socket.gethostname()]),
            provenance=provenance.host_facts(cfg))
    finally:
        if unwatch:
            unwatch()
    # Stopped from outside: not a result the pipeline keeps (Snakemake, if alive, reruns it).
    return 1 if STOP.reason else code


def start(cfg: RunConfig, args: argparse.Namespace) -> int:
    """The run, in its GPU lease where the pipeline asks for one."""
    rid = args.identity.run_id if args.identity else args.out.name   # the run folder names the run
    planned = args.planned_gpus
    # A run its plan gave no GPU (the CPU plan, or a run it counts as skipped) takes none here either.
    no_gpu = planned is not None and (planned == 0 or skip_reason(cfg, planned) is not None)
    if planned == 0:   # the CPU plan runs on the CPU, whatever this machine has
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if not args.lease or no_gpu or cfg.device == "cpu" or not gpu_lease.pool():
        return run(cfg, args.out, planned)
    # The lease comes before any CUDA call: CUDA reads CUDA_VISIBLE_DEVICES once, when it starts.
    # Rehearsed ranks share one GPU: the lease asks for one (cfg.gpus_held).
    with gpu_lease.lease(cfg.gpus_held, gpu_lease.LOCK_DIR, args.exclusive, announce=log) as ids:
        if args.exclusive:
            os.environ[gpu_lease.EXCLUSIVE_ENV] = "1"
        try:
            if len(ids) == cfg.gpus_held:
                os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"   # the lease numbers GPUs as NVML does
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
                print(f"dpbench: {rid} on GPU(s) {','.join(ids)}", file=sys.__stderr__, flush=True)
                log(f"placed on GPU(s) {','.join(ids)}{' (exclusive)' if args.exclusive else ''}")
                return run(cfg, args.out, planned, leased=len(ids))
            return run(cfg, args.out, planned)
        finally:   # a later run in this process holds its own lease
            os.environ.pop(gpu_lease.EXCLUSIVE_ENV, None)


def redirect_output(path: Path) -> None:
    """Point this process's stdout/stderr (and so torchrun's ranks') at the run's log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_APPEND: every write lands whole at the end, whoever writes (the launcher, torchrun, ranks)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    sys.__stderr__.flush()
    keep = os.dup(2)
    sys.__stderr__ = os.fdopen(keep, "w")   # placement lines still reach the pipeline's output
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
