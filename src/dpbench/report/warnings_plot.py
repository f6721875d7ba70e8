"""The figure of warnings per variant and GPU count: the counts summed over repeats, a bar each."""
from __future__ import annotations

import seaborn as sns
from matplotlib.figure import Figure

from dpbench.analysis.options import variant_order
from dpbench.report.option_words import label_order
from dpbench.report.figstyle import (
    add_legend,
    data_gid,
    figure_title,
    fit_y,
    palette,
    panel_grid,
    panel_title,
    placeholder,
)
from dpbench.report.panels import Tables, finish, on_cpu, on_cpu_words, span_is_wide, with_run_info


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
