"""Harness parity: each variant's step in dpbench against a bare loop of itself (bench.bare), timed
by CUDA events in the same process, alternating bare and dpbench (ABBA over the repeats) so that a
drift of the host or the device falls on both.

    python -m dpbench.bench.parity --out DIR [--cells a,b] [--variants ...] [--repeats 2]
    python -m dpbench.bench.parity --out DIR --tiny          # CPU, tiny sizes (the test)

One process per cell and family: single and dp in a plain process, the distributed variants in one
torchrun rank (one GPU; on the CPU, --ranks gloo ranks). Inside it, dpbench's run is what a rank
runs (`engine.run_process`, record and all) and the bare loop is bench.bare. `--launched` adds,
for the first cell, dpbench's single and ddp launched as the pipeline launches them, beside bare
loops launched the same way, to see what the launcher adds.

Rows: cell, variant, bare and dpbench step ms (median over each run's timed steps, then over the
repeats), dpbench / bare as a throughput ratio (bare ms / dpbench ms) with its range over the
repeat pairs, and whether the step was host- or device-bound (the host's time to issue one step
from an idle device against the device's step time). A benchmark: nothing here is a test's
assertion of speed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dpbench.bench import bare
from dpbench.plan.config import RunConfig
from dpbench.results.formats import HOST_BOUND_SHARE, step_bound
from dpbench.run import engine

LM = {"heads": 12, "seq_len": 1024, "vocab": 32000}
# name -> (workload, global batch, precision, channels_last)
CELLS = {
    "resnet18-fp32-512": ("resnet18-cifar10", 512, "fp32", False),
    "resnet18-bf16-256": ("resnet18-cifar10", 256, "bf16", True),
    "resnet50-224-bf16": ({"name": "torchvision", "args": {"model": "resnet50", "resolution": 224,
                                                           "num_classes": 1000}}, 128, "bf16", True),
    "lm-124m-bf16": ({"name": "transformer-lm", "args": {"width": 768, "layers": 12, **LM}}, 16, "bf16", False),
    "vit-s16-bf16": ("tools/device/outside_models.py:vit_small", 128, "bf16", False),
}
TINY_VARIANTS = ("single", "ddp", "zero1", "fsdp", "fsdp-keep", "hsdp")   # dp needs CUDA
TINY = {
    "lm-tiny": ({"name": "transformer-lm", "args": {"width": 32, "layers": 2, "heads": 2, "seq_len": 16,
                                                    "vocab": 64}}, 8, "fp32", False),
}
LOCAL = ("single", "dp")
DISTRIBUTED = ("ddp", "zero1", "fsdp", "fsdp-keep", "hsdp")
VARIANTS = LOCAL + DISTRIBUTED
RUN_TIMEOUT_S = 600


def run_config(cell: tuple, variant: str, steps: int, warmup: int, device: str, ranks: int = 1) -> dict:
    workload, batch, precision, channels_last = cell
    return {"variant": variant.removesuffix("-keep"), "gpus": ranks if variant in DISTRIBUTED else 1,
            "workload": workload, "global_batch": batch, "precision": precision,
            "channels_last": channels_last, "feed": "fixed", "dataset": "synthetic",
            "synthetic_size": batch * steps, "synthetic_test_size": batch, "eval_samples": batch,
            "epochs": 1, "max_steps": steps, "warmup_steps": warmup, "workers": 0, "momentum": 0.9,
            "lr_schedule": "constant", "lr": 0.01, "device": device, "log_every": 10_000,
            "reshard_after_forward": not variant.endswith("-keep")}


def median(values):
    return statistics.median(values) if values else None


# -- inside one process: alternate bare and dpbench -------------------------------------------

class GroupPorts:
    """A torchrun rank here opens a process group per row, one after another, each needing a store
    on a port of its own (torchrun's agent store keeps the last group's addresses, which a second
    gloo mesh would dial). Rank 0 takes a port the kernel calls free and posts it on torchrun's store,
    where every rank reads it; a guessed MASTER_PORT + k can be one the host already uses (it was:
    EADDRINUSE, and the other rank then dialled it for half an hour). Every rank also meets the
    others there before each group, so that a rank whose row failed early cannot run ahead into the
    next row's group. Each wait is bounded by `wait_s`."""

    def __init__(self, rank: int, world: int, addr: str, port: int, wait_s: float):
        self.rank, self.world, self.opened, self.wait_s = rank, world, 0, wait_s
        self.store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=wait_s))

    @classmethod
    def from_torchrun(cls, wait_s: float) -> "GroupPorts":
        env = os.environ
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"]), wait_s)

    def next_group(self) -> None:
        """Meet the other ranks, then point this process's env:// rendezvous at a fresh port."""
        self.opened += 1
        key = f"dpbench-parity/{self.opened}"
        if self.rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                self.store.set(f"{key}/port", str(s.getsockname()[1]))
        arrived, deadline = self.store.add(f"{key}/arrived", 1), time.monotonic() + self.wait_s
        while arrived < self.world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank} waited {self.wait_s:.0f} s for the other ranks before "
                                   f"process group {self.opened} ({arrived} of {self.world} arrived)")
            time.sleep(0.05)
            arrived = self.store.add(f"{key}/arrived", 0)
        port = self.store.get(f"{key}/port").decode()
        os.environ.update(MASTER_PORT=port, TORCHELASTIC_USE_AGENT_STORE="False")


