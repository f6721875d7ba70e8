"""C8's figures: speed-up over one GPU against the global batch with the crossover marked, and
where a DataParallel step's time goes (the C7 probe's breakdown).
"""
from __future__ import annotations

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from dpbench.claims.figure_data import Section, data, missing
from dpbench.claims.findings import about
from dpbench.claims.records import STAGES
from dpbench.report.figstyle import figure_title, new_figure, palette


def c8_figure(s: Section) -> Figure:
    title = "C8: speed-up over one GPU against the global batch (range over repeats)"
    rows = data(s, "rows")
    if not rows:
        return missing(s, title)
    df = pd.DataFrame(rows)
    df = df[df["gpus"] > 1]
    curves = data(s, "curves") or []
    series = list(dict.fromkeys(df["series"]))
    batches = sorted(set(df["global_batch"]))
    fig, axes = new_figure(1, len(series), sharey=True)
    for ax, name in zip(axes[0], series):
        part = df[df["series"] == name]
        for variant, pts in part.groupby("variant", sort=False):
            pts = pts.sort_values("global_batch")
            ax.errorbar(pts["global_batch"], pts["speedup"],
                        yerr=[pts["speedup"] - pts["speedup_lo"], pts["speedup_hi"] - pts["speedup"]],
                        marker="o", capsize=3, color=palette([variant])[variant], label=f"{variant}, 2+ GPUs",
                        ls="-" if len(pts) > 1 else "none")
        for c in curves:
            if c["series"] != name:
                continue
            for x in c["crossings"]:
                ax.axvspan(*x["between"], color=palette([c["variant"]])[c["variant"]], alpha=0.08, lw=0)
                ax.axvline(x["batch"], color=palette([c["variant"]])[c["variant"]], ls="--", lw=1)
                ax.annotate(f"{c['variant']}: ~{about(x['batch'])}", (x["batch"], 1.0), textcoords="offset points",
                            xytext=(4, 6), fontsize="small", color=palette([c["variant"]])[c["variant"]])
        ax.axhline(1.0, color="0.3", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [f"{b:,}" for b in batches])
        ax.set_xlim(min(batches) / 1.5, max(batches) * 1.5)
        groups = sorted(set(part["group"]))
        ax.set(xlabel="global batch (images a step)", ylabel="images/s over one GPU",
               title=name if len(groups) > 1 else f"{groups[0]}: {name}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    fig.legend(uniq.values(), uniq.keys(), loc="outside right center", frameon=False, fontsize="small")
    levels = [lv for lv in df.get("level", pd.Series(dtype=float)).dropna()]
    confidence = f", each at confidence at least {min(levels):.0%}" if levels else ""
    figure_title(fig, f"{title}. Bars: each point's range over repeats{confidence}; shaded: the crossover's "
                      "bracket (last batch measured slower, first measured faster); dashed: interpolated "
                      "between medians in log batch")
    return fig


def c8_dp_step_figure(s: Section) -> Figure:
    title = "Where a DataParallel step's time goes (C7 probe, ms per step)"
    breakdowns = data(s, "dp_step_batches") or []
    if not breakdowns:
        return missing(s, title + ": the C7 probe took no DataParallel step apart here")
    fig, axes = new_figure(1, len(breakdowns), sharey=False)   # shared, the second inversion would undo the first
    colors = dict(zip(STAGES, sns.color_palette("colorblind", len(STAGES))))
    for ax, cause in zip(axes[0], breakdowns):
        rows = [("stock DP", cause["stages"]), ("DP, persistent\nreplica threads", cause["persistent_stages"])]
        for i, (name, st) in enumerate(rows):
            left = 0.0
            for stage in STAGES:
                v = st.get(stage, 0.0)
                ax.barh(i, v, left=left, color=colors[stage], label=stage.replace("_", " ") if i == 0 else None)
                left += v
        ax.barh(len(rows), cause["single_ms"], color="0.25", label="one GPU, whole step")   # the palette's 8th is gray
        ax.set_yticks(range(len(rows) + 1), [r[0] for r in rows] + ["one GPU"])
        ax.invert_yaxis()
        ax.set(xlabel="ms (each stage closed by a sync of every device)",
               title=f"batch {cause['batch']:,} on {cause['gpus']} GPUs, cudnn.benchmark {cause['benchmark']}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", frameon=False, fontsize="small")
    fig.suptitle(title)
    return fig
