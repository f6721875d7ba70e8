"""The perf experiment's targets and their rows: each target's ratio or epoch time, with its
interval and outcome, off one result set's cells (dpbench.analysis.perf_cells).

Every ratio compares runs of one result set, so they were measured together on one machine; a
cell of several repeats counts with its median and interval as collect computed them. A target
whose cell (or baseline) has no measurement reads "not measured (<why>)", never a verdict. The
rows carry short labels (a verdict, a cell's knobs) since targets.json holds them; the prose and
the figures are dpbench.report.perf_targets', the other tables dpbench.analysis.perf_tables', the
whole-experiment time analysis.experiment_time's.
"""
from __future__ import annotations

from dpbench.analysis import intervals
from dpbench.analysis.perf_cells import Cell, epoch_estimate, finite, knobs_label, matches, why_unmeasured

# The layouts the targets speak of (everything else at the experiment's settings: gpu feed,
# no compile, cudnn.benchmark off).
FP32 = {"precision": "fp32", "channels_last": False}
FP32_CL = {"precision": "fp32", "channels_last": True}
BF16_CL = {"precision": "bf16", "channels_last": True}
EAGER = {"feed": "gpu", "compile": "none", "cudnn_benchmark": False, "fused_sgd": False}


def single(layout: dict, batch: int, **extra) -> dict:
    return {"variant": "single", "gpus": 1, "global_batch": batch, **layout, **EAGER, **extra}


def ddp2(layout: dict, scaling: str, batch: int, **extra) -> dict:
    sel = {"variant": "ddp", "gpus": 2, **layout, **EAGER, **extra}
    return {**sel, "per_gpu_batch": batch} if scaling == "weak" else {**sel, "per_gpu_batch": None,
                                                                         "global_batch": batch}


# (name, kind, numerator cell, denominator cell or None, factor, target)
#   ratio:      numerator images/s >= target x factor x denominator images/s
#   epoch:      training split / numerator images/s <= target seconds
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
    # eager bf16 without compiling: where the device's work covers the host's (batch 1024), and
    # with one fused kernel for SGD (fewer launches at 512)
    ("single bf16 + channels_last, batch 1024, epoch (s)", "epoch", single(BF16_CL, 1024), None, 1, 0.80),
    ("single bf16 + channels_last, fused SGD, epoch (s)", "epoch",
     {**single(BF16_CL, 512), "fused_sgd": True}, None, 1, 0.80),
]

NOT_MEASURED = "not measured"


def repeats_note(cell: Cell) -> str:
    """' (1 of 2 repeats)' when some repeats of a measured cell did not finish ok."""
    n = len(cell.status)
    return f" ({len(cell.ips)} of {n} repeats)" if len(cell.ips) < n else ""


def target_rows(cells: list[Cell]) -> list[dict]:
    """One row per target and numerator cell. `outcome` is pass, FAIL or not measured; `verdict`
    says it in words (why a cell was not measured, how many repeats counted, or that the goal
    lies inside the measurement's interval)."""
    rows = []
    for name, kind, num_sel, den_sel, factor, target in TARGETS:
        nums = [c for c in cells if matches(c, num_sel)]
        dens = [c for c in cells if den_sel and matches(c, den_sel)]
        base = {"target": name, "kind": kind, "goal": target, "setting": "", "measured": None,
                "low": None, "high": None, "interval": ""}
        if not nums:
            rows.append({**base, "outcome": NOT_MEASURED,
                         "verdict": f"{NOT_MEASURED} (no run of this cell in the result set)"})
            continue
        if den_sel is not None and len(dens) != 1:
            why = "no baseline run in the result set" if not dens else f"{len(dens)} cells match the baseline"
            rows.append({**base, "outcome": NOT_MEASURED, "verdict": f"{NOT_MEASURED} ({why})"})
            continue
        den_cell = dens[0] if dens else None
        den = den_cell.images_per_s if den_cell else None
        for c in sorted(nums, key=lambda c: -(c.images_per_s or 0)):
            row = {**base, "setting": knobs_label(c), "images_per_s": c.images_per_s,
                   "baseline_images_per_s": den, "cell": c.cell}
            why = (why_unmeasured(c) if c.images_per_s is None else
                   f"baseline {why_unmeasured(den_cell)}" if den_cell is not None and den is None else
                   "its records name no training split" if kind == "epoch" and not c.train_size else None)
            if why:
                rows.append({**row, "outcome": NOT_MEASURED, "verdict": f"{NOT_MEASURED} ({why})"})
                continue
            if kind == "epoch":
                est, n = epoch_estimate(c), len(c.ips)
                outcome = "pass" if est.value <= target else "FAIL"
            else:
                est = intervals.ratio_ci(c.ips, den_cell.ips, factor)
                n = min(len(c.ips), len(den_cell.ips))
                outcome = "pass" if est.value >= target else "FAIL"
            inside = (finite(est.low) is not None) and min(est.low, est.high) < target < max(est.low, est.high)
            verdict = (outcome + repeats_note(c)
                       + (repeats_note(den_cell).replace(" (", " (baseline ") if den_cell else "")
                       + (" (the goal lies inside the interval)" if inside else ""))
            rows.append({**row, "measured": est.value, "low": finite(est.low), "high": finite(est.high),
                         "interval": intervals.interval_text(est, "{:.3f}" if kind == "ratio" else "{:.2f}", n),
                         "outcome": outcome, "verdict": verdict})
    return rows
