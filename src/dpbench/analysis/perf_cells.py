"""A perf result set's cells as the perf targets read them: each cell (runs.csv's rows by the
plan's cell_id) with its settings, its runs' statuses, its images/s with the median and interval
collect computed (cells.csv), its epoch time and, for DDP, the knobs in effect, with the short
labels a row carries (a cell's knobs, why it was not measured).

A cell's settings are its run's recorded config (metrics.json); without one, the set's plan.json;
without that, the defaults under the run's options. An epoch is the training split the runs'
records name.
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


def run_defaults() -> dict:
    return RunConfig().to_dict()


def read_record(rs: results.ResultSet, rid: str) -> results.RunRecord | None:
    """The run's record (None when it has none, or none that can be read)."""
    try:
        return rs.record(rid)
    except (OSError, ValueError, TypeError, AttributeError):   # a damaged record: use the table
        return None


def finite(value) -> float | None:
    """The value as a finite float; None for anything else (missing, text, NaN, inf)."""
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
        if finite(row.get(key)) is not None:
            cfg[key] = int(finite(row[key]))
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
    return row["status"] == results.STATUS_OK and bool(finite(row["images_per_s"]))


def _cell(name: str, runs: list[tuple[dict, results.RunRecord | None]], planned: dict[str, dict],
          table_row: dict | None) -> Cell:
    """A cell from its runs' rows (runs.csv) and records (its settings are its first run's) and its
    row of cells.csv (its efficiency)."""
    ok = [(row, rec.raw if rec is not None else {}) for row, rec in runs if _ok(row)]
    provs = [raw.get("provenance") or {} for _, raw in ok]
    sizes = {int(p["dataset"]["train_size"]) for p in provs if finite((p.get("dataset") or {}).get("train_size"))}
    compiles = [float(t["compile_s"]) for t in ((raw.get("throughput") or {}) for _, raw in ok)
                if finite(t.get("compile_s")) is not None]
    ips = [finite(row["images_per_s"]) for row, _ in ok]
    # the median and its interval as collect computed them (cells.csv), never again here
    est = cell_table.cell_estimate(table_row, "images_per_s") if ips and table_row else intervals.NONE
    p50 = finite(table_row["step_ms_p50"]) if ips and table_row else None
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


# -- a cell without a measurement ------------------------------------------------------------------

def why_unmeasured(cell: Cell) -> str:
    """'skipped: needs 2 GPUs, 1 visible': the cell's status and first reason, without the
    reason's trailing detail in parentheses."""
    status = "/".join(sorted(set(cell.status) - {"ok"})) or "no images/s recorded"
    # the detail is the first " (" on: it may nest parentheses of its own ("for 1 GPU(s))")
    reason = cell.reasons[0].split(" (", 1)[0].strip() if cell.reasons else ""
    if len(reason) > 80:
        reason = reason[:77].rstrip() + "..."
    return f"{status}: {reason}" if reason else status
