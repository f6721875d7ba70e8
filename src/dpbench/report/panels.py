"""The pieces every figure of a result set shares: why a figure is empty, the footnote on cells
without an ok run, the runs' info, option panels, repeats with medians and intervals, GPU ticks,
log axes and the words for intervals and CPU sets. The look (sizes, colours, grids, notes) is
dpbench.report.figstyle's; the statistics (medians, intervals) dpbench.analysis.cell_table's.
"""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from dpbench import results
from dpbench.analysis.intervals import level_text
from dpbench.analysis.options import gpus_label, variant_order
from dpbench.analysis.tables import ok_runs
from dpbench.report.option_words import label_order
from dpbench.report.figstyle import color, data_gid, footnote, place_notes

LOG_SPAN = 50.0           # a panel whose values span more than this factor gets a log y axis

Tables = dict[str, pd.DataFrame]


def on_cpu_words(text: str, cpu: bool) -> str:
    """A label written for GPUs, as it reads for a set made on the CPU (gloo processes)."""
    if not cpu:
        return text
    return text.replace("per-GPU", "per-process").replace("GPU count", "process count").replace("GPUs", "processes")


def why_empty(summary: pd.DataFrame, detail: str) -> str:
    """Why a figure is empty: no ok runs at all (and what happened instead), else `detail`."""
    if summary.empty:
        return "no runs recorded"
    if not ok_runs(summary).empty:
        return detail
    counts = summary["status"].value_counts().sort_index()
    return "no successful runs\n(" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


def no_ok_run(summary: pd.DataFrame) -> list[str]:
    """Footnotes (the detailed one first, then counts only) for the cells (option set, variant,
    GPU count) that have runs but no ok one: no figure draws them, and without a word they
    would vanish. [] where every cell has an ok run."""
    if summary.empty:
        return []
    cpu, several = on_cpu(summary), summary["label"].nunique() > 1
    missing = []
    for (lab, v, g), runs in summary.groupby(["label", "variant", "gpus"], sort=False):
        if not (runs["status"] == results.STATUS_OK).any():
            missing.append((lab, v, g, ", ".join(sorted(set(runs["status"])))))
    if not missing:
        return []
    rank = {lab: i for i, lab in enumerate(label_order(summary))}
    vrank = {v: i for i, v in enumerate(variant_order(summary["variant"]))}
    missing.sort(key=lambda m: (rank[m[0]], vrank[m[1]], m[2]))
    named = "; ".join(f"{v} on {count_label(g, cpu)}" + (f" · {lab}" if several else "") + f" ({st})"
                      for lab, v, g, st in missing)
    counts = pd.Series([st for *_, st in missing]).value_counts().sort_index()
    counted = ", ".join(f"{n} {st}" for st, n in counts.items())
    return [f"Not drawn, no ok run: {named}; reasons in summary.md",
            f"Not drawn, no ok run: {len(missing)} cell{'s' if len(missing) > 1 else ''} "
            f"({counted}); which and why in summary.md"]


def finish(fig: Figure, summary: pd.DataFrame, notes: Sequence[tuple[Axes, str]] = ()) -> Figure:
    """The last touches once panels, legend and title are in place: the footnote naming the
    cells without an ok run, then the panels' notes, measured in the final layout."""
    footnote(fig, no_ok_run(summary))
    place_notes(fig, notes)
    return fig


