"""C6's figure: the training differences between reductions with their intervals, and the
per-step loss gap.
"""
from __future__ import annotations

import math

from matplotlib.figure import Figure

from dpbench.claims.figure_data import Section, data, missing
from dpbench.report.figstyle import new_figure, palette


def c6_figure(s: Section) -> Figure:
    title = "C6: training differences between reductions, paired by seed (95% CI)"
    training = data(s, "training")
    if not training:
        return missing(s, title)
    t = training[0]
    fig, axes = new_figure(1, 3, legend=False, sharey=False)
    panels = [("final_loss", 1.0, "final loss difference"), ("test_acc", 100.0, "test accuracy difference (pp)")]
    for ax, (metric, scale, label) in zip(axes[0][:2], panels):
        pairs = [(p, d[metric]) for p, d in t["intervals"].items() if metric in d]
        for i, (pair, ci) in enumerate(pairs):
            lo = ci["lo"] if not math.isnan(ci["lo"]) else ci["mean"]
            hi = ci["hi"] if not math.isnan(ci["hi"]) else ci["mean"]
            ax.errorbar([ci["mean"] * scale], [i], xerr=[[(ci["mean"] - lo) * scale], [(hi - ci["mean"]) * scale]],
                        fmt="o", color="black", capsize=4)
        ax.axvline(0.0, color="0.5", lw=0.8)
        ax.set_yticks(range(len(pairs)), [p.replace("-", " - ") for p, _ in pairs])
        ax.set(xlabel=label, title=f"{t['group']}: batch {t['batch']} on {t['gpus']} GPUs")
    ax = axes[0][2]
    for v in ("dp_mean", "dp_sum"):
        gap = t["gaps_first_seed"][v]["by_step"]
        pts = [(i, g) for i, g in enumerate(gap) if g > 0]   # log scale: an exact match has no place on it
        if pts:
            ax.plot(*zip(*pts), lw=1, color=palette([v])[v], label=v)
    ax.set(yscale="log", xlabel="optimizer step", ylabel="|loss - single|", title="per step, first seed")
    ax.legend(frameon=False, fontsize="small")
    fig.suptitle(title)
    return fig
