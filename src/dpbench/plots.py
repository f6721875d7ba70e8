"""Seaborn figures of one tag, drawn from the tidy csv tables only.

    python -m dpbench.plots --results-dir results --tag TAG

Every figure in FIGURES is always written, because the pipeline declares them as outputs:
when there is nothing to draw, the figure says why in its centre. The bytes are stable for
the same data: figures are drawn on the Agg canvas without pyplot (no global state), with
fixed panel sizes and dpi, from sorted tables, and without the Software/date metadata.
"""
from __future__ import annotations

import argparse
import io
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from dpbench import results
from dpbench.summarize import (VARIANTS, gpus_label, load_table, ok_runs, only_ok, ordered,
                               variant_order, with_efficiency)

PANEL_IN = (4.2, 3.2)     # inches per facet
LEGEND_IN = 1.5           # inches kept for the legend right of the panels
DPI = 110
PALETTE = dict(zip(VARIANTS, sns.color_palette("colorblind", len(VARIANTS))))
OTHER_COLOR = "0.45"      # variants this module does not know yet
SPREAD = ("pi", 100)      # min..max over repeats: deterministic, unlike bootstrapped CIs
CURVE_POINTS = 50         # loss curves are smoothed to about this many independent points

Tables = dict[str, pd.DataFrame]


# -- figure scaffolding ---------------------------------------------------------------------

def palette(variants: list[str]) -> dict[str, object]:
    return {v: PALETTE.get(v, OTHER_COLOR) for v in variants}


def new_figure(n_rows: int = 1, n_cols: int = 1, legend: bool = True) -> tuple[Figure, list]:
    width = PANEL_IN[0] * n_cols + (LEGEND_IN if legend else 0)
    fig = Figure(figsize=(width, PANEL_IN[1] * n_rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharey=True)
    return fig, axes


def placeholder(title: str, message: str) -> Figure:
    """A figure that says why there is nothing to draw."""
    fig, axes = new_figure(legend=False)
    ax = axes[0][0]
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes)
    fig.suptitle(title)
    return fig


def why_empty(summary: pd.DataFrame, detail: str) -> str:
    """Why a figure is empty: no ok runs at all (and what happened instead), else `detail`."""
    if summary.empty:
        return "no runs recorded"
    if not ok_runs(summary).empty:
        return detail
    counts = summary["status"].value_counts().sort_index()
    return "no successful runs\n(" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


def facets(df: pd.DataFrame, col: str | None, row: str | None = "options"
           ) -> tuple[Figure, Iterator[tuple[Axes, pd.DataFrame]]]:
    """A grid with one panel per (row value, col value), each titled; None means one row/col.

    Returns the figure and an iterator of (axes, the panel's rows).
    """
    rows = ordered(df[row]) if row else [None]
    cols = ordered(df[col]) if col else [None]
    fig, axes = new_figure(len(rows), len(cols))

    def panels():
        for i, r in enumerate(rows):
            for j, c in enumerate(cols):
                mask = pd.Series(True, index=df.index)
                if row:
                    mask &= df[row] == r
                if col:
                    mask &= df[col] == c
                ax = axes[i][j]
                ax.set_title(panel_title(row, r, col, c))
                yield ax, df[mask]

    return fig, panels()


def panel_title(row: str | None, r: object, col: str | None, c: object) -> str:
    def label(key, value):
        return gpus_label(value) if key == "gpus" else str(value)
    return " · ".join(label(k, v) for k, v in ((col, c), (row, r)) if k and v != "")


def add_legend(fig: Figure, variants: list[str], bars: bool = False,
               extra: tuple[Line2D, ...] = ()) -> None:
    """One legend for the whole figure, so every panel keeps its full width."""
    def handle(v):
        if bars:
            return Patch(color=PALETTE.get(v, OTHER_COLOR), label=v)
        return Line2D([], [], color=PALETTE.get(v, OTHER_COLOR), marker="o", label=v)
    fig.legend(handles=[handle(v) for v in variants] + list(extra), loc="outside right center",
               frameon=False, title="variant")


