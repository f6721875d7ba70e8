#!/usr/bin/env python3
"""The performance targets, read off the perf experiment's results (a benchmark, not a test:
it prints and never fails).

    python3 tools/device/perf_targets.py [results/perf-torch-<version>] [--md FILE] [--json FILE]

Every ratio compares runs of one result set, so they were measured together on one machine.
A cell is found by its run's settings (its metrics.json config; without one, the experiment's
`train` block and the run's options), and a cell of several repeats counts with its median.
Also printed: the bucket-size sweep, the fastest recipes, and for every run how far images/s
is from what its median step time implies (a gap means untimed work crept into the timed
steps, or a few slow steps: both worth a look).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

EPOCH_IMAGES = 50000   # CIFAR-10's training split: epoch time = 50000 / images per second

# The layouts the targets speak of (everything else at the experiment's settings: gpu feed,
# no compile, cudnn.benchmark off).
FP32 = {"precision": "fp32", "channels_last": False}
FP32_CL = {"precision": "fp32", "channels_last": True}
BF16_CL = {"precision": "bf16", "channels_last": True}
EAGER = {"feed": "gpu", "compile": "none", "cudnn_benchmark": False}


def single(layout: dict, batch: int, **extra) -> dict:
    return {"variant": "single", "gpus": 1, "global_batch": batch, **layout, **EAGER, **extra}


def ddp2(layout: dict, scaling: str, batch: int, **extra) -> dict:
    sel = {"variant": "ddp", "gpus": 2, **layout, **EAGER, **extra}
    return {**sel, "per_gpu_batch": batch} if scaling == "weak" else {**sel, "per_gpu_batch": None,
                                                                         "global_batch": batch}


# (name, kind, numerator cell, denominator cell or None, factor, target)
#   ratio:      numerator images/s >= target x factor x denominator images/s
#   epoch:      50000 / numerator images/s <= target seconds
TARGETS = [
    ("ddp fp32, 2 GPUs, strong (global 512) vs 2 x single at 256", "ratio",
     ddp2(FP32, "strong", 512), single(FP32, 256), 2, 0.97),
    ("ddp fp32, 2 GPUs, weak (512 per GPU) vs 2 x single at 512", "ratio",
     ddp2(FP32, "weak", 512), single(FP32, 512), 2, 0.98),
    ("ddp bf16 + channels_last, 2 GPUs, weak vs 2 x single", "ratio",
     ddp2(BF16_CL, "weak", 512), single(BF16_CL, 512), 2, 0.90),
    ("single fp32 + channels_last epoch (s)", "epoch", single(FP32_CL, 512), None, 1, 1.4),
    ("single fp32 + channels_last vs the same loop fed one fixed batch", "ratio",
     single(FP32_CL, 512), single(FP32_CL, 512, feed="fixed"), 1, 0.97),
    ("single bf16 + channels_last epoch (s)", "epoch", single(BF16_CL, 512), None, 1, 0.80),
    ("single bf16 + channels_last vs the same loop fed one fixed batch", "ratio",
     single(BF16_CL, 512), single(BF16_CL, 512, feed="fixed"), 1, 0.97),
    ("ddp fp32 + channels_last, 2 GPUs, weak vs 2 x single in that layout", "ratio",
     ddp2(FP32_CL, "weak", 512), single(FP32_CL, 512), 2, 0.95),
]

KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers")


# -- reading the result set ----------------------------------------------------------------------

def find_result_set(given: str | None) -> Path:
    if given:
        path = Path(given)
        return path.parent if path.name == "summary.csv" else path
    found = sorted((ROOT / "results").glob("perf-*/summary.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit("no results/perf-*/summary.csv: run the perf experiment first "
                 "(snakemake --cores all --config experiment=perf), or name the result set")
    return found[-1].parent


def _value(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_options(label: str) -> dict:
    """results.options_label's 'k=v,k=v' back into values."""
    if not isinstance(label, str) or not label:
        return {}
    return {k: _value(v) for k, v in (part.split("=", 1) for part in label.split(","))}


def experiment_train(name: str = "perf") -> dict:
    from dpbench.config import RunConfig
    base = RunConfig().to_dict()
    path = ROOT / "experiments" / f"{name}.yaml"
    if path.exists():
        base.update((yaml.safe_load(path.read_text()) or {}).get("train", {}))
    return base