def pair(cell_name: str, cell: tuple, variants: list[str], repeats: int, steps: int, warmup: int,
         device: str, out: Path, ranks: int) -> list[dict]:
    rank = int(os.environ.get("RANK", 0))
    rows = []
    ports = GroupPorts.from_torchrun(RUN_TIMEOUT_S) if "LOCAL_RANK" in os.environ else None
    for r in range(repeats):
        for variant in variants:
            cfg = RunConfig.from_dict(run_config(cell, variant, steps, warmup, device, ranks))
            for kind in (("bare", "dpbench") if r % 2 == 0 else ("dpbench", "bare")):
                t0 = time.perf_counter()
                row = {"cell": cell_name, "variant": variant, "kind": kind, "repeat": r}
                try:
                    if ports:
                        ports.next_group()
                    if reason := engine.refused(cfg):   # both loops would fail the same way
                        row.update(status="skipped", reason=reason)
                    elif kind == "bare":
                        res = bare.run(cfg)
                        timed = res.step_ms[warmup - 1:] if warmup else res.step_ms
                        row.update(status="ok", step_ms=median(timed), host_ms=res.host_ms, losses=res.losses)
                    else:
                        run_out = out / "runs" / f"{cell_name}-{variant}-r{r}"
                        run_out.mkdir(parents=True, exist_ok=True)
                        engine.run_process(cfg, run_out)
                        rec = json.loads((run_out / "metrics.json").read_text())
                        thr = rec.get("throughput") or {}
                        row.update(status=rec["status"], reason=rec.get("reason", ""), step_ms=thr.get("step_ms_p50"),
                                   host_ms=thr.get("host_step_ms"))
                except Exception as exc:   # an OOM in one cell must not lose the others
                    row.update(status="failed", reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                row["wall_s"] = round(time.perf_counter() - t0, 2)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if rank == 0:
                    print(f"parity: {json.dumps({k: v for k, v in row.items() if k != 'losses'})}", flush=True)
                rows.append(row)
    return rows


# -- the driver ----------------------------------------------------------------------------------

def _env() -> dict:
    src = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1"}


def spawn(cell_name: str, variants: list[str], args, ranks: int) -> list[dict]:
    rows_file = args.out / f"rows-{cell_name}-{variants[0]}.json"
    pair_args = ["-m", "dpbench.bench.parity", "--pair", cell_name, "--variants", ",".join(variants),
                 "--out", str(args.out), "--repeats", str(args.repeats), "--steps", str(args.steps),
                 "--warmup", str(args.warmup), "--rows", str(rows_file), "--ranks", str(ranks)]
    if args.tiny:
        pair_args.append("--tiny")
    if variants[0] in DISTRIBUTED:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               f"--nproc-per-node={ranks}", *pair_args]
    else:
        cmd = [sys.executable, *pair_args]
    try:
        subprocess.run(cmd, env=_env(), timeout=RUN_TIMEOUT_S * len(variants), check=False)
    except subprocess.TimeoutExpired:
        pass
    if not rows_file.is_file():
        return [{"cell": cell_name, "variant": v, "kind": k, "status": "failed", "repeat": 0,
                 "reason": "its process wrote no rows (see the output above)"} for v in variants for k in ("bare", "dpbench")]
    return json.loads(rows_file.read_text())


