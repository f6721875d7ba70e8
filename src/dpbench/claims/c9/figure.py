"""C9's figure: each variant's largest batch per GPU and its throughput there against the model's
size, one line per variant and GPU count (the rows the verdict read)."""
from __future__ import annotations

from matplotlib.figure import Figure

from dpbench.claims.figure_data import Section, data, missing
from dpbench.report.figstyle import color, new_figure
from dpbench.report.sharding_plots import plot_rehearsed_batches

PANELS = (("largest_batch", "largest batch per GPU"), ("samples_per_s_at_largest", "samples/s at that batch"))


def c9_figure(s: Section) -> Figure:
    budgeted = [r for r in data(s, "rows") or [] if r.get("budget")]
    if budgeted:   # per budget and rank count, every sharded variant, the crossovers marked
        return plot_rehearsed_batches(budgeted, data(s, "crossovers") or [])
    rows = [r for r in data(s, "rows") or [] if r.get("largest_batch")]
    cap = next((r["cap_gib"] for r in rows), None)
    title = "C9: largest batch and its throughput against model size" + (f", within {cap:g} GiB per GPU" if cap else "")
    if not rows:
        return missing(s, title)
    fig, axes = new_figure(1, 2, sharey=False)
    lines = sorted({(r["variant"], int(r["gpus"])) for r in rows})
    for ax, (key, label) in zip(axes[0], PANELS):
        for variant, gpus in lines:
            pts = sorted((r["parameters"], r[key]) for r in rows
                         if (r["variant"], int(r["gpus"])) == (variant, gpus) and r.get(key))
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color(variant), ls="-" if gpus > 1 else ":",
                        label=f"{variant}, {gpus} GPU{'s' if gpus > 1 else ''}")
        ax.set(xscale="log", yscale="log", xlabel="parameters", ylabel=label)
    axes[0][-1].legend(frameon=False, fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    return fig
