#!/usr/bin/env python3
"""The performance targets, read off the perf experiment's results (a benchmark, not a test:
it prints and never fails).

    python3 tools/device/perf_targets.py [results/perf-torch-<version>] [--md FILE] [--json FILE]
                                         [--figure FILE.png]

Every ratio compares runs of one result set, so they were measured together on one machine.
A cell is found by its run's settings (its metrics.json config; without one, the experiment's
`train` block and the run's options), and a cell of several repeats counts with its median.
Also printed: the bucket-size sweep, the fastest recipes, and for every run how far images/s
is from what its median step time implies (a gap means untimed work crept into the timed
steps, or a few slow steps: both worth a look).

A target whose cell (or baseline) has no measurement reads "not measured (<why>)", never a
verdict. --figure draws what each step of the fast single-GPU recipe buys (images/s, epoch
time, gain over the step before), and the DDP knob cells beside it when any was measured.
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

from dpbench import results, tables  # noqa: E402  (after the path that finds them)

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
    # the same two targets for the compiled recipe (CUDA graphs: eager bf16 is launch-bound)
    ("single bf16 + channels_last, compiled (reduce-overhead), epoch (s)", "epoch",
     single(BF16_CL, 512, compile="reduce-overhead"), None, 1, 0.80),
    ("single bf16 + channels_last, compiled (reduce-overhead), vs the same loop fed one fixed batch", "ratio",
     single(BF16_CL, 512, compile="reduce-overhead"),
     single(BF16_CL, 512, compile="reduce-overhead", feed="fixed"), 1, 0.97),
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


def run_defaults() -> dict:
    from dpbench.config import RunConfig
    return RunConfig().to_dict()


def experiment_train(name: str = "perf") -> dict:
    base = run_defaults()
    path = ROOT / "experiments" / f"{name}.yaml"
    if path.exists():
        base.update((yaml.safe_load(path.read_text()) or {}).get("train", {}))
    return base


def recorded_config(folder: Path, rid: str) -> dict:
    """The config in the run's record ({} when it has none, or none that can be read)."""
    try:
        rec = results.ResultSet.at(folder).record(rid)
    except (OSError, ValueError, TypeError, AttributeError):   # a damaged record: use the table
        return {}
    return rec.config if rec is not None else {}


