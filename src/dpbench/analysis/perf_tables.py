"""The perf experiment's other tables off one result set's cells (dpbench.analysis.perf_cells):
DDP's cells with their knobs and efficiency, the single-GPU recipes fastest first, how far
images/s is from what the median step time implies, and the recipe ladder (recipe_steps.png).
"""
from __future__ import annotations

from dpbench.analysis import intervals
from dpbench.analysis.perf_cells import (Cell, effective_bucket, epoch_estimate, finite, knobs_label, knobs_words,
                                         layout_words, matches, why_unmeasured)
from dpbench.analysis.perf_targets import BF16_CL, FP32, FP32_CL, single


# -- the DDP cells, the single-GPU recipes, the agreement of images/s and p50 -----------------------

def sweep_rows(cells: list[Cell]) -> list[dict]:
    """Every measured ddp cell, by GPUs, layout and scaling: its bucket size in effect, the other
    knobs, compile mode and time, images/s, and its efficiency against gpus x single of the same
    setup at the per-GPU batch (dpbench.analysis.cell_table; None where no such single run was measured)."""
    out = []
    for c in cells:
        s = c.settings
        if s.get("variant") != "ddp" or c.images_per_s is None:
            continue
        mb, note = effective_bucket(c)
        ips, eff = c.ips_est, c.efficiency
        out.append({"cell": c.cell, "gpus": s["gpus"], "layout": layout_words(s),
                    "scaling": "weak" if s.get("per_gpu_batch") else "strong",
                    "global_batch": s["global_batch"], "per_gpu_batch": s["global_batch"] // s["gpus"],
                    "bucket_mb": mb, "bucket_note": note, "knobs": knobs_words(s), "setting": knobs_label(c),
                    "compile": s.get("compile", "none"), "compile_s": c.compile_s,
                    "images_per_s": ips.value, "images_per_s_low": finite(ips.low),
                    "images_per_s_high": finite(ips.high),
                    "epoch_s": c.train_size / ips.value if c.train_size else None,
                    "efficiency": finite(eff.value), "efficiency_low": finite(eff.low),
                    "efficiency_high": finite(eff.high),
                    "efficiency_interval": intervals.interval_text(eff, "{:.3f}", len(c.ips))
                    if (finite(eff.value) is not None) else "", "reference": c.efficiency_reference})
    return sorted(out, key=lambda r: (r["gpus"], r["layout"], r["scaling"], r["compile"], r["knobs"],
                                      r["bucket_mb"] or 0))


def fastest_rows(cells: list[Cell]) -> list[dict]:
    """Every single-GPU cell, fastest first: epoch time, compile time and what it turned on."""
    out = []
    for c in cells:
        s = c.settings
        if s.get("variant") != "single" or c.images_per_s is None:
            continue
        recipe = [s["precision"], "channels_last" if s.get("channels_last") else "contiguous",
                  f"batch {s['global_batch']}", f"feed {s['feed']}"]
        if s.get("cudnn_benchmark"):
            recipe.append("cudnn.benchmark")
        if s.get("fused_sgd"):
            recipe.append("fused SGD")
        if s.get("compile", "none") != "none":
            recipe.append(f"compile {s['compile']}")
        out.append({"recipe": ", ".join(recipe), "images_per_s": c.images_per_s,
                    "epoch_s": finite(epoch_estimate(c).value), "compile_s": c.compile_s})
    return sorted(out, key=lambda r: -r["images_per_s"])


def agreement_rows(cells: list[Cell]) -> list[dict]:
    """images/s against global batch / p50: equal when every timed step takes the median time."""
    out = []
    for c in cells:
        if c.images_per_s is None or not c.p50_ms:
            continue
        from_p50 = c.settings["global_batch"] / (c.p50_ms / 1e3)
        out.append({"cell": c.cell, "images_per_s": c.images_per_s, "from_p50": from_p50,
                    "gap": c.images_per_s / from_p50 - 1})
    return sorted(out, key=lambda r: -abs(r["gap"]))


# -- the recipe ladder (recipe_steps.png draws it) ------------------------------------------------

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


def _one(cells: list[Cell], selector: dict) -> Cell | None:
    found = [c for c in cells if matches(c, selector)]
    return found[0] if len(found) == 1 else None


def recipe_rows(cells: list[Cell]) -> list[dict]:
    """The recipe ladder top to bottom: kind "step" (a step of the recipe) or "ceiling" (the
    fixed-batch run of the step above). A step's gain is over the measured step it builds on:
    the one before it, except a compiled run without cudnn.benchmark, which builds on
    bf16 + channels_last. Steps without a cell in the result set are left out; steps whose
    cell was not measured stay, with `why`."""
    steps = list(RECIPE)
    for mode in sorted({c.settings.get("compile") for c in cells} - {None, "none"},
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
        ips = cell.images_per_s
        over = "bf16 + channels_last" if "cudnn.benchmark off" in label else None
        if over not in measured:
            over = next(reversed(measured), None)
        row = {"kind": "step", "label": label, "cell": cell.cell, "images_per_s": ips,
               "epoch_s": finite(epoch_estimate(cell).value), "compile_s": cell.compile_s, "over": over,
               "gain": ips / measured[over] - 1 if ips and over else None,
               "why": None if ips else why_unmeasured(cell)}
        rows.append(row)
        if ips:
            measured[label] = ips
        if label in CEILINGS:
            ceiling_label, ceiling_sel = CEILINGS[label]
            ceiling = _one(cells, ceiling_sel)
            if ceiling is not None and ceiling.images_per_s:
                cips = ceiling.images_per_s
                rows.append({"kind": "ceiling", "label": ceiling_label, "cell": ceiling.cell,
                             "images_per_s": cips, "epoch_s": finite(epoch_estimate(ceiling).value),
                             "compile_s": ceiling.compile_s, "over": label,
                             "reached": ips / cips if ips else None, "why": None})
    return rows
