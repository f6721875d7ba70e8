#!/usr/bin/env python3
"""The sharded variants' own cost on one GPU (issue 26's one-H200 benchmark): single, ddp, zero1
and fsdp (reshard_after_forward true and false) at one rank, each a real dpbench run, on
ResNet18-CIFAR (synthetic, global batch 256, fp32) and the transformer LM at three sizes; plus
bf16 fsdp runs under a hard timeout, ResNet18 (BatchNorm: dpbench keeps each norm an fp32 unit)
and the 125M LM (no BatchNorm): does "FSDP2 with a bf16 MixedPrecisionPolicy hangs" reproduce
on one GPU?

    python3 tools/device/sharding_bench.py --out $OUT --runs-dir /tmp/sharding   # the H200 call
    python3 tools/device/sharding_bench.py --tiny --cells lm --out DIR              # CPU (the test)

Time on one H200, from the start-ups seen there (dpbench.bench.workloads.STARTUP_S: ~12 s a single run,
~20 s a torchrun one) and 20 steps a run: 4 cells x (12 + 4 x 20 s) + two bf16 probes (20 s
each, 120 s if one hangs) + ~40 s of steps = 7-8 min; no run starts after --budget-s (420 s).

Prints, per run: samples/s, the ratio to single, rank 0's memory components (parameters,
gradients, optimizer state, largest unit) beside the allocator's peaks in the profiled step
(forward, backward, step, activations, reserved), and each collective of that step. Writes
DIR/sharding_bench.json, DIR/sharding_bench.md and, where the runs' folders lie elsewhere
(--runs-dir), DIR/runs.tar.gz of their records and logs (few files come back from the device).
Runs stop being started once the budget is spent; those are listed as not run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "src"))
from dpbench.bench.workloads import CELLS, LM, TINY, run_config  # noqa: E402  (the same run settings)

VARIANTS = {"single": {}, "ddp": {}, "zero1": {}, "fsdp": {"reshard_after_forward": True},
            "fsdp-keep": {"reshard_after_forward": False}}
GPU_CELLS = {
    "resnet18": ("resnet18-cifar10", 256, False),
    "lm-12m": ({"name": "transformer-lm", "args": {"width": 256, "layers": 4, **LM, "heads": 4}}, 16, False),
    "lm-125m": CELLS["lm-125m"],
    "lm-350m": CELLS["lm-350m"],
}
TINY_CELLS = {"resnet18": TINY["resnet18"], "lm": TINY["lm"]}
BF16_PROBE_TIMEOUT_S = 120   # a hang dpbench did not end itself ends here (its stall guard: 80 s)
RUN_TIMEOUT_S = 240


def launch_record(cfg: dict, out: Path, timeout_s: float) -> dict:
    """A dpbench run as the pipeline launches it; its metrics.json, or a failed stand-in."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "dpbench.run.launch", "--config", json.dumps(cfg), "--out", str(out),
           "--log", str(out / "run.log")]
    try:   # a session of its own, so that a timeout ends torchrun's ranks too
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        return {"status": "failed", "reason": f"killed: no record after {timeout_s:g} s (see {out / 'run.log'})"}
    metrics = out / "metrics.json"
    if not metrics.is_file():
        return {"status": "failed", "reason": f"no {metrics} (see {out / 'run.log'})"}
    return json.loads(metrics.read_text())


def row_of(cell: str, variant: str, rec: dict, single: dict | None) -> dict:
    thr = rec.get("throughput") or {}
    sps = thr.get("samples_per_s")
    base = ((single or {}).get("throughput") or {}).get("samples_per_s")
    comps = (rec.get("memory_components") or [{}])[0]
    return {"cell": cell, "variant": variant, "status": rec["status"], "reason": rec.get("reason", "")[:300],
            "parameters": rec.get("parameters"), "samples_per_s": sps,
            "ratio_to_single": sps / base if sps and base else None,
            **{k: comps.get(k) for k in ("parameters_mib", "gradients_mib", "optimizer_mib", "largest_unit_mib",
                                         "forward_peak_mib", "backward_peak_mib", "step_peak_mib",
                                         "activation_peak_mib", "reserved_peak_mib")},
            "collectives": rec.get("collectives") or []}


