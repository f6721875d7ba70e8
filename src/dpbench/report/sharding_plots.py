"""The sharded variants' figures (issue 26), drawn from the tidy tables only:

    memory_components   per device, stacked parameters / gradients / optimizer state / activation
                        peak, one bar per variant x GPU count, the closed form marked on each bar
    sharding_vs_size    throughput and the largest batch against model size (parameters, log x),
                        one line per variant; the largest batch where largest_batch.csv exists

A result set without sharded runs draws a placeholder that says so (the pipeline asks for these
figures only where the plan has sharded runs: dpbench.plan.pipeline.sharding_files).

    python -m dpbench.report.sharding_plots --results-dir results --tag TAG
"""
from __future__ import annotations

import matplotlib.ticker

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter, StrMethodFormatter

from dpbench import results
from dpbench.report import plots
from dpbench.analysis.options import variant_order
from dpbench.analysis.tables import ok_runs
from dpbench.report.figstyle import (
    REFERENCE_COLOR,
    color,
    data_gid,
    figure_title,
    panel_grid,
    panel_title,
    placeholder,
    reference_gid,
    thousands,
)
from dpbench.report.plots import Tables, finish, load_tables, why_empty

# (legend words, memory_components column), bottom to top of a bar.
COMPONENTS = (("parameters", "parameters_mib"), ("gradients", "gradients_mib"),
              ("optimizer state", "optimizer_mib"), ("activation peak", "activation_peak_mib"))
COMPONENT_COLORS = dict(zip((c for c, _ in COMPONENTS), sns.color_palette("pastel", len(COMPONENTS))))
PREDICTED = ("predicted_parameters_mib", "predicted_gradients_mib", "predicted_optimizer_mib")
KEEP = " (no reshard)"   # fsdp/hsdp keeping every unit gathered from forward to backward
# The size figure's quantities (panel words) and their axes: with largest_batch.csv (C9's search:
# workload, parameters, variant, gpus, largest_batch, samples_per_s_at_largest, precision) the
# first two, else the throughput at the batch the experiment trained.
THROUGHPUT_AT_LARGEST, LARGEST_BATCH = "at the largest batch", "largest batch"
THROUGHPUT_AT_BATCH = "at the experiment's batch"
QUANTITY_AXIS = {THROUGHPUT_AT_LARGEST: "samples/s", LARGEST_BATCH: "largest batch (samples)",
                 THROUGHPUT_AT_BATCH: "samples/s"}


def variant_name(variant: str, options: str) -> str:
    """The variant as a reader tells them apart: fsdp without resharding is another way to run."""
    return variant + KEEP if "reshard_after_forward=False" in str(options) else variant


def base_variant(name: str) -> str:
    return name.removesuffix(KEEP)


def gpu_words(gpus: int, cpu: bool = False) -> str:
    """'2 GPUs', or on a set made on the CPU '2 processes' (gloo)."""
    if cpu:
        return f"{gpus} process{'es' if gpus > 1 else ''}"
    return f"{gpus} GPU{'s' if gpus > 1 else ''}"


def size_words(parameters: float) -> str:
    """1.1B, 12M, 1.5M, 350K, 900: a small model's count is not '0M'."""
    p = float(parameters)
    if p >= 1e9:
        return f"{p / 1e9:.1f}B"
    if p >= 1e6:
        return f"{p / 1e6:.0f}M" if p >= 9.95e6 else f"{p / 1e6:.1f}M"
    if p >= 1e3:
        return f"{p / 1e3:.0f}K" if p >= 9.95e3 else f"{p / 1e3:.1f}K"
    return f"{p:.0f}"


def name_order(names) -> list[str]:
    """Variant names in the variants' order, each before its no-reshard form."""
    names = set(names)
    bases = variant_order(base_variant(n) for n in names)
    return sorted(names, key=lambda n: (bases.index(base_variant(n)), n.endswith(KEEP)))


# -- memory by component -------------------------------------------------------------------

