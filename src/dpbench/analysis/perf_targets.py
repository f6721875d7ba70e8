"""The perf experiment's targets, read off one result set: its cells (runs.csv's rows by the plan's
cell_id, found by the run's settings), each target's ratio or epoch time with its interval and
outcome, DDP's cells with their knobs, the single-GPU recipes and the recipe ladder, as rows
that dpbench.report.perf_targets writes out (targets.json holds them as they are).

Every ratio compares runs of one result set, so they were measured together on one machine.
A cell is found by its run's settings (its metrics.json config; without one, the set's plan.json;
without that, the defaults and the run's options); a cell of several repeats counts with its
median and interval and its efficiency as collect computed them (cells.csv). An epoch is
the training split the runs' records name. A target whose cell (or baseline) has no
measurement reads "not measured (<why>)", never a verdict. The rows carry short labels (a
cell's knobs, why it was not measured, a verdict) since targets.json holds them; the prose
and the figures are dpbench.report.perf_targets'. At 450-odd lines it holds one table of
targets and the functions that fill it; the whole-experiment time is analysis.experiment_time's.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dpbench import results
from dpbench.analysis import cell_table, intervals, options, tables
from dpbench.analysis.collect import read_cells
from dpbench.plan.config import RunConfig
from dpbench.plan.matrix import planned_runs

# DDP's bucket size where a run leaves bucket_cap_mb unset, as some torch builds it: (MB, the
# torch version that said it), or (None, why not). dpbench.run.device_facts has one; this
# layer never imports torch, so the caller hands it in.
BucketDefault = Callable[[], tuple["float | None", str]]

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


# -- reading the result set ----------------------------------------------------------------------

def run_defaults() -> dict:
    return RunConfig().to_dict()


def read_record(rs: results.ResultSet, rid: str) -> results.RunRecord | None:
    """The run's record (None when it has none, or none that can be read)."""
    try:
        return rs.record(rid)
    except (OSError, ValueError, TypeError, AttributeError):   # a damaged record: use the table
        return None