def settings(row: dict, folder: Path, train: dict) -> dict:
    """The run's settings: its recorded config, else the experiment's train block and its options."""
    metrics = folder / "runs" / row["run_id"] / "metrics.json"
    if metrics.is_file():
        try:
            cfg = json.loads(metrics.read_text())["config"]
        except (OSError, ValueError, KeyError):
            cfg = None
        if cfg:
            return cfg
    cfg = {**train, **parse_options(row.get("options", ""))}
    for key in ("variant", "precision", "feed"):
        if row.get(key):
            cfg[key] = row[key]
    for key in ("gpus", "global_batch"):
        if row.get(key) not in (None, ""):
            cfg[key] = int(float(row[key]))
    if cfg.get("per_gpu_batch") is None and row.get("scaling") == "weak":
        cfg["per_gpu_batch"] = cfg["global_batch"] // cfg["gpus"]
    return cfg


def _num(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def load_cells(folder: Path) -> list[dict]:
    """One entry per cell (run id without its repeat): settings, and the medians of its ok runs."""
    train = experiment_train()
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    cells: dict[str, dict] = {}
    for row in rows:
        cell = cells.setdefault(re.sub(r"-r\d+$", "", row["run_id"]),
                                {"cell": re.sub(r"-r\d+$", "", row["run_id"]), "ips": [], "p50": [],
                                 "status": [], "reasons": [],
                                 "settings": settings(row, folder, train)})
        cell["status"].append(row["status"])
        if row["status"] == "ok" and _num(row["images_per_s"]):
            cell["ips"].append(_num(row["images_per_s"]))
            cell["p50"].append(_num(row["step_ms_p50"]))
        elif row.get("reason"):
            cell["reasons"].append(row["reason"])
    for cell in cells.values():
        cell["images_per_s"] = statistics.median(cell["ips"]) if cell["ips"] else None
        p50 = [p for p in cell["p50"] if p]
        cell["p50_ms"] = statistics.median(p50) if p50 else None
    return list(cells.values())


def matches(cell: dict, selector: dict) -> bool:
    s = cell["settings"]
    return all(s.get(k) == v for k, v in selector.items())


def knobs_label(settings: dict) -> str:
    if settings.get("variant") != "ddp":
        return ""
    bucket = settings.get("bucket_cap_mb")
    views = settings.get("gradient_as_bucket_view") and settings.get("static_graph")
    parts = [f"bucket {25 if bucket is None else bucket:g} MB",
             "views + static graph" if views else
             ", ".join(k for k in ("gradient_as_bucket_view", "static_graph") if settings.get(k)) or "knobs off"]
    if settings.get("broadcast_buffers") is False:
        parts.append("no buffer sync")
    return ", ".join(parts)


# -- the tables -------------------------------------------------------------------------------------

def target_rows(cells: list[dict]) -> list[dict]:
    rows = []
    for name, kind, num_sel, den_sel, factor, target in TARGETS:
        nums = [c for c in cells if matches(c, num_sel)]
        dens = [c for c in cells if den_sel and matches(c, den_sel)]
        base = {"target": name, "kind": kind, "goal": target}
        if not nums:
            rows.append({**base, "setting": "", "measured": None, "verdict": "no run"})
            continue
        if den_sel is not None and len(dens) != 1:
            rows.append({**base, "setting": "", "measured": None,
                         "verdict": "no baseline run" if not dens else f"{len(dens)} baseline cells"})
            continue
        den = dens[0]["images_per_s"] if dens else None
        for c in sorted(nums, key=lambda c: -(c["images_per_s"] or 0)):
            ips = c["images_per_s"]
            if ips is None or (den_sel is not None and den is None):
                measured, verdict = None, "; ".join(sorted(set(c["status"] + (dens[0]["status"] if dens else []))))
            elif kind == "epoch":
                measured = EPOCH_IMAGES / ips
                verdict = "pass" if measured <= target else "FAIL"
            else:
                measured = ips / (factor * den)
                verdict = "pass" if measured >= target else "FAIL"
            rows.append({**base, "setting": knobs_label(c["settings"]), "measured": measured,
                         "images_per_s": ips, "baseline_images_per_s": den, "verdict": verdict,
                         "cell": c["cell"]})
    return rows


def sweep_rows(cells: list[dict]) -> list[dict]:
    """Every ddp cell, by layout and scaling, with its knobs, and its efficiency: images/s over
    gpus x the single run of the same layout and compile mode at the per-GPU batch."""
    out = []
    for c in cells:
        s = c["settings"]
        if s.get("variant") != "ddp" or c["images_per_s"] is None:
            continue
        per_gpu = s["global_batch"] // s["gpus"]
        base = [b for b in cells if b["images_per_s"] and matches(b, {
            "variant": "single", "global_batch": per_gpu, "precision": s["precision"],
            "channels_last": s.get("channels_last", False), "compile": s.get("compile", "none"),
            "feed": s.get("feed", "gpu"), "cudnn_benchmark": s.get("cudnn_benchmark", False)})]
        out.append({"layout": f"{s['precision']}{' + channels_last' if s.get('channels_last') else ''}",
                    "scaling": "weak" if s.get("per_gpu_batch") else "strong",
                    "gpus": s["gpus"], "global_batch": s["global_batch"],
                    "bucket_mb": 25 if s.get("bucket_cap_mb") is None else s["bucket_cap_mb"],
                    "knobs": knobs_label(s), "compile": s.get("compile", "none"),
                    "images_per_s": c["images_per_s"],
                    "efficiency": c["images_per_s"] / (s["gpus"] * base[0]["images_per_s"]) if len(base) == 1 else None})
    return sorted(out, key=lambda r: (r["layout"], r["scaling"], r["gpus"], r["compile"],
                                      "views" in r["knobs"], r["bucket_mb"]))


def fastest_rows(cells: list[dict]) -> list[dict]:
    """Every single-GPU cell, fastest first: epoch time and what it turned on."""
    out = []
    for c in cells:
        s = c["settings"]
        if s.get("variant") != "single" or c["images_per_s"] is None:
            continue
        recipe = [s["precision"], "channels_last" if s.get("channels_last") else "contiguous",
                  f"batch {s['global_batch']}", f"feed {s['feed']}"]
        if s.get("cudnn_benchmark"):
            recipe.append("cudnn.benchmark")
        if s.get("compile", "none") != "none":
            recipe.append(f"compile {s['compile']}")
        out.append({"recipe": ", ".join(recipe), "images_per_s": c["images_per_s"],
                    "epoch_s": EPOCH_IMAGES / c["images_per_s"]})
    return sorted(out, key=lambda r: -r["images_per_s"])


def agreement_rows(cells: list[dict]) -> list[dict]:
    """images/s against global batch / p50: equal when every timed step takes the median time."""
    out = []
    for c in cells:
        if c["images_per_s"] is None or not c["p50_ms"]:
            continue
        from_p50 = c["settings"]["global_batch"] / (c["p50_ms"] / 1e3)
        out.append({"cell": c["cell"], "images_per_s": c["images_per_s"], "from_p50": from_p50,
                    "gap": c["images_per_s"] / from_p50 - 1})
    return sorted(out, key=lambda r: -abs(r["gap"]))


def fmt(value, spec: str = ",.0f") -> str:
    return "" if value is None else format(value, spec)


def markdown(folder: Path, cells: list[dict]) -> str:
    lines = [f"# Performance targets: {folder.name}", "",
             "| target | goal | DDP knobs | measured | images/s | baseline images/s | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in target_rows(cells):
        goal = f"<= {r['goal']:g} s" if r["kind"] == "epoch" else f">= {r['goal']:g}"
        measured = fmt(r["measured"], ".2f" if r["kind"] == "epoch" else ".3f")
        lines.append(f"| {r['target']} | {goal} | {r['setting']} | {measured} | "
                     f"{fmt(r.get('images_per_s'))} | {fmt(r.get('baseline_images_per_s'))} | {r['verdict']} |")
    lines += ["", "## DDP on 2 GPUs: knobs", "",
              "| layout | scaling | global batch | knobs | compile | images/s | vs gpus x single |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['scaling']} | {r['global_batch']} | {r['knobs']} | {r['compile']} | "
              f"{fmt(r['images_per_s'])} | {fmt(r['efficiency'], '.3f')} |" for r in sweep_rows(cells)]
    lines += ["", "## One GPU, fastest first", "", "| recipe | images/s | epoch (s) |", "|---|---|---|"]
    lines += [f"| {r['recipe']} | {fmt(r['images_per_s'])} | {r['epoch_s']:.2f} |" for r in fastest_rows(cells)]
    agree = agreement_rows(cells)
    if agree:
        worst = agree[0]
        lines += ["", f"images/s against batch / p50 step time: worst gap {worst['gap']:+.1%} "
                      f"({worst['cell']}: {worst['images_per_s']:,.0f} vs {worst['from_p50']:,.0f}); "
                      f"{sum(abs(r['gap']) > 0.03 for r in agree)} of {len(agree)} cells beyond 3%"]
    skipped = [c for c in cells if c["images_per_s"] is None]
    if skipped:
        lines += ["", "Cells without a measurement:"]
        lines += [f"- {c['cell']}: {', '.join(sorted(set(c['status'])))}"
                  f"{': ' + c['reasons'][0][:160] if c['reasons'] else ''}" for c in skipped]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="?", help="the perf result set (folder or its summary.csv)")
    p.add_argument("--md", type=Path, help="also write the tables here (markdown)")
    p.add_argument("--json", type=Path, help="also write the target rows here")
    args = p.parse_args(argv)
    folder = find_result_set(args.results)
    cells = load_cells(folder)
    text = markdown(folder, cells)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"result_set": folder.name, "targets": target_rows(cells),
                                         "sweep": sweep_rows(cells), "single": fastest_rows(cells),
                                         "agreement": agreement_rows(cells)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