def with_run_info(table: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """A per-run table with its runs' label, setup, batch and scaling from the summary."""
    info = summary[["run_id", "label", "setup", "global_batch", "per_gpu_batch", "scaling",
                    "precision", "device_type"]]
    return table.drop(columns=[c for c in info.columns if c != "run_id" and c in table.columns]) \
        .merge(info, on="run_id", how="inner")


def dodge(df: pd.DataFrame, variants: list[str], width: float = 0.3) -> pd.Series:
    """gpus shifted a little per variant, so repeats of different variants do not overlap."""
    n = len(variants)
    shift = {v: (i - (n - 1) / 2) * width / max(1, n - 1) for i, v in enumerate(variants)}
    return df["gpus"] + df["variant"].map(shift)


def points_medians_intervals(ax: Axes, runs: pd.DataFrame, med: pd.DataFrame, y: str,
                             variants: list[str]) -> list[float]:
    """Every repeat as a faint point, the medians joined by a line, the intervals as error bars.
    Returns every y value drawn (for the axis range)."""
    drawn: list[float] = []
    pts = runs.assign(x=dodge(runs, variants)).dropna(subset=[y])
    for v in variants:
        p, m = pts[pts["variant"] == v], med[med["variant"] == v].dropna(subset=[y])
        if len(p):
            ax.scatter(p["x"], p[y], s=16, alpha=0.45, color=color(v), linewidths=0, zorder=2,
                       gid=data_gid(v))
            drawn += list(p[y])
        if len(m):
            m = m.sort_values("gpus").assign(x=dodge(m, variants))
            ax.plot(m["x"], m[y], color=color(v), lw=1.5, marker="o", ms=4, zorder=3, gid=data_gid(v))
            drawn += list(m[y])
            lo, hi = m[f"{y}_ci_low"], m[f"{y}_ci_high"]
            has = lo.notna() & hi.notna()
            if has.any():
                ax.errorbar(m["x"][has], m[y][has],
                            yerr=[(m[y] - lo)[has].clip(lower=0), (hi - m[y])[has].clip(lower=0)],
                            fmt="none", ecolor=color(v), elinewidth=1.2, capsize=3, zorder=3,
                            gid=data_gid(v))
                drawn += list(lo[has]) + list(hi[has])
    return drawn


def panel_medians(cells: pd.DataFrame, runs: pd.DataFrame, y: str) -> pd.DataFrame:
    """The cells of a panel's runs (by cell_id) with y's median (or ratio of medians) and its
    interval, as collect computed them in cells.csv."""
    columns = ["variant", "gpus", y, f"{y}_ci_low", f"{y}_ci_high", f"{y}_ci_level"]
    return cells.loc[cells["cell_id"].isin(set(runs["cell_id"])), columns].reset_index(drop=True)


def option_panels(runs: pd.DataFrame) -> list[pd.DataFrame]:
    """The runs by their option set (the cells' options key, never the words of a title), in
    the order of their labels (tables.label_order)."""
    rank = {lab: i for i, lab in enumerate(label_order(runs))}
    keys = runs.drop_duplicates("options")
    keys = keys.assign(_r=keys["label"].map(rank)).sort_values("_r", kind="stable")["options"]
    return [runs[runs["options"] == key] for key in keys]


def on_cpu(df: pd.DataFrame) -> bool:
    """Runs made without CUDA: their "GPU" count is a count of gloo processes."""
    return "device_type" in df and len(df) > 0 and bool((df["device_type"] == "cpu").all())


def count_label(gpus: int, cpu: bool) -> str:
    return f"{int(gpus)} process" + ("" if gpus == 1 else "es") + " (CPU)" if cpu else gpus_label(gpus)


def gpu_ticks(ax: Axes, gpus, cpu: bool = False) -> None:
    ticks = sorted({int(g) for g in gpus})
    ax.set_xticks(ticks)
    ax.set_xlim(min(ticks) - 0.5, max(ticks) + 0.5)
    ax.set_xlabel("processes (CPU, gloo)" if cpu else "GPUs")


def span_is_wide(values: list[float]) -> bool:
    pos = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(pos) and max(pos) / min(pos) > LOG_SPAN


def interval_words(med: pd.DataFrame, y: str, at_least: bool = False) -> str:
    """What the error bars are, or that there are none with a single repeat; at_least: their
    levels are lower bounds (ratios of medians)."""
    has = med[f"{y}_ci_low"].notna() if len(med) else pd.Series(dtype=bool)
    if not has.any():
        return "n=1 per point: no interval"
    words = f"bars: {levels_text(med.loc[has, f'{y}_ci_level'], at_least)} CI"
    return words if has.all() else words + "; none where n=1"


def levels_text(levels, at_least: bool = False) -> str:
    """'75%', '50–75%' or '≥25–56%': the confidence of a figure's intervals (it depends on the repeats)."""
    lo, hi = level_text(min(levels), at_least), level_text(max(levels))
    return lo if lo.lstrip("≥") == hi else f"{lo[:-1]}–{hi}"



def grid_columns(gpus: pd.Series, panels: int) -> int:
    """A column per GPU count (up to 4); panels that all have one GPU count wrap four to a row
    instead of stacking in one tall column."""
    counts = gpus.nunique()
    return max(1, min(4, counts if counts > 1 else panels))
