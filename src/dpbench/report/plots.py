"""Seaborn figures of one tag, drawn from the tidy csv tables only.

    python -m dpbench.report.plots --results-dir results --tag TAG

Every figure of results.FIGURE_NAMES is always written, because the pipeline declares them as
outputs:
when there is nothing to draw, the figure says why in its centre. Panels come from the data
present (an option set or GPU count without ok runs gets no panel, and a line under the figure
names the cells that have runs but no ok one), titles say the option set in words, and each
panel's y range holds all of its points. The look (sizes, colours, grids, notes) is
dpbench.report.figstyle's; the statistics (medians, intervals, efficiencies) dpbench.analysis.cell_table's.
At about 680 lines it is longer than the house's 450: the seven figures share one set of panel
helpers (the not-drawn note, dodging, intervals, ideal lines, curve smoothing), which a split
would either copy or scatter across modules that import each other.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dpbench import results
from dpbench.analysis.collect import read_cells
from dpbench.analysis.cell_table import reference_batch, single_pools, with_efficiency
from dpbench.analysis.intervals import level_text, median_ci
from dpbench.analysis.options import STRONG, WEAK, gpus_label, ordered, variant_order, without_batch
from dpbench.analysis.tables import load_table, ok_runs, only_ok, speed_runs
from dpbench.report.option_words import describe, label_order, labels
from dpbench.report.figstyle import (
    REFERENCE_COLOR,
    add_legend,
    color,
    data_gid,
    figure_title,
    fit_y,
    footnote,
    palette,
    panel_grid,
    panel_title,
    place_notes,
    placeholder,
    reference_gid,
    save,
    style,
    thousands,
)

__all__ = ["DRAW", "draw_all", "load_tables"]

CURVE_POINTS = 50         # loss curves are smoothed to about this many independent points
LOG_SPAN = 50.0           # a panel whose values span more than this factor gets a log y axis
IDENTICAL = 1e-12         # a difference this small (relative) counts as none

Tables = dict[str, pd.DataFrame]
IDEAL_STYLE = {STRONG: dict(ls="--", lw=1, color=REFERENCE_COLOR, marker="_", ms=12),
               WEAK: dict(ls=":", lw=1.4, color=REFERENCE_COLOR, marker="_", ms=12)}
IDEAL_LABEL = {STRONG: "ideal, strong:\nGPUs × single at the\nsame global batch",
               WEAK: "ideal, weak:\nGPUs × single at the\nper-GPU batch"}
NO_IDEAL = "no single run at this batch:\nno ideal line"


def on_cpu_words(text: str, cpu: bool) -> str:
    """A label written for GPUs, as it reads for a set made on the CPU (gloo processes)."""
    if not cpu:
        return text
    return text.replace("per-GPU", "per-process").replace("GPU count", "process count").replace("GPUs", "processes")


# -- shared pieces --------------------------------------------------------------------------

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


# -- throughput and scaling -----------------------------------------------------------------

def ideal_points(panel: pd.DataFrame, pools: dict, kind: str) -> tuple[list[int], list[float]]:
    """Where `kind` is how the panel's runs were planned: a line from one GPU, GPUs × single at
    the panel's fixed batch. Otherwise one mark per multi-GPU count, against single at the batch
    that kind asks for (which varies with the count). ([], []) without such single runs."""
    r0, xs, ys = panel.iloc[0], [], []
    if kind == r0["scaling"]:
        pool = pools.get((r0["setup"], reference_batch(kind, r0["global_batch"], r0["per_gpu_batch"])))
        if pool is not None:
            xs = sorted({1} | {int(g) for g in panel["gpus"]})
            ys = [float(np.median(pool)) * k for k in xs]
        return xs, ys
    for k, rows in panel[panel["gpus"] > 1].groupby("gpus", sort=True):
        r = rows.iloc[0]
        pool = pools.get((r["setup"], reference_batch(kind, r["global_batch"], r["per_gpu_batch"])))
        if pool is not None:
            xs.append(int(k))
            ys.append(float(np.median(pool)) * int(k))
    return xs, ys


def plot_throughput(t: Tables) -> Figure:
    title = "Training throughput"
    ok = speed_runs(ok_runs(t["summary"])).dropna(subset=["rate"])   # rehearsed runs: no speed
    if ok.empty:
        return placeholder(title, why_empty(t["summary"], "no throughput measured"))
    pools = single_pools(ok)
    variants = variant_order(ok["variant"])
    panels = option_panels(ok)
    fig, axes = panel_grid(len(panels))
    tops, bottoms, kinds_drawn, meds, logs, notes = [], [], set(), [], [], []
    for ax, panel in zip(axes, panels):
        meds.append(panel_medians(t["cells"], panel, "rate"))
        values = points_medians_intervals(ax, panel, meds[-1], "rate", variants)
        xs_all = set(panel["gpus"])
        for kind in (STRONG, WEAK):
            xs, ys = ideal_points(panel, pools, kind)
            if xs:
                line = dict(IDEAL_STYLE[kind], **({} if kind == panel["scaling"].iloc[0] else {"ls": "none"}))
                ax.plot(xs, ys, **line, zorder=1, gid=reference_gid(f"ideal {kind}"))
                values += ys
                xs_all |= set(xs)
                kinds_drawn.add(kind)
        if not any(ideal_points(panel, pools, k)[0] for k in (STRONG, WEAK)):
            notes.append((ax, NO_IDEAL))
        gpu_ticks(ax, xs_all, on_cpu(ok))
        panel_title(ax, panel["label"].iloc[0])
        logs.append(span_is_wide(values))
        tops.append(max(values))
        bottoms.append(min(values) if logs[-1] else 0.0)
    fit_y(axes, tops, bottoms, log=logs)
    for ax, is_log, panel in zip(axes, logs, panels):   # each panel in its workload's unit
        unit = str(panel["rate_unit"].iloc[0])
        ax.set_ylabel(f"{unit} (log scale)" if is_log else unit)
        thousands(ax)
    add_legend(fig, variants, extra=[Line2D([], [], **IDEAL_STYLE[k], label=on_cpu_words(IDEAL_LABEL[k], on_cpu(ok)))
                                     for k in (STRONG, WEAK) if k in kinds_drawn])
    figure_title(fig, f"{title} (points: repeats; line: medians; "
                 f"{interval_words(pd.concat(meds), 'rate')})")
    return finish(fig, t["summary"], notes)


def efficiency_panels(eff_runs: pd.DataFrame, cells: pd.DataFrame
                      ) -> list[tuple[str, str, pd.DataFrame, pd.DataFrame]]:
    """(kind, title, runs, medians) of every scaling panel with data: a strong panel holds one
    global batch of one setup, a weak panel one per-GPU batch (so its runs come from option sets
    of different global batches). Options the setup leaves out (DDP's knobs: every cell still
    compares with the same single runs) get panels of their own, never one merged point."""
    panels = []
    for kind in (STRONG, WEAK):
        col, q = ("global_batch" if kind == STRONG else "per_gpu_batch"), f"efficiency_{kind}"
        runs = eff_runs[(eff_runs["variant"] != "single") & eff_runs[q].notna()]
        runs = runs.assign(rest=runs["options"].map(lambda o: results.options_label(without_batch(o))))
        entries = []
        for key in runs[["setup", col, "rest"]].drop_duplicates().to_dict("records"):
            r = runs[(runs["setup"] == key["setup"]) & (runs[col] == key[col]) & (runs["rest"] == key["rest"])]
            if kind == WEAK and (r["gpus"] == 1).all():
                continue   # on one GPU weak is strong: the strong panel shows these points
            first = r.iloc[0]
            rest = without_batch(first["options"])
            words = describe(rest, first["precision"] or None,
                             key[col] if kind == STRONG else None,
                             key[col] if kind == WEAK else None, kind)
            order = (len(rest), describe(rest, first["precision"] or None), key[col])
            entries.append((order, f"{kind} scaling · {words}", r, panel_medians(cells, r, q)))
        panels += [(kind, head, r, m) for _, head, r, m in sorted(entries, key=lambda e: e[:2])]
    return panels


def plot_scaling_efficiency(t: Tables) -> Figure:
    title = "Scaling efficiency"
    ok = speed_runs(ok_runs(t["summary"])).dropna(subset=["rate"])   # rehearsed runs: no speed
    if ok.empty:
        return placeholder(title, why_empty(t["summary"], "no throughput measured"))
    panels = efficiency_panels(with_efficiency(ok), t["cells"])
    if not panels:
        return placeholder(title, on_cpu_words("no run has a single run to compare with\n(at its global batch "
                                               "or at its per-GPU batch)", on_cpu(ok)))
    variants = variant_order(pd.concat([p[2] for p in panels])["variant"])
    first_weak = next((i for i, p in enumerate(panels) if p[0] == WEAK), None)
    n_cols = max(sum(p[0] == STRONG for p in panels), sum(p[0] == WEAK for p in panels))
    fig, axes = panel_grid(len(panels), min(n_cols, 4),
                           row_breaks=[first_weak] if first_weak else [])
    tops = []
    for ax, (kind, head, runs, med) in zip(axes, panels):
        q = f"efficiency_{kind}"
        values = points_medians_intervals(ax, runs, med, q, variants)
        ax.axhline(1.0, **{k: v for k, v in IDEAL_STYLE[kind].items() if k not in ("marker", "ms")},
                   gid=reference_gid(f"1.0 {kind}"))
        gpu_ticks(ax, runs["gpus"], on_cpu(ok))
        ax.set_ylabel(on_cpu_words("throughput ÷ (GPUs × single)", on_cpu(ok)))
        panel_title(ax, head)
        tops.append(max(values + [1.0]))
    fit_y(axes, [max(1.1, t) for t in tops])
    add_legend(fig, variants, extra=[Line2D([], [], **IDEAL_STYLE[k], label=f"1.0 = ideal ({k})")
                                     for k in (STRONG, WEAK) if any(p[0] == k for p in panels)])
    against = {STRONG: "strong: against single at the same global batch",
               WEAK: on_cpu_words("weak: against single at the per-GPU batch", on_cpu(ok))}
    kinds = [k for k in (STRONG, WEAK) if any(p[0] == k for p in panels)]
    bars = interval_words(pd.concat([p[3].rename(columns=lambda c: c.replace(f"_{p[0]}", ""))
                                     for p in panels]), "efficiency", at_least=True)
    figure_title(fig, f"{title} ({'; '.join(against[k] for k in kinds)}; points: runs; "
                      f"line: medians; {bars})")
    return finish(fig, t["summary"])


# -- memory ---------------------------------------------------------------------------------

def grid_columns(gpus: pd.Series, panels: int) -> int:
    """A column per GPU count (up to 4); panels that all have one GPU count wrap four to a row
    instead of stacking in one tall column."""
    counts = gpus.nunique()
    return max(1, min(4, counts if counts > 1 else panels))


def plot_memory(t: Tables) -> Figure:
    title = "Peak allocated memory per device"
    mem = only_ok(t["memory"], t["summary"]).dropna(subset=["allocated_mib"])
    if mem.empty:
        ran = ok_runs(t["summary"])
        cpu = len(ran) and (ran["device_type"] == "cpu").all()
        return placeholder(title, why_empty(t["summary"], "CPU runs: no device memory to measure"
                                            if cpu else "no device memory was measured"))
    mem = with_run_info(mem.assign(device=mem["device"].astype(int)), t["summary"])
    keys = mem[["label", "options", "gpus"]].drop_duplicates()
    order = [(lab, g) for lab in label_order(mem) for g in ordered(keys[keys["label"] == lab]["gpus"])]
    fig, axes = panel_grid(len(order), n_cols=grid_columns(mem["gpus"], len(order)))
    variants = variant_order(mem["variant"])
    tops, levels, any_data = [], [], False
    for ax, (lab, g) in zip(axes, order):
        panel = mem[(mem["label"] == lab) & (mem["gpus"] == g)]
        present = variant_order(panel["variant"])
        width = 0.8 / len(present)
        top = 0.0
        for i, v in enumerate(present):
            stats = [(d, median_ci(grp["allocated_mib"]))
                     for d, grp in panel[panel["variant"] == v].groupby("device", sort=True)]
            x = np.array([d for d, _ in stats]) + (i - (len(present) - 1) / 2) * width
            height = np.array([e.value for _, e in stats])
            # The gpu feed's dataset (device 0 only under DataParallel) as the bar's hatched
            # base: part of the peak, not of what the wrapper costs.
            data = np.array([np.nan_to_num(grp["data_mib"].median()) if "data_mib" in grp else 0.0
                             for _, grp in panel[panel["variant"] == v].groupby("device", sort=True)])
            ax.bar(x, height - data, bottom=data, width=width * 0.95, color=color(v), gid=data_gid(v))
            if (data > 0).any():
                ax.bar(x, data, width=width * 0.95, color=color(v), alpha=0.35, hatch="///",
                       edgecolor="white", linewidth=0, gid=data_gid(v))
                any_data = True
            lo = np.array([e.low for _, e in stats])
            hi = np.array([e.high for _, e in stats])
            has = ~np.isnan(lo)
            if has.any():
                levels += [e.level for _, e in stats if not math.isnan(e.level)]
                ax.errorbar(x[has], height[has], yerr=[height[has] - lo[has], hi[has] - height[has]],
                            fmt="none", ecolor="0.2", elinewidth=1, capsize=3, gid=data_gid(v))
                top = max(top, float(np.nanmax(hi)))
            top = max(top, float(height.max()))
        ax.set_xticks(sorted(panel["device"].unique()))
        ax.set(xlabel="device index", ylabel="peak allocated (MiB)")
        panel_title(ax, f"{lab} · {gpus_label(g)}")
        tops.append(top)
    fit_y(axes, tops)
    for ax in axes:
        thousands(ax)
    add_legend(fig, variants, bars=True, extra=[Patch(facecolor="0.6", alpha=0.35, hatch="///",
                                                      edgecolor="white", label="dataset held there\n(gpu feed)")]
               if any_data else ())
    bars = f"bars: {levels_text(levels)} CI" if levels else "n=1 per bar: no interval"
    figure_title(fig, f"{title} (median over repeats; {bars})")
    return finish(fig, t["summary"])


# -- loss and accuracy ----------------------------------------------------------------------

def smooth(curves: pd.DataFrame, y: str, keys: list[str]) -> tuple[pd.DataFrame, int]:
    """Centered rolling mean along `step` per curve: per-step losses are too noisy to compare."""
    window = max(1, int(curves["step"].nunique()) // CURVE_POINTS)
    curves = curves.sort_values(keys + ["step"], kind="stable")
    rolled = curves.groupby(keys, sort=False, dropna=False)[y].transform(
        lambda s: s.rolling(window, center=True, min_periods=1).mean())
    return curves.assign(**{y: rolled}), window


def curve_panels(df: pd.DataFrame) -> list[tuple[str, int]]:
    """(label, gpus) of every panel with data, option sets in order, then GPU counts."""
    out = []
    for lab in label_order(df):
        out += [(lab, g) for g in ordered(df.loc[df["label"] == lab, "gpus"])]
    return out


def single_reference(df: pd.DataFrame, panel: pd.DataFrame) -> pd.DataFrame:
    """single's rows with the same setup and global batch as the panel's runs (its reference)."""
    if panel.empty or (panel["variant"] == "single").any():
        return panel.iloc[0:0]
    r = panel.iloc[0]
    single = df[(df["variant"] == "single") & (df["setup"] == r["setup"])
                & (df["global_batch"] == r["global_batch"])]
    return single[single["label"] == (single["label"].iloc[0] if len(single) else "")]


def identical_to_single(curves: pd.DataFrame, y: str, x: str) -> list[str]:
    """Variants whose curve equals single's at every shared x (they hide under it): the mean and,
    where drawn, the repeats' band."""
    cols = [c for c in (y, f"{y}_lo", f"{y}_hi") if c in curves]
    single = curves[curves["variant"] == "single"].set_index(x)[cols]
    same = []
    for v in variant_order(curves["variant"]):
        if v == "single" or single.empty:
            continue
        other = curves[curves["variant"] == v].set_index(x)[cols]
        both = other.index.intersection(single.index)
        if len(both) and np.allclose(other.loc[both], single.loc[both], rtol=IDENTICAL, atol=IDENTICAL):
            same.append(v)
    return same


