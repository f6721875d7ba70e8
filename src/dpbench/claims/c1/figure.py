"""C1's figure: device 0's excess memory against the output size, measured and from sizes.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from dpbench.claims.figure_data import Section, data, missing
from dpbench.report.figstyle import new_figure, palette


def c1_figure(s: Section) -> Figure:
    title = "C1: device 0's excess memory against the output size (peak, training steps)"
    cells = data(s, "cells")
    cells = [c for c in cells or [] if "num_classes" in c]
    if not cells:
        return missing(s, title)
    df = pd.DataFrame(cells)
    df = df[df["variant"] != "ddp"]
    variants = list(dict.fromkeys(df["variant"]))
    fig, axes = new_figure(1, 2, sharey=False)   # MiB and a ratio: never one y axis
    left, right = axes[0]
    for v, part in df.groupby("variant", sort=False):
        part = part.sort_values("num_classes")
        left.errorbar(part["num_classes"], part["excess_mib"], yerr=part["noise_mib"], marker="o",
                      color=palette([v])[v], label=f"{v} (measured)", capsize=3)
        if "estimate_total_mib" in part and part["estimate_total_mib"].notna().any():
            left.plot(part["num_classes"], part["estimate_total_mib"], ls=":", marker="_", ms=12,
                      color=palette([v])[v], label=f"{v} (from sizes)")
    left.set(xscale="log", yscale="symlog", xlabel="outputs (num_classes)",
             ylabel="device 0 minus mean of the others (MiB)", title="allocated, less resident data")
    dp = df[df["variant"] == "dp"].sort_values("num_classes")
    for kind, ls in (("allocated", "-"), ("reserved", "--"), ("nvml", ":")):
        ratio = dp[f"dev0_{kind}_mib"] / dp[f"others_{kind}_mib"]
        if ratio.notna().any():
            right.plot(dp["num_classes"], ratio, ls=ls, marker="o", color="black", label=kind)
    right.axhline(1.0, color="0.6", lw=0.8)
    right.set(xscale="log", xlabel="outputs (num_classes)", ylabel="device 0 / others",
              title="dp (loss on the gathered outputs)")
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="outside right center", frameon=False, fontsize="small")
    fig.suptitle(title + (f"\n{', '.join(variants)}" if len(variants) > 1 else ""))
    return fig