def memory_bars(t: Tables) -> pd.DataFrame:
    """One row per (workload, size, precision, variant name, GPUs): each component's mean over
    the devices and ok repeats, and the closed form's parameters + gradients + optimizer."""
    mc = t["memory_components"]
    info = ok_runs(t["summary"])[["run_id", "workload", "precision"]]
    mc = mc.merge(info, on="run_id")
    if mc.empty:
        return mc
    mc = mc.assign(name=[variant_name(v, o) for v, o in zip(mc["variant"], mc["options"])],
                   predicted=mc[list(PREDICTED)].sum(axis=1, min_count=len(PREDICTED)))
    keys = ["workload", "parameters", "precision", "name", "variant", "gpus"]
    values = [c for _, c in COMPONENTS] + ["predicted"]
    return mc.groupby(keys, dropna=False)[values].mean().reset_index()


def plot_memory_components(t: Tables) -> Figure:
    title = "Memory per device by component: one profiled step"
    bars = memory_bars(t)
    if bars.empty:
        return placeholder(title, why_empty(t["summary"], "no run recorded memory by component"))
    panels = list(bars.groupby(["workload", "parameters", "precision"], dropna=False, sort=True))
    fig, axes = panel_grid(len(panels), n_cols=2)
    cpu = plots.on_cpu(t["summary"])
    if max(len(panel.groupby(["name", "gpus"])) for _, panel in panels) > 6:   # room for upright labels
        fig.set_figheight(fig.get_figheight() + 1.4 * -(-len(panels) // 2))   # per row of panels
    for ax, ((workload, parameters, precision), panel) in zip(axes, panels):
        order = [(n, g) for n in name_order(panel["name"]) for g in sorted(panel["gpus"].unique())
                 if ((panel["name"] == n) & (panel["gpus"] == g)).any()]
        x = np.arange(len(order))
        rows = [panel[(panel["name"] == n) & (panel["gpus"] == g)].iloc[0] for n, g in order]
        bottom = np.zeros(len(order))
        for words, col in COMPONENTS:
            height = np.array([r[col] if pd.notna(r[col]) else 0.0 for r in rows])
            for xi, h, b, r in zip(x, height, bottom, rows):
                ax.bar(xi, h, bottom=b, width=0.7, color=COMPONENT_COLORS[words], edgecolor="white",
                       linewidth=0.5, gid=data_gid(r["variant"]))
            bottom += height
        predicted = np.array([r["predicted"] for r in rows], dtype=float)
        ax.scatter(x, predicted, marker="_", s=400, linewidths=2, color=REFERENCE_COLOR, zorder=3,
                   gid=reference_gid("closed form"))
        crowded = len(order) > 6
        ax.set_xticks(x, [f"{n}{' · ' if crowded else chr(10)}{gpu_words(g, cpu)}" for n, g in order],
                      rotation=90 if crowded else 0, fontsize="x-small" if len(order) > 4 else "small")
        ax.set(ylabel="MiB per device", xlim=(-0.6, len(order) - 0.4),
               ylim=(0, 1.08 * max(float(bottom.max()), float(np.nanmax(predicted, initial=0)))))
        thousands(ax)
        panel_title(ax, f"{workload} · {size_words(parameters)} parameters · {precision}")
    handles = [Patch(facecolor=COMPONENT_COLORS[w], label=w) for w, _ in reversed(COMPONENTS)]
    handles.append(Line2D([], [], marker="_", ms=14, mew=2, ls="", color=REFERENCE_COLOR,
                          label="closed form:\nparameters + gradients\n+ optimizer"))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="component")
    figure_title(fig, f"{title} (mean over devices and repeats)")
    return finish(fig, t["summary"])


# -- rehearsed ranks (issue 38): memory per rank against N, the largest batch against size ---------

REHEARSED_COMPONENTS = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer state", "optimizer"),
                        ("largest unit gathered", "largest_unit"), ("activation peak", "activation_peak"),
                        ("reserved (allocator)", "reserved_peak"))


REHEARSED_NAMES = ("ddp", "zero1", "fsdp", "fsdp-keep", "hsdp")
REHEARSED_MARKERS = {"ddp": "o", "zero1": "s", "fsdp": "^", "fsdp-keep": "v", "hsdp": "D"}
REHEARSED_STYLES = {"ddp": "-", "zero1": "-", "fsdp": "-", "fsdp-keep": "--", "hsdp": "-."}
LOG_FLOOR_MIB = 1.0   # the memory panels' log axis starts here: a zero (nothing gathered at N = 1) is not drawn