def repeat_curves(df: pd.DataFrame, y: str, x: str = "step", smoothed: bool = True) -> tuple[pd.DataFrame, int]:
    """Each curve's mean over repeats with the lowest and highest repeat as y_lo and y_hi (the
    band: a mean alone hides how far repeats stray, and lets opposite signs cancel). Where there
    are many points each repeat is smoothed along x first, so that the band is the spread
    between repeats, not one step's noise; and the smoothing window."""
    window = 1
    if smoothed and "repeat" in df:
        df, window = smooth(df, y, ["label", "variant", "gpus", "options", "setup", "global_batch", "repeat"])
    curves = mean_curves(df, y, x, how=["mean", "min", "max"])
    return curves.rename(columns={"mean": y, "min": f"{y}_lo", "max": f"{y}_hi"}), window


def draw_curve_panels(df: pd.DataFrame, summary: pd.DataFrame, y: str, ylabel: str, title: str,
                      x: str = "step", subtitle: str = "", difference: bool = False,
                      marker: str | None = None, min_span: float = 0.0) -> Figure:
    """Curves of y against x per variant, one panel per (option set, GPU count). Plain curves get
    single's curve at the same setup and global batch in every panel as the reference; with
    `difference`, y already is the difference to single and the reference is the zero line.
    Curves equal to the reference are dashed on top of it and named in the panel (a panel of
    one point per curve shows no line, so its note says no dashes). `min_span`: the smallest y
    range shown, so that differences far below what matters are not blown up to the full panel.
    `summary`: the runs' table, for the footnote on cells without an ok run."""
    panels = curve_panels(df)
    variants = variant_order(df["variant"])
    fig, axes = panel_grid(len(panels), n_cols=grid_columns(df["gpus"], len(panels)))
    notes = []
    for ax, (lab, g) in zip(axes, panels):
        panel = df[(df["label"] == lab) & (df["gpus"] == g)]
        if difference:
            ax.axhline(0.0, lw=1, color=REFERENCE_COLOR, zorder=1, gid=reference_gid("0"))
            same = [v for v, c in panel.groupby("variant", sort=False)   # every seed, not just their mean
                    if np.allclose(c[[col for col in (y, f"{y}_lo", f"{y}_hi") if col in c]], 0.0, atol=IDENTICAL)]
        else:
            ref = single_reference(df, panel)
            panel = pd.concat([panel, ref], ignore_index=True)
            same = identical_to_single(panel, y, x)
            missing = not (panel["variant"] == "single").any()
        band = f"{y}_lo" in panel and f"{y}_hi" in panel
        for v in variant_order(panel["variant"]):
            c = panel[panel["variant"] == v].sort_values(x)
            style_ = dict(ls=(0, (4, 3)), lw=1.6) if v in same else dict(lw=1.1)
            ax.plot(c[x], c[y], color=color(v), marker=marker, ms=4, zorder=2, gid=data_gid(v), **style_)
            if band and v not in same:   # a curve on top of single's adds no band of its own
                ax.fill_between(c[x], c[f"{y}_lo"], c[f"{y}_hi"], color=color(v), alpha=0.18,
                                linewidth=0, zorder=1, gid=data_gid(v))
        cols = [y, f"{y}_lo", f"{y}_hi"] if band else [y]
        lo, hi = float(panel[cols].min().min()), float(panel[cols].max().max())
        if difference:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        if hi - lo < min_span:
            lo, hi = (lo + hi - min_span) / 2, (lo + hi + min_span) / 2
        span = (hi - lo) or abs(hi) or 1.0
        ax.set_ylim(lo - 0.08 * span, hi + 0.08 * span)
        ax.set(xlabel="optimizer step" if x == "step" else x, ylabel=ylabel)
        if x == "epoch":
            ax.set_xticks(sorted(panel[x].astype(int).unique()))
        words = []   # a note is placed once the layout is final, where it hides no data
        if same:
            dashed = not difference and panel[x].nunique() > 1
            words.append(f"identical to single{' (0 at every step)' if difference else ''}: "
                         f"{', '.join(variant_order(same))}" + (" (dashed)" if dashed else ""))
        if not difference and missing:
            words.append(f"no single run at global batch {panel['global_batch'].iloc[0]:g}")
        if words:
            notes.append((ax, "\n".join(words)))
        panel_title(ax, f"{lab} · {count_label(g, on_cpu(panel))}")
    add_legend(fig, variants)
    figure_title(fig, f"{title} ({subtitle})" if subtitle else title)
    return finish(fig, summary, notes)