@contextmanager
def style() -> Iterator[None]:
    """dpbench's look, as context managers: the caller's matplotlib settings stay untouched."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.8):
        yield


def save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    results.write_atomic(path, buf.getvalue())


# -- throughput and scaling -----------------------------------------------------------------

def dodge(df: pd.DataFrame, variants: list[str], width: float = 0.3) -> pd.Series:
    """gpus shifted a little per variant, so repeats of different variants do not overlap."""
    n = len(variants)
    shift = {v: (i - (n - 1) / 2) * width / max(1, n - 1) for i, v in enumerate(variants)}
    return df["gpus"] + df["variant"].map(shift)


def points_and_median(ax: Axes, df: pd.DataFrame, y: str, variants: list[str]) -> None:
    """Every repeat as a point, and a line through the medians."""
    data = df.assign(x=dodge(df, variants))
    common = dict(data=data, x="x", y=y, hue="variant", hue_order=variants,
                  palette=palette(variants), ax=ax, legend=False)
    sns.scatterplot(alpha=0.6, s=22, **common)
    sns.lineplot(estimator="median", errorbar=None, linewidth=1.5, **common)
    ax.set_xticks(sorted(df["gpus"].unique()))
    ax.set_xlabel("GPUs")


def ideal_line(ax: Axes, panel: pd.DataFrame, gpus: list[int]) -> None:
    """single's median × gpus (nothing when the panel has no single run to scale)."""
    single = panel.loc[panel["variant"] == "single", "images_per_s"]
    if not single.empty:
        ax.plot(gpus, [single.median() * g for g in gpus], ls="--", lw=1, color="0.3")


IDEAL = Line2D([], [], ls="--", lw=1, color="0.3", label="ideal\n(single × GPUs)")


def plot_throughput(t: Tables) -> Figure:
    title = "Training throughput"
    ok = ok_runs(t["summary"]).dropna(subset=["images_per_s"])
    if ok.empty:
        return placeholder(title, why_empty(t["summary"], "no images/s measured"))
    variants = variant_order(ok["variant"])
    gpus = sorted(set(ok["gpus"]) | {1})
    fig, panels = facets(ok, col="options", row=None)
    for ax, panel in panels:
        points_and_median(ax, panel, "images_per_s", variants)
        ideal_line(ax, panel, gpus)
        ax.set_xticks(gpus)
        ax.set_ylabel("images/s")
        ax.set_ylim(bottom=0)
    add_legend(fig, variants, extra=(IDEAL,))
    fig.suptitle(f"{title}\n(points: repeats, line: median)")
    return fig


def plot_scaling_efficiency(t: Tables) -> Figure:
    title = "Scaling efficiency"
    ok = ok_runs(t["summary"]).dropna(subset=["images_per_s"])
    if ok.empty:
        return placeholder(title, why_empty(t["summary"], "no images/s measured"))
    eff = with_efficiency(ok).dropna(subset=["efficiency"])
    if eff.empty:
        return placeholder(title, "no successful single-device run:\nefficiency needs its images/s")
    variants = variant_order(eff["variant"])
    fig, panels = facets(eff, col="options", row=None)
    for ax, panel in panels:
        points_and_median(ax, panel, "efficiency", variants)
        ax.axhline(1.0, ls="--", lw=1, color="0.3")
        ax.set_ylabel("images/s ÷ (GPUs × single's median)")
        ax.set_ylim(bottom=0, top=max(1.1, eff["efficiency"].max() * 1.05))
    add_legend(fig, variants)
    fig.suptitle(f"{title}\n(1.0 = linear scaling of single)")
    return fig


# -- memory ---------------------------------------------------------------------------------

