"""The curve figures: global training loss, loss minus single's and test accuracy, per variant
against single's curve at the same setup and global batch, with the spread between repeats."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dpbench.analysis.options import ordered, variant_order
from dpbench.analysis.tables import only_ok
from dpbench.report.option_words import label_order
from dpbench.report.figstyle import (
    REFERENCE_COLOR,
    add_legend,
    color,
    data_gid,
    figure_title,
    panel_grid,
    panel_title,
    placeholder,
    reference_gid,
)
from dpbench.report.panels import (
    Tables,
    count_label,
    finish,
    grid_columns,
    on_cpu,
    why_empty,
    with_run_info,
)

CURVE_POINTS = 50         # loss curves are smoothed to about this many independent points
IDENTICAL = 1e-12         # a difference this small (relative) counts as none


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