def loss_steps(t: Tables) -> pd.DataFrame:
    steps = only_ok(t["steps"], t["summary"]).dropna(subset=["loss_global"])
    return with_run_info(steps, t["summary"])


def mean_curves(df: pd.DataFrame, y: str, x: str = "step", how: str | list[str] = "mean") -> pd.DataFrame:
    """y over the repeats of each curve at each x: their mean (or what `how` names; a list gives
    a column each)."""
    keys = ["label", "options", "setup", "global_batch", "per_gpu_batch", "scaling", "precision",
            "device_type", "variant", "gpus"]
    return df.groupby(keys + [x], sort=True)[y].agg(how).reset_index()


def plot_loss_curves(t: Tables) -> Figure:
    title = "Global training loss"
    steps = loss_steps(t)
    if steps.empty:
        return placeholder(title, why_empty(t["summary"], "no step records"))
    curves, window = repeat_curves(steps, "loss_global")
    smoothing = f"; rolling mean over {window} steps" if window > 1 else ""
    return draw_curve_panels(curves, t["summary"], "loss_global", "loss_global", title,
                             subtitle=f"line: mean over repeats, band: lowest to highest{smoothing}; "
                                      "single at the same global batch in every panel")


def plot_loss_vs_single(t: Tables) -> Figure:
    title = "Global loss minus single's"
    steps = loss_steps(t)
    single = steps.loc[steps["variant"] == "single",
                       ["setup", "global_batch", "repeat", "step", "loss_global"]]
    others = steps[steps["variant"] != "single"]
    if single.empty or others.empty:
        return placeholder(title, why_empty(
            t["summary"], "needs step records of single\nand of at least one other variant"))
    # Same setup, same global batch, same repeat (hence seed), same step: only the variant differs.
    diff = others.merge(single, on=["setup", "global_batch", "repeat", "step"],
                        suffixes=("", "_single"))
    if diff.empty:
        return placeholder(title, "no other variant ran with a single run's\n"
                                  "options, global batch and repeat")
    diff = diff.assign(loss_diff=diff["loss_global"] - diff["loss_global_single"])
    curves, window = repeat_curves(diff, "loss_diff")
    return draw_curve_panels(curves, t["summary"], "loss_diff", "loss_global − single's", title,
                             subtitle="same setup, global batch and seed; line: mean over seeds, "
                                      "band: lowest to highest seed"
                                      + (f"; rolling mean over {window} steps" if window > 1 else ""),
                             difference=True)