def plot_memory(t: Tables) -> Figure:
    title = "Peak allocated memory per device"
    mem = only_ok(t["memory"], t["summary"]).dropna(subset=["allocated_mib"])
    if mem.empty:
        why = why_empty(t["summary"], "no device memory was measured\n(CPU runs?)")
        return placeholder(title, why)
    mem = mem.assign(device=mem["device"].astype(int))
    fig, panels = facets(mem, col="gpus")
    for ax, panel in panels:
        present = variant_order(panel["variant"])
        sns.barplot(data=panel, x="device", y="allocated_mib", hue="variant", hue_order=present,
                    palette=palette(present), saturation=1, errorbar=SPREAD, capsize=0.1,
                    err_kws={"linewidth": 1}, ax=ax, legend=False)
        ax.set(xlabel="device index", ylabel="peak allocated (MiB)")
    add_legend(fig, variant_order(mem["variant"]), bars=True)
    fig.suptitle(f"{title}\n(mean over repeats, whiskers: min..max)")
    return fig


# -- loss and accuracy ----------------------------------------------------------------------

def with_single_reference(df: pd.DataFrame) -> pd.DataFrame:
    """Copies single's rows into every gpus panel of the same options, as the reference."""
    single = df[df["variant"] == "single"]
    copies = [single.assign(gpus=g) for g in ordered(df["gpus"]) if g not in set(single["gpus"])]
    return pd.concat([df, *copies], ignore_index=True) if copies else df