def markdown(rows: list[dict]) -> str:
    def num(v, fmt=".0f"):
        return "-" if v is None else format(v, fmt)
    lines = ["| cell | variant | status | samples/s | x single | params | grads | optim | unit | "
             "fwd peak | bwd peak | step peak | act peak | reserved | collectives (count, MiB) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        coll = ", ".join(f"{c['collective']} {c['count']} {c['bytes'] / 2 ** 20:.1f}" for c in r["collectives"])
        lines.append(" | ".join([f"| {r['cell']}", r["variant"], r["status"], num(r["samples_per_s"]),
                                 num(r["ratio_to_single"], ".3f"),
                                 *(num(r[k], ".1f") for k in ("parameters_mib", "gradients_mib", "optimizer_mib",
                                                              "largest_unit_mib", "forward_peak_mib",
                                                              "backward_peak_mib", "step_peak_mib",
                                                              "activation_peak_mib", "reserved_peak_mib")),
                                 coll or "-"]) + " |")
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"\n{r['cell']} {r['variant']}: {r['status']}: {r['reason']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="CPU, tiny sizes, a few steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timed", type=int, default=15)
    p.add_argument("--budget-s", type=float, default=420, help="start no run after this many seconds")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--cells", help="comma-separated cells (default: all)")
    p.add_argument("--runs-dir", type=Path, help="where the runs' folders go (default: OUT/runs)")
    args = p.parse_args(argv)
    cells = TINY_CELLS if args.tiny else GPU_CELLS
    if args.cells:
        cells = {c: cells[c] for c in args.cells.split(",")}
    runs = args.runs_dir or args.out / "runs"
    device = "cpu" if args.tiny else "cuda"
    warmup, timed = (2, 2) if args.tiny else (args.warmup, args.timed)
    variants = args.variants.split(",")
    plan = [(c, v, "fp32") for c in cells for v in variants]
    probes = [(c, "fsdp", "bf16") for c in cells if c in ("resnet18", "lm-125m", "lm")]
    plan[len(variants):len(variants)] = probes
    started, rows = time.perf_counter(), []
    for cell, variant, precision in plan:
        name = f"{cell}-{variant}" + ("-bf16" if precision == "bf16" else "")
        if time.perf_counter() - started > args.budget_s:
            rows.append({**row_of(cell, variant, {"status": "not run", "reason": "budget spent"}, None),
                         "variant": name.removeprefix(f"{cell}-")})
            continue
        workload, batch, channels_last = cells[cell]
        cfg = run_config(workload, batch, channels_last, precision, variant.split("-")[0], warmup, timed, device)
        cfg.update(VARIANTS[variant], eval_samples=min(batch, 64))
        bf16 = precision == "bf16"
        if bf16:   # a hang must end: every collective wait bounded, the run killed at the latest here
            cfg["collective_timeout_s"] = 40   # the stall guard: 80 s
        t0 = time.perf_counter()
        rec = launch_record(cfg, runs / name, BF16_PROBE_TIMEOUT_S if bf16 else RUN_TIMEOUT_S)
        # like with like: single of the same cell and precision (no bf16 single here: no ratio)
        single = next((r.get("record") for r in rows if r["cell"] == cell and r["variant"] == "single"
                       and ((r.get("record") or {}).get("config") or {}).get("precision", "fp32") == precision), None)
        rows.append({**row_of(cell, name.removeprefix(f"{cell}-"), rec, single), "record": rec,
                     "wall_s": time.perf_counter() - t0})
        print(f"{name}: {rec['status']} in {rows[-1]['wall_s']:.0f} s {rec.get('reason', '')[:200]}", flush=True)
    table = markdown(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.runs_dir:
        with tarfile.open(args.out / "runs.tar.gz", "w:gz") as tar:
            for path in sorted(runs.glob("*/*")):
                if path.name in ("metrics.json", "run.log", "steps.csv"):
                    tar.add(path, arcname=str(path.relative_to(runs)))
    (args.out / "sharding_bench.md").write_text(table)
    (args.out / "sharding_bench.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "record"}
                                                               for r in rows], indent=1))
    print(table)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
