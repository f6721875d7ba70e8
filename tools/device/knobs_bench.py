#!/usr/bin/env python3
"""Each knob's cost and memory effect at one rank (issue 40's one-H200 benchmark), every run a
real dpbench run whose record carries its mechanism verdicts: gradient accumulation (k = 4, the
same global batch), the planted no-op deferral (DPBENCH_PLANT=accumulate-noop, which the check
must catch), activation checkpointing of the shard units, FSDP2's CPU offload, and torch.compile
(DDP's compiled path; fsdp's per-unit compile before fully_shard), on ResNet18-CIFAR (ddp) and
the transformer LM at ~124M and ~1B (fsdp, with a ddp accumulation pair on 124M).

    tools/device/knobs_bench.sh                                          # the H200 call ($OUT)
    python3 tools/device/knobs_bench.py --tiny --out DIR --runs-dir DIR2  # CPU (the test)

Time on one H200: ~12-20 s of start-up a run (dpbench.bench.workloads.STARTUP_S), 12 steps each; runs go
in priority order (the plant and the accumulation pairs first); a run starts only where it can
end within --budget-s (430 s; a guess of 40 s a run, 90 s for the 1B LM or a compile) and is
killed after 150 s, so the whole stays under 8 minutes; those left are listed as not run.

Writes DIR/knobs_bench.json, .md, .png and runs.tar.gz (the runs' records and logs); prints the
table last: per run, samples/s and the ratio to its cell's run without the knob, rank 0's memory
components and the profiled step's peaks, compile time, and each mechanism verdict.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sharding_bench import launch_record  # noqa: E402  (a dpbench run as the pipeline launches it)
from dpbench.bench.workloads import CELLS, TINY, run_config  # noqa: E402  (the same run settings)

GPU_CELLS = {"resnet18": ("resnet18-cifar10", 256, False), "lm-124m": CELLS["lm-125m"], "lm-1b": CELLS["lm-1b"]}
TINY_CELLS = {"resnet18": TINY["resnet18"], "lm-124m": TINY["lm"], "lm-1b": TINY["lm"]}
ACC = 4
# (cell, variant, knob label, options, planted), in the order they run
PLAN = [
    ("resnet18", "ddp", "base", {}, ""),
    ("resnet18", "ddp", "accumulate", {"accumulate": ACC}, ""),
    ("resnet18", "ddp", "accumulate-noop", {"accumulate": ACC}, "accumulate-noop"),
    ("lm-124m", "fsdp", "base", {}, ""),
    ("lm-124m", "fsdp", "accumulate", {"accumulate": ACC}, ""),
    ("lm-124m", "fsdp", "checkpoint", {"checkpoint": "units"}, ""),
    ("lm-124m", "fsdp", "offload", {"offload": True}, ""),
    ("lm-124m", "ddp", "base", {}, ""),
    ("lm-124m", "ddp", "accumulate-noop", {"accumulate": ACC}, "accumulate-noop"),
    ("lm-1b", "fsdp", "base", {}, ""),
    ("lm-1b", "fsdp", "checkpoint", {"checkpoint": "units"}, ""),
    ("lm-1b", "fsdp", "offload", {"offload": True}, ""),
    ("resnet18", "ddp", "checkpoint", {"checkpoint": "units"}, ""),
    ("resnet18", "ddp", "compile", {"compile": "default"}, ""),
    ("lm-124m", "fsdp", "compile", {"compile": "default"}, ""),
    ("lm-1b", "fsdp", "accumulate", {"accumulate": ACC}, ""),
]
COMPONENTS = ("parameters_mib", "gradients_mib", "optimizer_mib", "activation_peak_mib", "reserved_peak_mib")
RUN_TIMEOUT_S = 150


def row_of(cell: str, variant: str, knob: str, rec: dict, base: dict | None) -> dict:
    thr = rec.get("throughput") or {}
    sps = thr.get("samples_per_s")
    ref = ((base or {}).get("throughput") or {}).get("samples_per_s")
    comps = (rec.get("memory_components") or [{}])[0]
    base_act = ((base or {}).get("memory_components") or [{}])[0].get("activation_peak_mib")
    act = comps.get("activation_peak_mib")
    return {"activation_vs_base": act / base_act if act and base_act else None, "cell": cell, "variant": variant, "knob": knob, "status": rec["status"],
            "reason": (rec.get("reason") or "")[:300], "samples_per_s": sps,
            "ratio_to_base": sps / ref if sps and ref else None, "step_ms_p50": thr.get("step_ms_p50"),
            "compile_s": thr.get("compile_s"), **{k: comps.get(k) for k in COMPONENTS},
            "mechanisms": rec.get("mechanisms") or [], "collectives": rec.get("collectives") or []}


def fmt(v, spec="{:.1f}") -> str:
    return "" if v is None else spec.format(v)


def verdict_words(row: dict) -> str:
    words = {True: "held", False: "FAILED", None: "not counted"}
    return "; ".join(f"{m['knob']}.{m['check']} {words[m['held']]} ({m['text']})" for m in row["mechanisms"])


def markdown(rows: list[dict], left: list[str], wall_s: float) -> str:
    head = ["cell", "variant", "knob", "status", "samples/s", "vs base", "step ms", "params MiB", "grads MiB",
            "optim MiB", "act. peak MiB", "reserved MiB", "act. vs base", "compile s", "mechanisms"]
    out = [f"# Knobs at one rank ({wall_s:.0f} s)", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["cell"], r["variant"], r["knob"], r["status"], fmt(r["samples_per_s"], "{:.0f}"),
                 fmt(r["ratio_to_base"], "{:.2f}"), fmt(r["step_ms_p50"]),
                 *[fmt(r[k]) for k in COMPONENTS], fmt(r["activation_vs_base"], "{:.2f}"), fmt(r["compile_s"]),
                 verdict_words(r) or (r["reason"] if r["status"] != "ok" else "")]
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    if left:
        out += ["", "Not run (budget spent): " + ", ".join(left)]
    return "\n".join(out) + "\n"


def figure(rows: list[dict], path: Path) -> None:
    """Throughput against the cell's base run, and the memory components, per run."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return
    labels = [f"{r['cell']}\n{r['variant']} {r['knob']}" for r in ok]
    fig, (a, b) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(ok)), 8), constrained_layout=True)
    a.bar(range(len(ok)), [r["ratio_to_base"] or 0 for r in ok], color="#4c72b0")
    a.axhline(1.0, color="k", lw=0.8)
    a.set_ylabel("samples/s vs the cell's base run")
    for i, (key, colour) in enumerate(zip(COMPONENTS[:4], ("#4c72b0", "#dd8452", "#55a868", "#c44e52"))):
        b.bar([x + (i - 1.5) * 0.2 for x in range(len(ok))], [r[key] or 0.0 for r in ok], width=0.2,
              color=colour, label=key.removesuffix("_mib"))
    b.set_yscale("log")   # ResNet18's MiB beside the 1B LM's GiB
    b.set_ylabel("MiB on rank 0 (profiled step; offload's\nparameters and optimizer state are on the host)")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.set_xticks(range(len(ok)), labels, fontsize=7, rotation=60, ha="right")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs-dir", type=Path, default=None, help="where the runs' folders go (default: OUT/runs)")
    ap.add_argument("--tiny", action="store_true", help="tiny cells on the CPU (the test)")
    ap.add_argument("--budget-s", type=float, default=430.0)
    ap.add_argument("--only", default="", help="comma-separated cells or runs (cell-variant-knob) to keep (default: all)")
    args = ap.parse_args(argv)
    cells, device = (TINY_CELLS, "cpu") if args.tiny else (GPU_CELLS, "cuda")
    warmup, timed = (2, 2) if args.tiny else (5, 7)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.runs_dir or args.out / "runs"
    keep = set(filter(None, args.only.split(",")))
    started, rows, left, bases = time.time(), [], [], {}
    for cell, variant, knob, options, plant in PLAN:
        name = f"{cell}-{variant}-{knob}"
        if keep and cell not in keep and name not in keep:
            continue
        # a run starts only where it can end within the budget (a 1B run or a compile: longer)
        guess_s = 0 if args.tiny else 90 if cell == "lm-1b" or knob == "compile" else 40
        if time.time() - started + guess_s > args.budget_s:
            left.append(name)
            continue
        workload, batch, channels_last = cells[cell]
        cfg = {**run_config(workload, batch, channels_last, "fp32", variant, warmup, timed, device), **options}
        if plant:
            os.environ["DPBENCH_PLANT"] = plant
        try:
            rec = launch_record(cfg, runs / name, RUN_TIMEOUT_S)
        finally:
            os.environ.pop("DPBENCH_PLANT", None)
        if knob == "base":
            bases[(cell, variant)] = rec
        row = row_of(cell, variant, knob, rec, bases.get((cell, variant)))
        rows.append(row)
        print(f"{name}: {row['status']} {fmt(row['samples_per_s'], '{:.0f}')} samples/s "
              f"{verdict_words(row) or row['reason']}", flush=True)
    wall = time.time() - started
    (args.out / "knobs_bench.json").write_text(json.dumps({"rows": rows, "not_run": left, "wall_s": wall}, indent=1))
    md = markdown(rows, left, wall)
    (args.out / "knobs_bench.md").write_text(md)
    figure(rows, args.out / "knobs_bench.png")
    if args.runs_dir is not None:
        with tarfile.open(args.out / "runs.tar.gz", "w:gz") as tar:
            tar.add(runs, arcname="runs")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
