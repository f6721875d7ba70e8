"""Each built-in workload on one GPU: dpbench's `single` and one-rank `ddp` beside a bare loop of
the same model (issue 25's benchmark).

    python3 -m dpbench.bench.workloads --out DIR [--warmup 10] [--timed 30]
        [--cells resnet18,lm-125m] [--precisions fp32,bf16] [--variants bare,single,ddp]
    python3 -m dpbench.bench.workloads --tiny --out DIR   # CPU, tiny sizes, a few steps (the test)

Per cell (workload at a size and batch) and precision (fp32 with TF32 as the engine's default,
or bf16 autocast):

- bare: the model from the workload's factory (spec.build), one fixed batch already on the
  device, SGD with momentum 0.9 and the runs' weight decay, forward + spec.loss's mean +
  backward + step, the engine's numerics switches (set_numerics); timed with CUDA events over
  the timed steps, the warm-up left out. Runs in this process.
- single, ddp: dpbench's own runs of the same workload with `feed: fixed` (one batch reused:
  the compute-only ceiling), launched as the pipeline launches them
  (`python -m dpbench.run.launch --config JSON --out DIR`); ddp on one rank (NCCL, or gloo on
  the CPU). Read from their metrics.json.

Rows: workload, parameters, precision, variant, samples/s, tokens/s, ratio to the bare loop,
peak allocated MiB, and for bf16 the MFU = flops_per_sample x samples/s over the H200's dense
bf16 peak (989 TFLOP/s) and over the ~790 TFLOP/s a bare bf16 matmul reached on it. Written as
DIR/workload_bench.json and DIR/workload_bench.md; a time estimate is printed first.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from dpbench.plan.config import RunConfig
from dpbench.run.engine import build_workload, set_numerics
from dpbench.workloads.calls import map_tensors, model_output
from dpbench.workloads.transformer_lm import flops_per_sample

SRC = Path(__file__).resolve().parents[2]   # the directory dpbench is imported from

H200_BF16_PEAK = 989e12        # dense bf16, NVIDIA's H200 SXM figure
H200_BF16_MATMUL = 790e12      # what a bare bf16 matmul reached on the H200 (the attainable ceiling)
PRECISIONS = ("fp32", "bf16")
VARIANTS = ("bare", "single", "ddp")
RUN_TIMEOUT_S = 600            # one launched run; a hung one is recorded as failed, not waited on

LM = {"heads": 12, "seq_len": 1024, "vocab": 32000}
# name -> (workload, global batch, channels_last)
CELLS = {
    "resnet18": ("resnet18-cifar10", 512, False),
    "resnet50-224": ({"name": "torchvision", "args": {"model": "resnet50", "resolution": 224,
                                                      "num_classes": 1000}}, 128, True),
    "lm-125m": ({"name": "transformer-lm", "args": {"width": 768, "layers": 12, **LM}}, 16, False),
    "lm-350m": ({"name": "transformer-lm", "args": {"width": 1024, "layers": 24, **LM, "heads": 16}}, 8, False),
    "lm-1b": ({"name": "transformer-lm", "args": {"width": 2048, "layers": 20, **LM, "heads": 16}}, 8, False),
}
DEFAULT_CELLS = ("resnet18", "resnet50-224", "lm-125m", "lm-350m")   # lm-1b: ask with --cells
TINY = {
    "resnet18": ("resnet18-cifar10", 8, False),
    "resnet18-32": ({"name": "torchvision", "args": {"model": "resnet18", "resolution": 32,
                                                     "num_classes": 10}}, 4, True),
    "lm": ({"name": "transformer-lm", "args": {"width": 32, "layers": 2, "heads": 2, "seq_len": 16,
                                               "vocab": 64}}, 4, False),
}
# A rough guess for the estimate: a launched run's start-up (imports, torchrun, model, data) and
# a step's seconds at this share of the bf16 peak (fp32/TF32 at a third of it).
STARTUP_S = {"bare": 2.0, "single": 12.0, "ddp": 20.0}
ASSUMED_MFU = 0.35


def run_config(workload, batch: int, channels_last: bool, precision: str, variant: str,
               warmup: int, timed: int, device: str) -> dict:
    """The RunConfig keys of a launched run (and the bare loop's numerics and optimizer)."""
    steps = warmup + timed
    return {"variant": variant, "gpus": 1, "workload": workload, "global_batch": batch,
            "channels_last": channels_last, "precision": precision, "feed": "fixed",
            "dataset": "synthetic", "synthetic_size": batch * steps, "synthetic_test_size": batch,
            "eval_samples": batch, "epochs": 1, "max_steps": steps, "warmup_steps": warmup,
            "workers": 0, "momentum": 0.9, "lr_schedule": "constant", "lr": 0.01, "device": device}


def bare_loop(cfg: dict) -> dict:
    """The same model, batch and optimizer as the run, with nothing of dpbench's loop around it."""
    rc = RunConfig.from_dict({k: v for k, v in cfg.items() if k != "options"})
    set_numerics(rc)
    spec = build_workload(rc)
    flops = spec.flops()   # on the CPU, before the model moves
    cuda = rc.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = spec.model.to(device)
    if rc.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    x, y = spec.batch(torch.Generator().manual_seed(rc.seed), rc.global_batch)
    x, y = map_tensors(x, lambda t: t.to(device)), y.to(device)
    if rc.channels_last:
        x = map_tensors(x, lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
    opt = torch.optim.SGD(model.parameters(), lr=rc.lr, momentum=rc.momentum, weight_decay=rc.weight_decay)
    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if rc.precision == "bf16"
                else nullcontext)

    def step():
        with autocast():
            loss = spec.loss(model_output(model, x, spec.output).float(), y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(rc.warmup_steps):
        step()
    timed = rc.max_steps - rc.warmup_steps
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(timed):
            step()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        peak = torch.cuda.max_memory_allocated() / 2 ** 20
    else:
        t0 = time.perf_counter()
        for _ in range(timed):
            step()
        seconds, peak = time.perf_counter() - t0, None
    row = {"status": "ok", "reason": "", "parameters": spec.parameters, "flops_per_sample": flops,
           "sample_unit": spec.sample_unit, "units_per_sample": spec.units_per_sample,
           "samples_per_s": rc.global_batch * timed / seconds, "timed_steps": timed,
           "peak_allocated_mib": peak, "device_type": device.type}
    return row   # the model, batch and optimizer go with this frame (the caller empties the cache)


def launched(cfg: dict, out: Path) -> dict:
    """A dpbench run as the pipeline launches it, read from its metrics.json."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg), "--out", str(out),
           "--log", str(out / "run.log")]
    try:
        subprocess.run(cmd, env=env, timeout=RUN_TIMEOUT_S, check=False, stdout=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"no record after {RUN_TIMEOUT_S} s (see {out / 'run.log'})"}
    metrics = out / "metrics.json"
    if not metrics.is_file():
        return {"status": "failed", "reason": f"the launcher wrote no {metrics} (see {out / 'run.log'})"}
    rec = json.loads(metrics.read_text())
    thr = rec.get("throughput") or {}
    allocated = [m["allocated_mib"] for m in rec.get("memory", []) if m.get("allocated_mib") is not None]
    return {"status": rec["status"], "reason": rec.get("reason", ""), "parameters": rec.get("parameters"),
            "flops_per_sample": rec.get("flops_per_sample"), "sample_unit": rec.get("sample_unit"),
            "samples_per_s": thr.get("samples_per_s"), "timed_steps": thr.get("timed_steps"),
            "peak_allocated_mib": max(allocated) if allocated else None, "device_type": rec.get("device_type")}


def finish(row: dict, bare: dict | None, precision: str, batch: int) -> dict:
    """Add tokens/s, the ratio to the bare loop and, for bf16, the MFU columns."""
    sps, flops = row.get("samples_per_s"), row.get("flops_per_sample") or (bare or {}).get("flops_per_sample")
    units = (bare or {}).get("units_per_sample") or row.get("units_per_sample") or 1
    unit = row.get("sample_unit") or (bare or {}).get("sample_unit")
    row["flops_per_sample"] = flops
    row["tokens_per_s"] = sps * units if sps is not None and unit == "tokens" else None
    bare_sps = (bare or {}).get("samples_per_s")
    row["ratio_to_bare"] = sps / bare_sps if sps is not None and bare_sps else None
    achieved = flops * sps if precision == "bf16" and sps is not None and flops else None
    row["mfu_vs_peak"] = achieved / H200_BF16_PEAK if achieved is not None else None
    row["mfu_vs_matmul"] = achieved / H200_BF16_MATMUL if achieved is not None else None
    row["global_batch"] = batch
    return row


def estimate_s(cells: dict, precisions, variants, warmup: int, timed: int) -> float:
    """A rough wall time: each launched run's start-up plus its steps at ASSUMED_MFU."""
    guess = {"resnet18-cifar10": 1.7e9, "resnet50": 12.3e9}   # forward+backward FLOPs per image
    total = 0.0
    for workload, batch, _ in cells.values():
        if isinstance(workload, dict) and workload["name"] == "transformer-lm":
            a = workload["args"]
            flops = flops_per_sample(a["width"], a["layers"], a["seq_len"], a["vocab"])
        else:
            flops = guess["resnet18-cifar10"] if workload == "resnet18-cifar10" else guess["resnet50"]
        for precision in precisions:
            rate = H200_BF16_PEAK * ASSUMED_MFU / (1 if precision == "bf16" else 3)
            for variant in variants:
                total += STARTUP_S[variant] + (warmup + timed) * batch * flops / rate
    return total


def markdown(rows: list[dict], meta: dict) -> str:
    def num(v, fmt):
        return "" if v is None else format(v, fmt)
    lines = [f"# Workload benchmark ({meta['device']}, torch {meta['torch']})", "",
             f"{meta['warmup']} warm-up + {meta['timed']} timed steps per cell; single and ddp (one rank) "
             "with feed: fixed, launched through dpbench.run.launch; bare: the same model, batch and SGD "
             "with nothing around them. MFU (bf16): model FLOPs x samples/s over the H200's 989 TFLOP/s "
             "dense bf16 peak, and over the ~790 TFLOP/s a bare matmul reached.", "",
             "| workload | parameters | precision | variant | batch | samples/s | tokens/s | x bare | "
             "peak alloc MiB | MFU (989T) | MFU (790T) | status |",
             "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        n = r.get("parameters")
        params = "" if not n else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"
        status = r["status"] + (f": {r['reason']}" if r.get("reason") else "")
        lines.append(f"| {r['cell']} | {params} | {r['precision']} | {r['variant']} | {r['global_batch']} | "
                     f"{num(r.get('samples_per_s'), '.1f')} | {num(r.get('tokens_per_s'), '.0f')} | "
                     f"{num(r.get('ratio_to_bare'), '.3f')} | {num(r.get('peak_allocated_mib'), '.0f')} | "
                     f"{num(r.get('mfu_vs_peak'), '.3f')} | {num(r.get('mfu_vs_matmul'), '.3f')} | "
                     f"{status.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def parse_list(text: str, allowed, what: str) -> list[str]:
    items = [s for s in text.split(",") if s]
    if bad := [s for s in items if s not in allowed]:
        raise SystemExit(f"workload_bench: unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for workload_bench.json/.md and the runs")
    p.add_argument("--tiny", action="store_true", help="tiny sizes on the CPU, a few steps (the test)")
    p.add_argument("--cells", help="comma-separated cells (default: all of the size set but lm-1b)")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--warmup", type=int, help="warm-up steps (default 10, --tiny 1)")
    p.add_argument("--timed", type=int, help="timed steps (default 30, --tiny 2)")
    args = p.parse_args(argv)
    table = TINY if args.tiny else CELLS
    names = parse_list(args.cells, table, "cell") if args.cells else list(TINY if args.tiny else DEFAULT_CELLS)
    precisions = parse_list(args.precisions, PRECISIONS, "precision")
    variants = parse_list(args.variants, VARIANTS, "variant")
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 10)
    timed = args.timed if args.timed is not None else (2 if args.tiny else 30)
    if warmup < 0 or timed < 1:
        raise SystemExit("workload_bench: --warmup must be >= 0 and --timed >= 1")
    device = "cpu" if args.tiny else "auto"
    cells = {n: table[n] for n in names}
    if not args.tiny:
        print(f"workload_bench: {len(cells)} cell(s) x {len(precisions)} precision(s) x {len(variants)} "
              f"variant(s), {warmup}+{timed} steps each: about {estimate_s(cells, precisions, variants, warmup, timed) / 60:.1f} "
              "min (a guess: launched runs' start-up + steps at 35% of the bf16 peak)", flush=True)

    meta = {"device": torch.cuda.get_device_name(0) if device == "auto" and torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "warmup": warmup, "timed": timed, "tiny": args.tiny,
            "peak_bf16_flops": H200_BF16_PEAK, "matmul_bf16_flops": H200_BF16_MATMUL}
    args.out.mkdir(parents=True, exist_ok=True)
    rows, t0 = [], time.perf_counter()
    for name, (workload, batch, channels_last) in cells.items():
        for precision in precisions:
            bare = None
            for variant in variants:
                cfg = run_config(workload, batch, channels_last, precision,
                                 "single" if variant == "bare" else variant, warmup, timed, device)
                started = time.perf_counter()
                if variant == "bare":
                    try:
                        row = bare = bare_loop(cfg)
                    except Exception as exc:   # an OOM at one size must not lose the others
                        row = {"status": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                    if torch.cuda.is_available():   # leave the launched runs the memory
                        torch.cuda.empty_cache()
                else:
                    row = launched(cfg, args.out / "runs" / f"{name}-{precision}-{variant}")
                row = finish({"cell": name, "workload": workload, "precision": precision, "variant": variant,
                              **row}, bare, precision, batch)
                row["wall_s"] = round(time.perf_counter() - started, 1)
                rows.append(row)
                print(f"workload_bench: {name} {precision} {variant}: {row['status']} "
                      f"{row.get('samples_per_s') or 0:.1f} samples/s, x bare {row.get('ratio_to_bare') or 0:.3f} "
                      f"({row['wall_s']} s; {time.perf_counter() - t0:.0f} s so far)", flush=True)
    (args.out / "workload_bench.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    (args.out / "workload_bench.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