def settings(row: dict, folder: Path, train: dict) -> dict:
    """The run's settings: its recorded config, else the experiment's train block and its options."""
    cfg = recorded_config(folder, row["run_id"])
    if cfg:
        # a record from before a setting existed ran at that setting's default
        return {**run_defaults(), **cfg}
    cfg = {**train, **tables.parse_options(row.get("options", ""))}
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
    with open(results.ResultSet.at(folder).table_path("summary")) as f:
        rows = list(csv.DictReader(f))
    cells: dict[str, dict] = {}
    for row in rows:
        parts = results.parse_run_id(row["run_id"])
        name = parts.cell if parts else row["run_id"]
        cell = cells.setdefault(name, {"cell": name, "ips": [], "p50": [], "status": [], "reasons": [],
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

def why_unmeasured(cell: dict) -> str:
    """'skipped: needs 2 GPUs, 1 visible': the cell's status and first reason, without the
    reason's trailing detail in parentheses."""
    status = "/".join(sorted(set(cell["status"]) - {"ok"})) or "no images/s recorded"
    reason = re.sub(r"\s*\([^()]*\)$", "", cell["reasons"][0]).strip() if cell["reasons"] else ""
    if len(reason) > 80:
        reason = reason[:77].rstrip() + "..."
    return f"{status}: {reason}" if reason else status


def repeats_note(cell: dict) -> str:
    """' (1 of 2 repeats)' when some repeats of a measured cell did not finish ok."""
    n = len(cell["status"])
    return f" ({len(cell['ips'])} of {n} repeats)" if len(cell["ips"]) < n else ""


NOT_MEASURED = "not measured"


def target_rows(cells: list[dict]) -> list[dict]:
    """One row per target and numerator cell. `outcome` is pass, FAIL or not measured; `verdict`
    says it in words (why a cell was not measured, or how many repeats counted)."""
    rows = []
    for name, kind, num_sel, den_sel, factor, target in TARGETS:
        nums = [c for c in cells if matches(c, num_sel)]
        dens = [c for c in cells if den_sel and matches(c, den_sel)]
        base = {"target": name, "kind": kind, "goal": target}
        if not nums:
            rows.append({**base, "setting": "", "measured": None, "outcome": NOT_MEASURED,
                         "verdict": f"{NOT_MEASURED} (no run of this cell in the result set)"})
            continue
        if den_sel is not None and len(dens) != 1:
            why = "no baseline run in the result set" if not dens else f"{len(dens)} cells match the baseline"
            rows.append({**base, "setting": "", "measured": None, "outcome": NOT_MEASURED,
                         "verdict": f"{NOT_MEASURED} ({why})"})
            continue
        den_cell = dens[0] if dens else None
        den = den_cell["images_per_s"] if den_cell else None
        for c in sorted(nums, key=lambda c: -(c["images_per_s"] or 0)):
            ips = c["images_per_s"]
            if ips is None:
                measured, outcome = None, NOT_MEASURED
                verdict = f"{NOT_MEASURED} ({why_unmeasured(c)})"
            elif den_cell is not None and den is None:
                measured, outcome = None, NOT_MEASURED
                verdict = f"{NOT_MEASURED} (baseline {why_unmeasured(den_cell)})"
            else:
                if kind == "epoch":
                    measured = EPOCH_IMAGES / ips
                    outcome = "pass" if measured <= target else "FAIL"
                else:
                    measured = ips / (factor * den)
                    outcome = "pass" if measured >= target else "FAIL"
                verdict = outcome + repeats_note(c) + (repeats_note(den_cell).replace(" (", " (baseline ")
                                                       if den_cell else "")
            rows.append({**base, "setting": knobs_label(c["settings"]), "measured": measured,
                         "images_per_s": ips, "baseline_images_per_s": den, "outcome": outcome,
                         "verdict": verdict, "cell": c["cell"]})
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


def outcome_counts(rows: list[dict]) -> str:
    """'2 pass, 1 FAIL, 12 not measured (of 15 rows)'."""
    counts = [(o, sum(r["outcome"] == o for r in rows)) for o in ("pass", "FAIL", NOT_MEASURED)]
    return ", ".join(f"{n} {o}" for o, n in counts if n) + f" (of {len(rows)} rows)"


def markdown(folder: Path, cells: list[dict]) -> str:
    targets = target_rows(cells)
    lines = [f"# Performance targets: {folder.name}", "", f"Targets: {outcome_counts(targets)}.", "",
             "| target | goal | DDP knobs | measured | images/s | baseline images/s | verdict |",
             "|---|---|---|---|---|---|---|"]
    for r in targets:
        goal = f"<= {r['goal']:g} s" if r["kind"] == "epoch" else f">= {r['goal']:g}"
        measured = fmt(r["measured"], ".2f" if r["kind"] == "epoch" else ".3f")
        lines.append(f"| {r['target']} | {goal} | {r['setting']} | {measured} | "
                     f"{fmt(r.get('images_per_s'))} | {fmt(r.get('baseline_images_per_s'))} | {r['verdict']} |")
    lines += ["", "## DDP on 2 GPUs: knobs", ""]
    sweep = sweep_rows(cells)
    if sweep:
        lines += ["| layout | scaling | global batch | knobs | compile | images/s | vs gpus x single |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['layout']} | {r['scaling']} | {r['global_batch']} | {r['knobs']} | {r['compile']} | "
                  f"{fmt(r['images_per_s'])} | {fmt(r['efficiency'], '.3f')} |" for r in sweep]
    else:
        lines.append(f"No DDP cell was measured{ddp_unmeasured_words(cells)}.")
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


def ddp_unmeasured_words(cells: list[dict]) -> str:
    """' (10 cells skipped: needs 2 GPUs, 1 visible)': why the DDP cells have no measurement."""
    ddp = [c for c in cells if c["settings"].get("variant") == "ddp" and c["images_per_s"] is None]
    if not ddp:
        return ""
    whys = sorted({why_unmeasured(c) for c in ddp})
    return f" ({len(ddp)} cell{'s' if len(ddp) > 1 else ''} {'; '.join(whys)})"


# -- the recipe figure ---------------------------------------------------------------------------

# The fast single-GPU recipe, one step at a time (label, selector); the compile steps follow.
RECIPE = [
    ("fp32, contiguous", single(FP32, 512)),
    ("+ channels_last", single(FP32_CL, 512)),
    ("bf16 + channels_last", single(BF16_CL, 512)),
    ("+ cudnn.benchmark", single(BF16_CL, 512, cudnn_benchmark=True)),
]
# What the loop would reach without its data feed: the same step fed one fixed batch, drawn
# below the step of its layout.
CEILINGS = {"+ channels_last": ("ceiling: one fixed batch (fp32)", single(FP32_CL, 512, feed="fixed")),
            "bf16 + channels_last": ("ceiling: one fixed batch (bf16)", single(BF16_CL, 512, feed="fixed"))}
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")


def _one(cells: list[dict], selector: dict) -> dict | None:
    found = [c for c in cells if matches(c, selector)]
    return found[0] if len(found) == 1 else None


def recipe_rows(cells: list[dict]) -> list[dict]:
    """The recipe ladder top to bottom: kind "step" (a step of the recipe) or "ceiling" (the
    fixed-batch run of the step above). A step's gain is over the measured step it builds on:
    the one before it, except a compiled run without cudnn.benchmark, which builds on
    bf16 + channels_last. Steps without a cell in the result set are left out; steps whose
    cell was not measured stay, with `why`."""
    steps = list(RECIPE)
    for mode in sorted({c["settings"].get("compile") for c in cells} - {None, "none"},
                       key=lambda m: (COMPILE_MODES.index(m) if m in COMPILE_MODES else 99, m)):
        name = "" if mode == "default" else f" {mode}"
        tuned = single(BF16_CL, 512, cudnn_benchmark=True, compile=mode)
        if _one(cells, tuned):
            steps.append((f"+ compile{name}", tuned))
        else:
            steps.append((f"+ compile{name} (cudnn.benchmark off)", single(BF16_CL, 512, compile=mode)))
    rows, measured = [], {}
    for label, selector in steps:
        cell = _one(cells, selector)
        if cell is None:
            continue
        ips = cell["images_per_s"]
        over = "bf16 + channels_last" if "cudnn.benchmark off" in label else None
        if over not in measured:
            over = next(reversed(measured), None)
        row = {"kind": "step", "label": label, "cell": cell["cell"], "images_per_s": ips,
               "epoch_s": EPOCH_IMAGES / ips if ips else None, "over": over,
               "gain": ips / measured[over] - 1 if ips and over else None,
               "why": None if ips else why_unmeasured(cell)}
        rows.append(row)
        if ips:
            measured[label] = ips
        if label in CEILINGS:
            ceiling_label, ceiling_sel = CEILINGS[label]
            ceiling = _one(cells, ceiling_sel)
            if ceiling is not None and ceiling["images_per_s"]:
                cips = ceiling["images_per_s"]
                rows.append({"kind": "ceiling", "label": ceiling_label, "cell": ceiling["cell"],
                             "images_per_s": cips, "epoch_s": EPOCH_IMAGES / cips, "over": label,
                             "reached": ips / cips if ips else None, "why": None})
    return rows


def _bar_words(row: dict, step_above: str | None) -> str:
    if row["images_per_s"] is None:
        return f"{NOT_MEASURED} ({row['why']})"
    words = f"{row['images_per_s']:,.0f} img/s · {row['epoch_s']:.2f} s/epoch"
    if row["kind"] == "ceiling":
        return words + (f" · the real feed reaches {row['reached']:.1%} of it" if row.get("reached") else "")
    if row.get("gain") is not None:
        words += f" · {row['gain']:+.0%}"
        if row["over"] != step_above:
            words += f" over {row['over']}"
    return words


CHAR_FRACTION = 0.0068   # of an 11.5-inch figure's panel, at the "small" font


def _bars(ax, rows: list[dict], labels: list[str], words: list[str], colors: list, hatches: list) -> float:
    """Bars top to bottom, each with its words right of its end; returns the x limit that leaves
    every bar's words room (a character takes about CHAR_FRACTION of the panel's width)."""
    y = list(range(len(rows)))
    values = [r["images_per_s"] or 0 for r in rows]
    ax.barh(y, values, color=colors, hatch=hatches, edgecolor="0.35", linewidth=0.6, height=0.7)
    top = max(values) or 1.0
    for yi, value, text in zip(y, values, words):
        ax.annotate(text, (value, yi), xytext=(4, 0), textcoords="offset points", va="center",
                    ha="left", fontsize="small")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("images/s (epoch = 50,000 images)")
    ax.grid(axis="y", visible=False)
    from matplotlib.ticker import StrMethodFormatter
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    return max(value / max(0.2, 1 - 0.02 - CHAR_FRACTION * len(w)) for value, w in zip(values + [top], words + [""]))


def recipe_figure(folder: Path, cells: list[dict]):
    """Horizontal bars, one per recipe step (and fixed-batch ceiling); a second panel with the
    measured DDP cells when there are any."""
    import seaborn as sns
    from matplotlib.figure import Figure
    from dpbench import figstyle

    ladder = recipe_rows(cells)
    sweep = sweep_rows(cells)
    steps = [r for r in ladder if r["kind"] == "step"]
    blues = sns.color_palette("crest", max(2, len(steps)))
    heights = [max(1, len(ladder))] + ([len(sweep)] if sweep else [])
    fig = Figure(figsize=(11.5, 1.5 + 0.42 * sum(heights) + (0.6 if sweep else 0)), dpi=figstyle.DPI,
                 layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, height_ratios=heights)[:, 0]
    some = next((c["settings"] for c in cells if c["settings"].get("variant") == "single"), {})
    ax = axes[0]
    if ladder:
        colors, hatches, labels, words, i, above = [], [], [], [], 0, None
        for r in ladder:
            if r["kind"] == "step":
                colors.append(blues[i])
                hatches.append(None)
                i += 1
            else:
                colors.append("0.88")
                hatches.append("//")
            labels.append(r["label"])
            words.append(_bar_words(r, above))
            if r["kind"] == "step" and r["images_per_s"]:
                above = r["label"]
        right = _bars(ax, ladder, labels, words, colors, hatches)
    else:
        right = 0.0
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no single-GPU cell of the recipe in this result set", ha="center",
                va="center", transform=ax.transAxes)
    # the panels are wide: one-line titles (figstyle.panel_title wraps for narrow panels)
    ax.set_title(f"One GPU · batch 512 · {some.get('dataset', '?')}, gpu feed · "
                 f"%: gain over the step above")
    if sweep:
        ax2 = axes[1]
        labels = [f"{r['layout']} · {r['scaling']}\n{r['knobs']}"
                  + ("" if r["compile"] == "none" else f" · compile {r['compile']}") for r in sweep]
        words = [f"{r['images_per_s']:,.0f} img/s · {EPOCH_IMAGES / r['images_per_s']:.2f} s/epoch"
                 + (f" · {r['efficiency']:.2f} of {r['gpus']} x single" if r["efficiency"] else "")
                 for r in sweep]
        palette = sns.color_palette("flare", len(sweep))
        right = max(right, _bars(ax2, [{"images_per_s": r["images_per_s"]} for r in sweep], labels,
                                 words, list(palette), [None] * len(sweep)))
        ax2.set_title(f"DDP on {sweep[0]['gpus']} GPUs: knobs · x single: images/s over "
                      f"GPUs x single at the per-GPU batch")
    for a in axes:   # one images/s scale for both panels
        if a.axison:
            a.set_xlim(0, right)
    prov = {}
    try:
        prov = results.ResultSet.at(folder).provenance()
    except (OSError, ValueError):
        pass
    machine = ", ".join(x for x in [(prov.get("gpu_names") or [None])[0], prov.get("torch") and
                                    f"torch {prov['torch']}"] if x)
    title = f"What each step of the fast recipe buys ({machine or folder.name})"
    figstyle.figure_title(fig, title)
    if not sweep:   # the caption says why the DDP knobs have no panel
        fig.supxlabel(f"DDP knobs: no panel, no DDP cell was measured{ddp_unmeasured_words(cells)}",
                      fontsize="small", color="0.3")
    return fig


def write_figure(folder: Path, cells: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from dpbench import figstyle
    with figstyle.style():
        fig = recipe_figure(folder, cells)
    figstyle.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="?", help="the perf result set (folder or its summary.csv)")
    p.add_argument("--md", type=Path, help="also write the tables here (markdown)")
    p.add_argument("--json", type=Path, help="also write the target rows here")
    p.add_argument("--figure", type=Path, help="also draw what each step of the fast recipe buys here (png)")
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
                                         "agreement": agreement_rows(cells),
                                         "recipe": recipe_rows(cells)}, indent=1) + "\n")
    if args.figure:
        write_figure(folder, cells, args.figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