def plot_rehearsed_memory(rows: list[dict], size: str | None = None, size_label: str | None = None,
                          failed: list[tuple[str, int]] = (), where: str = "on one GPU") -> Figure:
    """Per variant a panel: each component's bytes per rank (the ranks' mean) at every rank count
    measured at that size (one N axis for all panels), measured as bars, the memory model as a
    black tick on each bar, log scale (the state is tens of MiB where activations are GiB); the
    legend names only the components drawn (rows: analysis.rehearsal.memory_table). `failed`:
    (variant, N) cases of this size that failed or were not run, marked where their bars would be;
    `where`: what the ranks ran on, for the title."""
    df = pd.DataFrame(rows)
    title = f"Memory per rank by component, rehearsed ranks {where}"
    if df.empty:
        return placeholder(title, "no rehearsed records")
    size = size or sorted(df["size"].unique())[-1]
    df = df[df["size"] == size]
    failed_at = {(v, int(n)) for v, n in failed}
    names = [v for v in REHEARSED_NAMES if v in set(df["variant"])]
    never = [v for v in REHEARSED_NAMES if v not in names and v in {v for v, _ in failed_at}]   # no panel: no data
    ranks = sorted({int(n) for n in df["gpus"].unique()} | {n for _, n in failed_at})
    fig, axes = panel_grid(len(names), n_cols=3)
    colors = dict(zip([w for w, _ in REHEARSED_COMPONENTS], sns.color_palette("colorblind", len(REHEARSED_COMPONENTS))))
    width = 0.8 / len(REHEARSED_COMPONENTS)
    drawn, ticks, unticked = set(), False, False
    for ax, name in zip(axes, names):
        panel = df[df["variant"] == name]
        top = df["measured_mib"].max()
        for j, n in enumerate(ranks):
            if panel[panel["gpus"] == n].empty:   # failed, or no case at this N (hsdp: N >= 4)
                words = "did not run" if (name, n) in failed_at else "no case"
                ax.text(j, LOG_FLOOR_MIB * 1.5, words, ha="center", va="bottom", fontsize=8,
                        color="0.15" if words == "did not run" else "0.45")
            for i, (words, comp) in enumerate(REHEARSED_COMPONENTS):
                r = panel[(panel["gpus"] == n) & (panel["component"] == comp)]
                if r.empty:
                    continue
                xi = j + (i - (len(REHEARSED_COMPONENTS) - 1) / 2) * width
                measured, predicted = r["measured_mib"].iloc[0], r["predicted_mib"].iloc[0]
                if measured > 0:
                    ax.bar(xi, measured, width=width * 0.95, bottom=0, color=colors[words], gid=data_gid(name))
                    drawn.add(words)
                if predicted > 0:
                    ax.scatter([xi], [predicted], marker="_", s=60, linewidths=1.6,
                               color=REFERENCE_COLOR, zorder=3, gid=reference_gid("memory model"))
                    ticks = True
                unticked |= measured > 0 and pd.isna(predicted)   # nothing predicts it
        ax.set_yscale("log")
        ax.set_ylim(LOG_FLOOR_MIB, top * 2.5)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.set_xticks(range(len(ranks)), [f"N={n}" for n in ranks])
        ax.set_xlim(-0.6, len(ranks) - 0.4)
        ax.set(ylabel="MiB per rank (log)", xlabel="rehearsed ranks")
        panel_title(ax, name)
    handles = [Patch(facecolor=colors[w], label=w) for w, _ in REHEARSED_COMPONENTS if w in drawn]
    if ticks:
        handles.append(Line2D([], [], marker="_", ms=10, mew=2, ls="", color=REFERENCE_COLOR, label="memory model"))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="component")
    figure_title(fig, f"{title}, transformer {size_label or size}: measured (bars, mean over ranks) and the memory "
                      f"model (ticks); a zero is not drawn"
                      + ("; no tick: no one-rank case to predict it from" if unticked else "")
                      + (f"; {', '.join(never)}: did not run" if never else ""))
    return fig