def launched(cell_name: str, cell: tuple, args) -> list[dict]:
    """dpbench's single and ddp as the pipeline launches them, beside bare loops launched as a
    user launches theirs (python, or torchrun for ddp), alternating."""
    rows = []
    for r in range(args.repeats):
        for variant in ("single", "ddp"):
            cfg = run_config(cell, variant, args.steps, args.warmup, "cpu" if args.tiny else "auto")
            for kind in (("bare", "dpbench") if r % 2 == 0 else ("dpbench", "bare")):
                run_out = args.out / "launched" / f"{cell_name}-{variant}-{kind}-r{r}"
                run_out.mkdir(parents=True, exist_ok=True)
                if kind == "dpbench":
                    cmd = [sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg),
                           "--out", str(run_out), "--log", str(run_out / "run.log")]
                else:
                    one = [*(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"] if variant == "ddp" else []),
                           "-m", "dpbench.bench.bare_main", "--config", json.dumps(cfg), "--json", str(run_out / "bare.json")]
                    cmd = [sys.executable, *one]
                t0 = time.perf_counter()
                subprocess.run(cmd, env=_env(), timeout=RUN_TIMEOUT_S, check=False, stdout=subprocess.DEVNULL)
                row = {"cell": cell_name, "variant": f"{variant} (launched)", "kind": kind, "repeat": r}
                try:
                    if kind == "dpbench":
                        rec = json.loads((run_out / "metrics.json").read_text())
                        thr = rec.get("throughput") or {}
                        row.update(status=rec["status"], step_ms=thr.get("step_ms_p50"), host_ms=thr.get("host_step_ms"))
                    else:
                        got = json.loads((run_out / "bare.json").read_text())
                        row.update(status="ok", step_ms=got["step_ms"], host_ms=got["host_ms"])
                except (OSError, ValueError, KeyError) as exc:
                    row.update(status="failed", reason=str(exc))
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                print(f"parity: {json.dumps(row)}", flush=True)
                rows.append(row)
    return rows


def table(rows: list[dict]) -> list[dict]:
    """Per cell and variant: medians over the repeats, the ratio and its range, the regime."""
    out = []
    keys = list(dict.fromkeys((r["cell"], r["variant"]) for r in rows))
    for cell, variant in keys:
        mine = [r for r in rows if (r["cell"], r["variant"]) == (cell, variant)]
        ok = lambda kind: {r["repeat"]: r for r in mine if r["kind"] == kind and r.get("status") == "ok"
                           and r.get("step_ms")}
        bare, ours = ok("bare"), ok("dpbench")
        pairs = [bare[k]["step_ms"] / ours[k]["step_ms"] for k in sorted(set(bare) & set(ours))]
        b, d = median([r["step_ms"] for r in bare.values()]), median([r["step_ms"] for r in ours.values()])
        host = median([r["host_ms"] for r in ours.values() if r.get("host_ms") is not None])
        failed = [r for r in mine if r.get("status") != "ok"]
        out.append({"cell": cell, "variant": variant, "bare_ms": b, "dpbench_ms": d,
                    "ratio": b / d if b and d else None, "ratio_low": min(pairs) if pairs else None,
                    "ratio_high": max(pairs) if pairs else None, "pairs": len(pairs), "host_ms": host,
                    "bound": step_bound(host, d),
                    "failed": "; ".join(f"{r['kind']}: {r.get('reason', '')}" for r in failed)})
    return out


def markdown(summary: list[dict], meta: dict) -> str:
    f = lambda v, spec=".2f": "" if v is None else format(v, spec)
    lines = [f"# Harness parity ({meta['device']}, torch {meta['torch']})", "",
             f"{meta['warmup']} warm-up + {meta['steps'] - meta['warmup']} timed steps a run, {meta['repeats']} "
             "repeats, bare and dpbench alternating in one process. x bare = bare ms / dpbench ms (throughput "
             "ratio; >= 0.97 is the target), range over the repeat pairs. bound: host when the host's time to "
             f"issue one step from an idle device is >= {HOST_BOUND_SHARE} x the step time.", "",
             "| cell | variant | bare ms | dpbench ms | x bare | range | host ms | bound | note |",
             "|---|---|--:|--:|--:|---|--:|---|---|"]
    for r in summary:
        rng = f"{f(r['ratio_low'], '.3f')}–{f(r['ratio_high'], '.3f')}" if r["pairs"] else ""
        lines.append(f"| {r['cell']} | {r['variant']} | {f(r['bare_ms'])} | {f(r['dpbench_ms'])} | "
                     f"{f(r['ratio'], '.3f')} | {rng} | {f(r['host_ms'])} | {r['bound'] or ''} | "
                     f"{r['failed'].replace('|', '/')[:120]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU (the test)")
    p.add_argument("--cells", help="comma-separated cells (default: all)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, help="steps a run (default 30, --tiny 6)")
    p.add_argument("--warmup", type=int, help="untimed steps a run (default 10, --tiny 3)")
    p.add_argument("--ranks", type=int, default=1, help="ranks of the distributed variants (GPU: 1)")
    p.add_argument("--launched", action="store_true", help="also the launched single/ddp check on the first cell")
    p.add_argument("--pair", help=argparse.SUPPRESS)
    p.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    table_ = TINY if args.tiny else CELLS
    args.steps = args.steps or (6 if args.tiny else 30)
    args.warmup = args.warmup if args.warmup is not None else (3 if args.tiny else 10)
    device = "cpu" if args.tiny else "auto"
    variants = [v for v in args.variants.split(",") if v and (not args.tiny or v in TINY_VARIANTS)]
    if bad := [v for v in variants if v not in VARIANTS]:
        raise SystemExit(f"parity: unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.pair:   # one process of the driver's
        rows = pair(args.pair, table_[args.pair], variants, args.repeats, args.steps, args.warmup, device,
                    args.out, args.ranks)
        if int(os.environ.get("RANK", 0)) == 0:
            args.rows.write_text(json.dumps(rows))
        return 0
    names = [c for c in (args.cells.split(",") if args.cells else table_) if c]
    if bad := [c for c in names if c not in table_]:
        raise SystemExit(f"parity: unknown cell(s) {', '.join(bad)}; choose from {', '.join(table_)}")
    t0, rows = time.perf_counter(), []
    for name in names:
        for family in (LOCAL, DISTRIBUTED):
            if chosen := [v for v in variants if v in family]:
                rows += spawn(name, chosen, args, args.ranks if family is DISTRIBUTED else 1)
    if args.launched:
        rows += launched(names[0], table_[names[0]], args)
    meta = {"device": torch.cuda.get_device_name(0) if device == "auto" and torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
            "wall_s": round(time.perf_counter() - t0, 1)}
    summary = table(rows)
    (args.out / "parity.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=1) + "\n")
    (args.out / "parity.md").write_text(markdown(summary, meta))
    print(markdown(summary, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