def plot_accuracy(t: Tables) -> Figure:
    title = "Test accuracy per epoch"
    acc = only_ok(t["accuracy"], t["summary"]).dropna(subset=["test_acc"])
    if acc.empty:
        return placeholder(title, why_empty(t["summary"], "no test accuracy recorded"))
    acc = with_run_info(acc, t["summary"])
    curves = mean_curves(acc, "test_acc", x="epoch")
    # At least 2 percentage points on the axis: a gap of hundredths of a point must not fill it.
    return draw_curve_panels(curves, t["summary"], "test_acc", "test accuracy", title, x="epoch",
                             marker="o", min_span=0.02,
                             subtitle="mean over repeats; single at the same global batch in "
                                      "every panel")


# -- warnings -------------------------------------------------------------------------------

def plot_warnings(t: Tables) -> Figure:
    title = on_cpu_words("Warnings per variant and GPU count", on_cpu(t["summary"]))
    w = t["warnings"]
    if w.empty:
        return placeholder(title, "no warnings recorded")
    w = with_run_info(w, t["summary"])
    # A recorded warning happened at least once even when its count was not kept.
    totals = (w.assign(count=w["count"].fillna(1))
              .groupby(["label", "options", "scaling", "global_batch", "per_gpu_batch", "precision",
                        "variant", "gpus"], sort=True, dropna=False)["count"].sum()
              .reset_index())
    totals["gpus"] = totals["gpus"].astype(int)
    variants = variant_order(totals["variant"])
    order = label_order(totals)
    log = span_is_wide(list(totals["count"]))
    fig, axes = panel_grid(len(order))
    tops = []
    for ax, lab in zip(axes, order):
        panel = totals[totals["label"] == lab]
        present = variant_order(panel["variant"])
        sns.barplot(data=panel, x="gpus", y="count", hue="variant", hue_order=present,
                    palette=palette(present), saturation=1, ax=ax, legend=False, errorbar=None,
                    log_scale=(False, log) if log else None)
        for v, bars in zip(present, ax.containers):   # seaborn's containers follow hue_order
            for bar in bars:
                bar.set_gid(data_gid(v))
            ax.bar_label(bars, fmt="{:,.0f}", fontsize=7, padding=2)
        ax.set(xlabel="processes (CPU, gloo)" if on_cpu(w) else "GPUs",
               ylabel="warnings (log scale)" if log else "warnings")
        panel_title(ax, lab)
        tops.append(float(panel["count"].max()) * (1.6 if log else 1.1))  # room for the labels
    fit_y(axes, tops, [0.5] * len(axes) if log else None, log=log)
    add_legend(fig, variants, bars=True)
    figure_title(fig, f"{title} (sum of counts over repeats)")
    return finish(fig, t["summary"])