def searched(df: pd.DataFrame) -> pd.DataFrame:
    """The largest_batch rows whose search ran: a batch found, or not even batch 1 fitting (drawn
    as 0); rows of cases that failed or budgets N ranks could not rehearse are left out."""
    fits_none = df["reason"].fillna("").astype(str).str.startswith("not even batch")
    return df[df["largest_batch"].notna() | fits_none]


def plot_rehearsed_batches(rows: list[dict], crossovers: list[dict]) -> Figure:
    """Per (budget, N) with a search that ran a panel: the largest per-rank batch against the
    parameter count, one line per variant (solid: measured, dotted: the memory model at the
    sizes measured), each sharded variant's first size beyond DDP's circled (rows: C9's
    largest_batch rows; crossovers: its verdict's)."""
    df = pd.DataFrame(rows)
    title = "Largest per-rank batch against model size, rehearsed ranks"
    if df.empty or df["largest_batch"].isna().all():
        return placeholder(title, "no search found a batch")
    df = searched(df.assign(name=[v + ("-keep" if v in ("fsdp", "hsdp") and not rf else "")
                                  for v, rf in zip(df["variant"], df["reshard_after_forward"])]))
    zero = bool(df["largest_batch"].isna().any())
    panels = sorted({(str(b), int(g)) for b, g in zip(df["budget"], df["gpus"])}, key=lambda k: (k[0], k[1]))
    fig, axes = panel_grid(len(panels), n_cols=4)
    names = [v for v in REHEARSED_NAMES if v in set(df["name"])]
    model_drawn = crossing_drawn = False
    for ax, (budget, gpus) in zip(axes, panels):
        panel = df[(df["budget"] == budget) & (df["gpus"] == gpus)]
        for name in names:
            line = panel[panel["name"] == name].sort_values("parameters")
            if line.empty:
                continue
            col = color(name.removesuffix("-keep"))
            ax.plot(line["parameters"], line["largest_batch"].fillna(0), marker=REHEARSED_MARKERS[name],
                    ms=5, ls=REHEARSED_STYLES[name], color=col, gid=data_gid(name), label=name,
                    zorder=3 if name == "ddp" else 2)   # the baseline on top: the others overlap it
            if line["predicted_largest_batch"].notna().any():
                ax.plot(line["parameters"], line["predicted_largest_batch"].astype(float), ls=":",
                        marker="x", ms=4, color=col, alpha=0.7, gid=reference_gid("memory model"))
                model_drawn = True
        for c in crossovers:
            if c.get("quantity") != "largest_batch" or c.get("budget") != budget or int(c["gpus"]) != gpus \
                    or not c.get("first_exceeds"):
                continue
            i = c["parameters"].index(c["first_exceeds"])
            ax.scatter([c["first_exceeds"]], [c["sharded"][i]], s=160, facecolors="none",
                       edgecolors=color(c["variant"]), linewidths=1.8, zorder=4, gid=reference_gid("crossover"))
            crossing_drawn = True
        cap = panel["cap_gib"].dropna()
        # y linear: the batches span less than a decade, and a log axis labelled 59.5 on one-size panels
        ax.set(xscale="log", xlabel="parameters", ylabel="largest batch per rank")
        # ticks at the swept sizes only, named as the tables name them (12M, 236M): log axes'
        # minor labels ran into each other; a panel of one size gets room either side
        sizes = sorted(panel["parameters"].dropna().unique())
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sizes))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(   # as the page's text: 236M, 1.08B
            lambda v, _: f"{v / 1e9:.3g}B" if v >= 1e9 else f"{v / 1e6:.3g}M"))
        if len(sizes) == 1:
            ax.set_xlim(sizes[0] / 2, sizes[0] * 2)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        panel_title(ax, f"{budget} budget ({cap.iloc[0]:g} GiB) · N={gpus}" if len(cap) else f"{budget} · N={gpus}")
    handles = [Line2D([], [], color=color(n.removesuffix("-keep")), ls=REHEARSED_STYLES[n], marker=REHEARSED_MARKERS[n],
                      label=n) for n in names]
    if model_drawn:
        handles.append(Line2D([], [], color="0.3", ls=":", marker="x", label="memory model"))
    if crossing_drawn:
        handles.append(Line2D([], [], color="0.3", marker="o", ms=10, mfc="none", ls="", label="first beyond DDP"))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="variant")
    figure_title(fig, f"{title}{' (0: not even batch 1 fits)' if zero else ''}; "
                      "the throughput needs real GPUs")
    return fig