def smooth(curves: pd.DataFrame, y: str, keys: list[str]) -> tuple[pd.DataFrame, int]:
    """Centered rolling mean along `step` per curve: per-step losses are too noisy to compare."""
    window = max(1, int(curves["step"].nunique()) // CURVE_POINTS)
    rolled = curves.groupby(keys, sort=False)[y].transform(
        lambda s: s.rolling(window, center=True, min_periods=1).mean())
    return curves.assign(**{y: rolled}), window


def mean_over_repeats(df: pd.DataFrame, y: str, x: str) -> pd.DataFrame:
    return df.groupby(["options", "variant", "gpus", x], sort=True)[y].mean().reset_index()


def draw_curves(df: pd.DataFrame, y: str, ylabel: str, title: str) -> Figure:
    """Curves of y vs step per variant, one panel per GPU count (and options)."""
    curves, window = smooth(mean_over_repeats(df, y, "step"), y, ["options", "variant", "gpus"])
    curves = with_single_reference(curves)
    variants = variant_order(curves["variant"])
    fig, panels = facets(curves, col="gpus")
    for ax, panel in panels:
        sns.lineplot(data=panel, x="step", y=y, hue="variant",
                     hue_order=variant_order(panel["variant"]), palette=palette(variants),
                     estimator=None, linewidth=1, ax=ax, legend=False)
        ax.set(xlabel="optimizer step", ylabel=ylabel)
    add_legend(fig, variants)
    smoothing = f", rolling mean over {window} steps" if window > 1 else ""
    fig.suptitle(f"{title}\n(mean over repeats{smoothing})")
    return fig


def loss_steps(t: Tables) -> pd.DataFrame:
    return only_ok(t["steps"], t["summary"]).dropna(subset=["loss_global"])


def plot_loss_curves(t: Tables) -> Figure:
    title = "Global training loss"
    steps = loss_steps(t)
    if steps.empty:
        return placeholder(title, why_empty(t["summary"], "no step records"))
    return draw_curves(steps, "loss_global", "loss_global", title)


def plot_loss_vs_single(t: Tables) -> Figure:
    title = "Global loss minus single's"
    steps = loss_steps(t)
    single = steps.loc[steps["variant"] == "single", ["options", "repeat", "step", "loss_global"]]
    others = steps[steps["variant"] != "single"]
    if single.empty or others.empty:
        return placeholder(title, why_empty(
            t["summary"], "needs step records of single\nand of at least one other variant"))
    # Same options, same repeat (hence seed), same step: only the variant differs.
    diff = others.merge(single, on=["options", "repeat", "step"], suffixes=("", "_single"))
    if diff.empty:
        why = "no step of another variant matches\na single run's options and repeat"
        return placeholder(title, why)
    diff = diff.assign(loss_diff=diff["loss_global"] - diff["loss_global_single"])
    fig = draw_curves(diff, "loss_diff", "loss_global − single's loss_global", title)
    for ax in fig.axes:
        ax.axhline(0.0, lw=1, color="0.3")
    return fig


def plot_accuracy(t: Tables) -> Figure:
    title = "Test accuracy per epoch"
    acc = only_ok(t["accuracy"], t["summary"]).dropna(subset=["test_acc"])
    if acc.empty:
        return placeholder(title, why_empty(t["summary"], "no test accuracy recorded"))
    acc = with_single_reference(acc)
    variants = variant_order(acc["variant"])
    fig, panels = facets(acc, col="gpus")
    for ax, panel in panels:
        sns.lineplot(data=panel, x="epoch", y="test_acc", hue="variant",
                     hue_order=variant_order(panel["variant"]), palette=palette(variants),
                     errorbar=SPREAD, marker="o", linewidth=1.2, ax=ax, legend=False)
        ax.set_xticks(sorted(panel["epoch"].astype(int).unique()))
        ax.set(xlabel="epoch", ylabel="test accuracy")
    add_legend(fig, variants)
    fig.suptitle(f"{title}\n(mean over repeats, band: min..max)")
    return fig


# -- warnings -------------------------------------------------------------------------------

def plot_warnings(t: Tables) -> Figure:
    title = "Warnings per variant and GPU count"
    w = t["warnings"]
    if w.empty:
        return placeholder(title, "no warnings recorded")
    # A recorded warning happened at least once even when its count was not kept.
    totals = (w.assign(count=w["count"].fillna(1))
              .groupby(["options", "variant", "gpus"], sort=True)["count"].sum().reset_index())
    totals["gpus"] = totals["gpus"].astype(int)
    variants = variant_order(totals["variant"])
    fig, panels = facets(totals, col="options", row=None)
    for ax, panel in panels:
        present = variant_order(panel["variant"])
        sns.barplot(data=panel, x="gpus", y="count", hue="variant", hue_order=present,
                    palette=palette(present), saturation=1, ax=ax, legend=False)
        for bars in ax.containers:
            ax.bar_label(bars, fmt="{:,.0f}", fontsize=7, padding=2)
        ax.margins(y=0.12)  # room for the labels above the tallest bar
        ax.set(xlabel="GPUs", ylabel="warnings")
    add_legend(fig, variants, bars=True)
    fig.suptitle(f"{title}\n(sum of counts over repeats)")
    return fig


# -- entry points ---------------------------------------------------------------------------

DRAW: dict[str, Callable[[Tables], Figure]] = {
    "throughput": plot_throughput,
    "scaling_efficiency": plot_scaling_efficiency,
    "memory": plot_memory,
    "loss_curves": plot_loss_curves,
    "loss_vs_single": plot_loss_vs_single,
    "accuracy": plot_accuracy,
    "warnings": plot_warnings,
}
FIGURES = tuple(DRAW)  # file stems under results/<tag>/figures, in drawing order


def draw_all(results_dir: Path | str, tag: str) -> list[Path]:
    """Writes every figure of FIGURES to results/<tag>/figures/<name>.png; returns the paths."""
    tables = {name: load_table(results_dir, tag, name) for name in results.TABLES}
    out = results.figures_dir(results_dir, tag)
    paths = []
    with style():
        for name in FIGURES:
            path = out / f"{name}.png"
            save(DRAW[name](tables), path)
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Draw one tag's figures from its tidy tables.")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", required=True)
    args = parser.parse_args(argv)
    for path in draw_all(args.results_dir, args.tag):
        print(path)


if __name__ == "__main__":
    main()
