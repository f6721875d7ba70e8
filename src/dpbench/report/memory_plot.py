"""The figure of peak allocated memory per device: a bar per variant and device, medians over
repeats with their intervals, the gpu feed's dataset hatched at the bar's base."""
from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dpbench.analysis.intervals import median_ci
from dpbench.analysis.options import gpus_label, ordered, variant_order
from dpbench.analysis.tables import ok_runs, only_ok
from dpbench.report.option_words import label_order
from dpbench.report.figstyle import (
    add_legend,
    color,
    data_gid,
    figure_title,
    fit_y,
    panel_grid,
    panel_title,
    placeholder,
    thousands,
)
from dpbench.report.panels import Tables, finish, grid_columns, levels_text, why_empty, with_run_info


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