def _num(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def settings(row: dict, rec: results.RunRecord | None, planned: dict[str, dict]) -> dict:
    """The run's settings: its recorded config, else its plan's (plan.json), else the defaults
    under its options (a damaged record of a set without a plan)."""
    if rec is not None and rec.config:
        # a record from before a setting existed ran at that setting's default
        return {**run_defaults(), **rec.config}
    if row["run_id"] in planned:
        return {**run_defaults(), **planned[row["run_id"]]}
    cfg = {**run_defaults(), **options.parse_options(row.get("options", ""))}
    for key in ("variant", "precision", "feed"):
        if row.get(key):
            cfg[key] = row[key]
    for key in ("gpus", "global_batch"):
        if _num(row.get(key)) is not None:
            cfg[key] = int(_num(row[key]))
    if cfg.get("per_gpu_batch") is None and row.get("scaling") == "weak":
        cfg["per_gpu_batch"] = cfg["global_batch"] // cfg["gpus"]
    return cfg


@dataclass
class Cell:
    """One cell (the plan's cell_id): its settings, its runs' statuses and the reasons
    of those not ok, and what its ok runs measured."""
    cell: str
    settings: dict
    status: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    ips: list[float] = field(default_factory=list)   # images/s, one per ok run
    images_per_s: float | None = None                 # their median (None: no ok run)
    ips_est: intervals.Estimate = intervals.NONE            # the median with its interval
    p50_ms: float | None = None                       # the median of the runs' p50 step times
    train_size: int | None = None                     # None where repeats name different splits
    compile_s: float | None = None
    torch: tuple[str, ...] = ()                       # the torch versions the ok runs used
    efficiency: intervals.Estimate = intervals.NONE         # against gpus x single (cell_table.cells)
    efficiency_reference: str = ""
    pytorch_bucket: tuple[float | None, str] = (None, "")   # DDP's default, where the runs left it unset


def load_cells(folder: Path, pytorch_bucket: BucketDefault | None = None) -> list[Cell]:
    """The result set's cells, in the summary's order. `pytorch_bucket` says DDP's default
    bucket size, asked only where a DDP run left it unset."""
    rs = results.ResultSet.at(folder)
    runs = tables.load_table(rs.root, rs.tag, "runs")
    estimated = {c["cell_id"]: c for c in read_cells(rs.root, rs.tag).to_dict("records")}
    planned = planned_configs(rs)
    groups: dict[str, list[tuple[dict, results.RunRecord | None]]] = {}
    for row in runs.to_dict("records"):
        groups.setdefault(row["cell_id"], []).append((row, read_record(rs, row["run_id"])))
    cells = [_cell(name, rows, planned, estimated.get(name)) for name, rows in groups.items()]
    unset = [c for c in cells if c.settings.get("variant") == "ddp" and c.settings.get("bucket_cap_mb") is None]
    default = _bucket_default(pytorch_bucket) if unset else (None, "")
    for cell in unset:
        cell.pytorch_bucket = default
    return cells


def planned_configs(rs: results.ResultSet) -> dict[str, dict]:
    """The set's runs as its plan.json has them (run id -> config); {} for a set without one."""
    if not rs.plan_path.is_file():
        return {}
    return {rid: rc.to_dict() for rid, rc in planned_runs(rs.plan_path).items()}


def _ok(row: dict) -> bool:
    return row["status"] == results.STATUS_OK and bool(_num(row["images_per_s"]))


def _cell(name: str, runs: list[tuple[dict, results.RunRecord | None]], planned: dict[str, dict],
          table_row: dict | None) -> Cell:
    """A cell from its runs' rows (runs.csv) and records (its settings are its first run's) and its
    row of cells.csv (its efficiency)."""
    ok = [(row, rec.raw if rec is not None else {}) for row, rec in runs if _ok(row)]
    provs = [raw.get("provenance") or {} for _, raw in ok]
    sizes = {int(p["dataset"]["train_size"]) for p in provs if _num((p.get("dataset") or {}).get("train_size"))}
    compiles = [float(t["compile_s"]) for t in ((raw.get("throughput") or {}) for _, raw in ok)
                if _num(t.get("compile_s")) is not None]
    ips = [_num(row["images_per_s"]) for row, _ in ok]
    # the median and its interval as collect computed them (cells.csv), never again here
    est = cell_table.cell_estimate(table_row, "images_per_s") if ips and table_row else intervals.NONE
    p50 = _num(table_row["step_ms_p50"]) if ips and table_row else None
    return Cell(
        cell=name, settings=settings(*runs[0], planned), status=[row["status"] for row, _ in runs],
        reasons=[row["reason"] for row, _ in runs if not _ok(row) and row.get("reason")],
        ips=ips, images_per_s=est.value if ips else None, ips_est=est,
        p50_ms=p50,
        train_size=next(iter(sizes)) if len(sizes) == 1 else None,
        compile_s=statistics.median(compiles) if compiles else None,
        torch=tuple(sorted({str(p["torch"]) for p in provs if p.get("torch")})),
        efficiency=cell_table.cell_estimate(table_row, "efficiency_weak") if table_row else intervals.NONE,
        efficiency_reference=table_row["weak_reference"] if table_row else "")


def _bucket_default(pytorch_bucket: BucketDefault | None) -> tuple[float | None, str]:
    if pytorch_bucket is None:
        return None, "no torch was asked"
    try:
        return pytorch_bucket()
    except ImportError as exc:
        return None, f"torch does not import here ({exc})"


def matches(cell: Cell, selector: dict) -> bool:
    s = cell.settings
    return all(s.get(k) == v for k, v in selector.items())


def epoch_estimate(cell: Cell) -> intervals.Estimate:
    """The epoch's time, the training split over images/s (the interval's ends swap over)."""
    size, ips = cell.train_size, cell.ips_est
    if not size or cell.images_per_s is None:
        return intervals.NONE
    return intervals.Estimate(size / ips.value, size / ips.high, size / ips.low, ips.level)


# -- DDP's knobs: the bucket size in effect, and the labels a row carries --------------------------

def effective_bucket(cell: Cell) -> tuple[float | None, str]:
    """(MB, note): the run's bucket_cap_mb, or PyTorch's default (the note says so, and which
    torch said it where the runs used another); MB is None when neither is known."""
    mb = cell.settings.get("bucket_cap_mb")
    if mb is not None:
        return float(mb), ""
    default, here = cell.pytorch_bucket
    if default is None:
        return None, f"PyTorch's default, unknown: {here}"
    ran = sorted(cell.torch)
    note = "PyTorch's default" + (f" in torch {here}; the runs used {', '.join(ran)}" if ran and ran != [here] else "")
    return default, note


def knobs_words(settings: dict) -> str:
    """The knobs other than the bucket size: 'views + static graph, no buffer sync'."""
    views, static = settings.get("gradient_as_bucket_view"), settings.get("static_graph")
    words = ("views + static graph" if views and static else "gradient views" if views
             else "static graph" if static else "knobs off")
    return words + (", no buffer sync" if settings.get("broadcast_buffers") is False else "")


def bucket_words(cell: Cell) -> str:
    mb, note = effective_bucket(cell)
    return (f"bucket {mb:g} MB" if mb is not None else "bucket size unknown") + (f" ({note})" if note else "")


def knobs_label(cell: Cell) -> str:
    """'bucket 25 MB, views + static graph' for a DDP cell; '' for the others."""
    if cell.settings.get("variant") != "ddp":
        return ""
    return f"{bucket_words(cell)}, {knobs_words(cell.settings)}"


def layout_words(settings: dict) -> str:
    return f"{settings['precision']}{' + channels_last' if settings.get('channels_last') else ''}"


# -- the targets ------------------------------------------------------------------------------------

def why_unmeasured(cell: Cell) -> str:
    """'skipped: needs 2 GPUs, 1 visible': the cell's status and first reason, without the
    reason's trailing detail in parentheses."""
    status = "/".join(sorted(set(cell.status) - {"ok"})) or "no images/s recorded"
    # the detail is the first " (" on: it may nest parentheses of its own ("for 1 GPU(s))")
    reason = cell.reasons[0].split(" (", 1)[0].strip() if cell.reasons else ""
    if len(reason) > 80:
        reason = reason[:77].rstrip() + "..."
    return f"{status}: {reason}" if reason else status


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
            inside = (_num(est.low) is not None) and min(est.low, est.high) < target < max(est.low, est.high)
            verdict = (outcome + repeats_note(c)
                       + (repeats_note(den_cell).replace(" (", " (baseline ") if den_cell else "")
                       + (" (the goal lies inside the interval)" if inside else ""))
            rows.append({**row, "measured": est.value, "low": _num(est.low), "high": _num(est.high),
                         "interval": intervals.interval_text(est, "{:.3f}" if kind == "ratio" else "{:.2f}", n),
                         "outcome": outcome, "verdict": verdict})
    return rows


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
                    "images_per_s": ips.value, "images_per_s_low": _num(ips.low),
                    "images_per_s_high": _num(ips.high),
                    "epoch_s": c.train_size / ips.value if c.train_size else None,
                    "efficiency": _num(eff.value), "efficiency_low": _num(eff.low),
                    "efficiency_high": _num(eff.high),
                    "efficiency_interval": intervals.interval_text(eff, "{:.3f}", len(c.ips))
                    if (_num(eff.value) is not None) else "", "reference": c.efficiency_reference})
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
                    "epoch_s": _num(epoch_estimate(c).value), "compile_s": c.compile_s})
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
               "epoch_s": _num(epoch_estimate(cell).value), "compile_s": cell.compile_s, "over": over,
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
                             "images_per_s": cips, "epoch_s": _num(epoch_estimate(ceiling).value),
                             "compile_s": ceiling.compile_s, "over": label,
                             "reached": ips / cips if ips else None, "why": None})
    return rows
