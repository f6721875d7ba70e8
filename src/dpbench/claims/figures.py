"""The ledger's own figures, drawn from the sections' data, so that a figure shows exactly what
decided a verdict: C1 device 0's excess against the output size, C6 the training differences
with their intervals, C7 step time with cudnn.benchmark on and off, C8 speed-up against the
global batch with the crossover marked, and where a DataParallel step's time goes.

Every figure is always written (the pipeline declares them as outputs); a claim that was not
measured gets a figure that says why. The look is dpbench.report.figstyle's, as dpbench.report.plots'.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from dpbench import results
from dpbench.claims.records import STAGES
from dpbench.report.figstyle import new_figure, palette, placeholder, save, style

Section = Any   # dpbench.claims.records.Section, or a plain dict of its fields


def _get(s: Section, key: str, default: Any = None) -> Any:
    return s.get(key, default) if isinstance(s, dict) else getattr(s, key, default)


def _data(s: Section, key: str) -> Any:
    """One entry of a section's data; None where the claim was not measured."""
    return (_get(s, "data") or {}).get(key)


def _missing(s: Section, title: str) -> Figure:
    return placeholder(title, _get(s, "not_run") or "nothing measured for this figure in these results")


def c1_figure(s: Section) -> Figure:
    title = "C1: device 0's excess memory against the output size (peak, training steps)"
    cells = _data(s, "cells")
    cells = [c for c in cells or [] if "num_classes" in c]
    if not cells:
        return _missing(s, title)
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


def c6_figure(s: Section) -> Figure:
    title = "C6: training differences between reductions, paired by seed (95% CI)"
    training = _data(s, "training")
    if not training:
        return _missing(s, title)
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


def c7_figure(s: Section) -> Figure:
    title = "C7: step time, cudnn.benchmark on vs off\n(median step over repeats{})"
    training = _data(s, "training")
    if not training:
        return _missing(s, title)
    df = pd.DataFrame(training)
    df = df[(df["p50_on_ms"] > 0) & (df["p50_off_ms"] > 0)]   # NaN where a run timed no step
    if df.empty:
        return _missing(s, title)
    df["run"] = [f"{v}\n{g} GPU{'s' if g > 1 else ''}" for v, g in zip(df["variant"], df["gpus"])]
    long = df.melt(id_vars="run", value_vars=["p50_on_ms", "p50_off_ms"], var_name="benchmark",
                   value_name="step_ms")
    long["benchmark"] = long["benchmark"].map({"p50_on_ms": "on", "p50_off_ms": "off"})
    fig, axes = new_figure(1, 1, legend=False)
    ax = axes[0][0]
    sns.barplot(long, x="run", y="step_ms", hue="benchmark", hue_order=["off", "on"],
                palette={"off": "0.6", "on": "tab:red"}, ax=ax)
    # A log axis only where the times span more than a decade (DataParallel's re-tuning), and
    # then from a decade under the power of ten below the shortest bar: a log axis cut just
    # under the bars would turn a 1% difference into a bar and its stub.
    low, high = long["step_ms"].min(), long["step_ms"].max()
    wide = high / low > 10
    if wide:
        ax.set_yscale("log")
        ax.set_ylim(bottom=10 ** math.floor(math.log10(low)) / 10)
    else:
        ax.set_ylim(bottom=0)
    ax.set(xlabel="", ylabel="step time p50 (ms)")
    ax.legend(frameon=False, title="cudnn.benchmark", loc="upper left", bbox_to_anchor=(1.0, 1.0))   # beside the bars
    fig.suptitle(title.format(", log scale" if wide else ""))
    return fig


def _about(batch: float) -> str:
    return f"{float(f'{batch:.2g}'):,.0f}"


def c8_figure(s: Section) -> Figure:
    title = "C8: speed-up over one GPU against the global batch (range over repeats)"
    rows = _data(s, "rows")
    if not rows:
        return _missing(s, title)
    df = pd.DataFrame(rows)
    df = df[df["gpus"] > 1]
    curves = _data(s, "curves") or []
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
                ax.annotate(f"{c['variant']}: ~{_about(x['batch'])}", (x["batch"], 1.0), textcoords="offset points",
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
    fig.suptitle(title + f"\nbars: each point's range over repeats{confidence}; shaded: the crossover's bracket "
                 "(last batch measured slower, first measured faster); dashed: interpolated between medians in log batch")
    return fig


def c8_dp_step_figure(s: Section) -> Figure:
    title = "Where a DataParallel step's time goes (C7 probe, ms per step)"
    breakdowns = _data(s, "dp_step_batches") or []
    if not breakdowns:
        return _missing(s, title + ": the C7 probe took no DataParallel step apart here")
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


# Figure key -> how to draw it; a key's claim is the part before "_" (C8_dp_step -> C8). The
# keys are results.CLAIM_FIGURE_KEYS, which the pipeline plans with (without this module).
DRAW: dict[str, Callable[[Section], Figure]] = {"C1": c1_figure, "C6": c6_figure, "C7": c7_figure,
                                                "C8": c8_figure, "C8_dp_step": c8_dp_step_figure}


def claim_of(key: str) -> str:
    return key.split("_")[0]


def draw(results_dir: Path | str, tag: str, sections: list[Section]) -> dict[str, str]:
    """Writes every claim figure under results/<tag>/figures; returns figure key -> the path
    relative to the tag's folder, which is how claims.md links it."""
    rs = results.ResultSet(results_dir, tag)
    by_id = {_get(s, "id"): s for s in sections}
    written = {}
    with style():
        for key, draw_one in DRAW.items():
            path = rs.claim_figure_path(key)
            save(draw_one(by_id.get(claim_of(key), {"id": claim_of(key)})), path)
            written[key] = rs.relative(path)
    return written