# -- against model size --------------------------------------------------------------------

def size_lines(t: Tables) -> pd.DataFrame:
    """quantity x workload x variant name x GPUs x model size, for workloads measured at two
    sizes or more: from largest_batch.csv where present (throughput at the largest batch), else
    the ok runs' throughput at the experiment's batch, sized by memory_components' parameters."""
    keys = ["quantity", "workload", "name", "variant", "gpus", "parameters", "precision"]
    largest = t.get("largest_batch")
    if largest is not None and not largest.empty:
        df = largest.assign(name=largest["variant"])
        lines = pd.concat([df.assign(quantity=THROUGHPUT_AT_LARGEST, value=df["samples_per_s_at_largest"]),
                           df.assign(quantity=LARGEST_BATCH, value=df["largest_batch"])])[keys + ["value"]]
    else:
        sizes = t["memory_components"].drop_duplicates("run_id")[["run_id", "parameters"]]
        runs = ok_runs(t["summary"]).merge(sizes, on="run_id")
        runs = runs[runs["parameters"].notna() & runs["images_per_s"].notna()]
        runs = runs.assign(name=[variant_name(v, o) for v, o in zip(runs["variant"], runs["options"])],
                           quantity=THROUGHPUT_AT_BATCH, value=runs["images_per_s"])
        lines = runs.groupby(keys, dropna=False)["value"].median().reset_index()
    lines = lines[lines["value"] > 0]
    return lines[lines.groupby("workload")["parameters"].transform("nunique") >= 2]


def plot_sharding_vs_size(t: Tables) -> Figure:
    title = "Throughput and largest batch against model size"
    lines = size_lines(t)
    if lines.empty:
        return placeholder(title, why_empty(t["summary"], "no workload measured at two sizes or more"))
    panels = list(lines.groupby(["quantity", "workload", "gpus", "precision"], sort=False))
    fig, axes = panel_grid(len(panels), n_cols=3)
    names = name_order(lines["name"])
    for ax, ((quantity, workload, gpus, precision), panel) in zip(axes, panels):
        for name in names:
            one = panel[panel["name"] == name].sort_values("parameters")
            if not one.empty:
                ax.plot(one["parameters"], one["value"], marker="o", color=color(base_variant(name)),
                        ls="--" if name.endswith(KEEP) else "-", gid=data_gid(base_variant(name)))
        ax.set(xscale="log", yscale="log", xlabel="parameters (log scale)", ylabel=QUANTITY_AXIS[quantity],
               xlim=(panel["parameters"].min() / 1.6, panel["parameters"].max() * 1.6),
               ylim=(panel["value"].min() / 1.6, panel["value"].max() * 1.6))
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        panel_title(ax, f"{workload} · {gpu_words(gpus, plots.on_cpu(t['summary']))} · {precision} · {quantity}")
    handles = [Line2D([], [], color=color(base_variant(n)), marker="o", ls="--" if n.endswith(KEEP) else "-",
                      label=n) for n in names]
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="variant")
    figure_title(fig, title)
    return finish(fig, t["summary"])


# -- entry points ---------------------------------------------------------------------------

DRAW = dict(zip(results.SHARDING_FIGURE_NAMES, (plot_memory_components, plot_sharding_vs_size), strict=True))


def sharding_tables(results_dir: Path | str, tag: str) -> Tables:
    """load_tables' tables, plus largest_batch.csv where the result set has one."""
    tables = load_tables(results_dir, tag)
    largest = results.ResultSet(results_dir, tag).claim_table("largest_batch")
    if len(largest):
        tables["largest_batch"] = largest
    return tables


def draw_all(results_dir: Path | str, tag: str) -> list[Path]:
    return plots.save_all(sharding_tables(results_dir, tag), DRAW, results.ResultSet(results_dir, tag))


def main(argv: list[str] | None = None) -> int:
    return plots.main(argv, draw_all, "sharding figures")


if __name__ == "__main__":
    sys.exit(main())