# -- entry points ---------------------------------------------------------------------------

# Figure name (results.FIGURE_NAMES, in its order) -> how to draw it.
DRAW: dict[str, Callable[[Tables], Figure]] = dict(zip(results.FIGURE_NAMES, (
    plot_throughput, plot_scaling_efficiency, plot_memory, plot_loss_curves, plot_loss_vs_single,
    plot_accuracy, plot_warnings), strict=True))


def load_tables(results_dir: Path | str, tag: str) -> Tables:
    """The per-run tables, with each run's label (its option set in words) in the summary."""
    tables = {name: load_table(results_dir, tag, name) for name in results.TABLES
              if name not in ("medians", "summary", "cells")}
    tables["cells"] = read_cells(results_dir, tag)
    # runs.csv, under the name the figures know it by: its rows carry the plan's cell_id
    tables["summary"] = tables.pop("runs").pipe(lambda runs: runs.assign(label=labels(runs)))
    return tables


def save_all(tables: dict[str, pd.DataFrame], draw: dict[str, Callable], rs: results.ResultSet) -> list[Path]:
    """Draws each figure of `draw` from the tables to figures/<name>.png; returns the paths."""
    paths = []
    with style():
        for name, figure in draw.items():
            path = rs.figure_path(name)
            save(figure(tables), path)
            paths.append(path)
    return paths


def draw_all(results_dir: Path | str, tag: str) -> list[Path]:
    """Writes every figure of results.FIGURE_NAMES to figures/<name>.png; returns the paths."""
    return save_all(load_tables(results_dir, tag), DRAW, results.ResultSet(results_dir, tag))


def main(argv: list[str] | None = None, draw: Callable[[str, str], list[Path]] = draw_all,
         what: str = "figures") -> int:
    parser = argparse.ArgumentParser(description=f"Draw one tag's {what} from its tidy tables.")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", required=True)
    args = parser.parse_args(argv)
    for path in draw(args.results_dir, args.tag):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
