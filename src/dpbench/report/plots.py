"""Every figure of one result set (results.FIGURE_NAMES) from its tidy csv tables, and the
throughput and scaling-efficiency figures themselves, which share the ideal lines.

    python -m dpbench.report.plots --results-dir results --tag TAG

Every figure of results.FIGURE_NAMES is always written, because the pipeline declares them as
outputs: when there is nothing to draw, the figure says why in its centre. Panels come from the
data present (an option set or GPU count without ok runs gets no panel, and a line under the
figure names the cells that have runs but no ok one), titles say the option set in words, and
each panel's y range holds all of its points. The other figures are drawn by
dpbench.report.curve_plots, memory_plot and warnings_plot, from the shared pieces of
dpbench.report.panels.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from dpbench import results
from dpbench.analysis.collect import read_cells
from dpbench.analysis.cell_table import reference_batch, single_pools, with_efficiency
from dpbench.analysis.options import STRONG, WEAK, variant_order, without_batch
from dpbench.analysis.tables import load_table, ok_runs, speed_runs
from dpbench.report.option_words import describe, labels
from dpbench.report.figstyle import (
    REFERENCE_COLOR,
    add_legend,
    figure_title,
    fit_y,
    panel_grid,
    panel_title,
    placeholder,
    reference_gid,
    save,
    style,
    thousands,
)
from dpbench.report.curve_plots import plot_accuracy, plot_loss_curves, plot_loss_vs_single
from dpbench.report.memory_plot import plot_memory
from dpbench.report.panels import (
    Tables,
    finish,
    gpu_ticks,
    interval_words,
    on_cpu,
    on_cpu_words,
    option_panels,
    panel_medians,
    points_medians_intervals,
    span_is_wide,
    why_empty,
)
from dpbench.report.warnings_plot import plot_warnings

# Also imported from here: by the sharding figures (Tables, finish, why_empty, on_cpu) and by
# tests, which patch points_medians_intervals and ideal_points where the figures look them up.
__all__ = ["DRAW", "draw_all", "load_tables", "Tables", "finish", "why_empty", "on_cpu",
           "points_medians_intervals", "ideal_points", "plot_throughput", "plot_scaling_efficiency",
           "plot_memory", "plot_loss_curves", "plot_loss_vs_single", "plot_accuracy", "plot_warnings",
           "NO_IDEAL", "save_all", "main"]

IDEAL_STYLE = {STRONG: dict(ls="--", lw=1, color=REFERENCE_COLOR, marker="_", ms=12),
               WEAK: dict(ls=":", lw=1.4, color=REFERENCE_COLOR, marker="_", ms=12)}
IDEAL_LABEL = {STRONG: "ideal, strong:\nGPUs × single at the\nsame global batch",
               WEAK: "ideal, weak:\nGPUs × single at the\nper-GPU batch"}
NO_IDEAL = "no single run at this batch:\nno ideal line"


def ideal_points(panel: pd.DataFrame, pools: dict, kind: str) -> tuple[list[int], list[float]]:
    """Where `kind` is how the panel's runs were planned: a line from one GPU, GPUs × single at
    the panel's fixed batch. Otherwise one mark per multi-GPU count, against single at the batch
    that kind asks for (which varies with the count). ([], []) without such single runs."""
    r0, xs, ys = panel.iloc[0], [], []
    if kind == r0["scaling"]:
        pool = pools.get((r0["setup"], reference_batch(kind, r0["global_batch"], r0["per_gpu_batch"])))
        if pool is not None:
            xs = sorted({1} | {int(g) for g in panel["gpus"]})
            ys = [float(np.median(pool)) * k for k in xs]
        return xs, ys
    for k, rows in panel[panel["gpus"] > 1].groupby("gpus", sort=True):
        r = rows.iloc[0]
        pool = pools.get((r["setup"], reference_batch(kind, r["global_batch"], r["per_gpu_batch"])))
        if pool is not None:
            xs.append(int(k))
            ys.append(float(np.median(pool)) * int(k))
    return xs, ys


def plot_throughput(t: Tables) -> Figure:
    title = "Training throughput"
    ok = speed_runs(ok_runs(t["summary"])).dropna(subset=["rate"])   # rehearsed runs: no speed
    if ok.empty:
        return placeholder(title, why_empty(t["summary"], "no throughput measured"))
    pools = single_pools(ok)
    variants = variant_order(ok["variant"])
    panels = option_panels(ok)
    fig, axes = panel_grid(len(panels))
    tops, bottoms, kinds_drawn, meds, logs, notes = [], [], set(), [], [], []
    for ax, panel in zip(axes, panels):
        meds.append(panel_medians(t["cells"], panel, "rate"))
        values = points_medians_intervals(ax, panel, meds[-1], "rate", variants)
        xs_all = set(panel["gpus"])
        for kind in (STRONG, WEAK):
            xs, ys = ideal_points(panel, pools, kind)
            if xs:
                line = dict(IDEAL_STYLE[kind], **({} if kind == panel["scaling"].iloc[0] else {"ls": "none"}))
                ax.plot(xs, ys, **line, zorder=1, gid=reference_gid(f"ideal {kind}"))
                values += ys
                xs_all |= set(xs)
                kinds_drawn.add(kind)
        if not any(ideal_points(panel, pools, k)[0] for k in (STRONG, WEAK)):
            notes.append((ax, NO_IDEAL))
        gpu_ticks(ax, xs_all, on_cpu(ok))
        panel_title(ax, panel["label"].iloc[0])
        logs.append(span_is_wide(values))
        tops.append(max(values))
        bottoms.append(min(values) if logs[-1] else 0.0)
    fit_y(axes, tops, bottoms, log=logs)
    for ax, is_log, panel in zip(axes, logs, panels):   # each panel in its workload's unit
        unit = str(panel["rate_unit"].iloc[0])
        ax.set_ylabel(f"{unit} (log scale)" if is_log else unit)
        thousands(ax)
    add_legend(fig, variants, extra=[Line2D([], [], **IDEAL_STYLE[k], label=on_cpu_words(IDEAL_LABEL[k], on_cpu(ok)))
                                     for k in (STRONG, WEAK) if k in kinds_drawn])
    figure_title(fig, f"{title} (points: repeats; line: medians; "
                 f"{interval_words(pd.concat(meds), 'rate')})")
    return finish(fig, t["summary"], notes)


def efficiency_panels(eff_runs: pd.DataFrame, cells: pd.DataFrame
                      ) -> list[tuple[str, str, pd.DataFrame, pd.DataFrame]]:
    """(kind, title, runs, medians) of every scaling panel with data: a strong panel holds one
    global batch of one setup, a weak panel one per-GPU batch (so its runs come from option sets
    of different global batches). Options the setup leaves out (DDP's knobs: every cell still
    compares with the same single runs) get panels of their own, never one merged point."""
    panels = []
    for kind in (STRONG, WEAK):
        col, q = ("global_batch" if kind == STRONG else "per_gpu_batch"), f"efficiency_{kind}"
        runs = eff_runs[(eff_runs["variant"] != "single") & eff_runs[q].notna()]
        runs = runs.assign(rest=runs["options"].map(lambda o: results.options_label(without_batch(o))))
        entries = []
        for key in runs[["setup", col, "rest"]].drop_duplicates().to_dict("records"):
            r = runs[(runs["setup"] == key["setup"]) & (runs[col] == key[col]) & (runs["rest"] == key["rest"])]
            if kind == WEAK and (r["gpus"] == 1).all():
                continue   # on one GPU weak is strong: the strong panel shows these points
            first = r.iloc[0]
            rest = without_batch(first["options"])
            words = describe(rest, first["precision"] or None,
                             key[col] if kind == STRONG else None,
                             key[col] if kind == WEAK else None, kind)
            order = (len(rest), describe(rest, first["precision"] or None), key[col])
            entries.append((order, f"{kind} scaling · {words}", r, panel_medians(cells, r, q)))
        panels += [(kind, head, r, m) for _, head, r, m in sorted(entries, key=lambda e: e[:2])]
    return panels


def plot_scaling_efficiency(t: Tables) -> Figure:
    title = "Scaling efficiency"
    ok = speed_runs(ok_runs(t["summary"])).dropna(subset=["rate"])   # rehearsed runs: no speed
    if ok.empty:
        return placeholder(title, why_empty(t["summary"], "no throughput measured"))
    panels = efficiency_panels(with_efficiency(ok), t["cells"])
    if not panels:
        return placeholder(title, on_cpu_words("no run has a single run to compare with\n(at its global batch "
                                               "or at its per-GPU batch)", on_cpu(ok)))
    variants = variant_order(pd.concat([p[2] for p in panels])["variant"])
    first_weak = next((i for i, p in enumerate(panels) if p[0] == WEAK), None)
    n_cols = max(sum(p[0] == STRONG for p in panels), sum(p[0] == WEAK for p in panels))
    fig, axes = panel_grid(len(panels), min(n_cols, 4),
                           row_breaks=[first_weak] if first_weak else [])
    tops = []
    for ax, (kind, head, runs, med) in zip(axes, panels):
        q = f"efficiency_{kind}"
        values = points_medians_intervals(ax, runs, med, q, variants)
        ax.axhline(1.0, **{k: v for k, v in IDEAL_STYLE[kind].items() if k not in ("marker", "ms")},
                   gid=reference_gid(f"1.0 {kind}"))
        gpu_ticks(ax, runs["gpus"], on_cpu(ok))
        ax.set_ylabel(on_cpu_words("throughput ÷ (GPUs × single)", on_cpu(ok)))
        panel_title(ax, head)
        tops.append(max(values + [1.0]))
    fit_y(axes, [max(1.1, t) for t in tops])
    add_legend(fig, variants, extra=[Line2D([], [], **IDEAL_STYLE[k], label=f"1.0 = ideal ({k})")
                                     for k in (STRONG, WEAK) if any(p[0] == k for p in panels)])
    against = {STRONG: "strong: against single at the same global batch",
               WEAK: on_cpu_words("weak: against single at the per-GPU batch", on_cpu(ok))}
    kinds = [k for k in (STRONG, WEAK) if any(p[0] == k for p in panels)]
    bars = interval_words(pd.concat([p[3].rename(columns=lambda c: c.replace(f"_{p[0]}", ""))
                                     for p in panels]), "efficiency", at_least=True)
    figure_title(fig, f"{title} ({'; '.join(against[k] for k in kinds)}; points: runs; "
                      f"line: medians; {bars})")
    return finish(fig, t["summary"])



# -- entry points ---------------------------------------------------------------------------

# Figure name (results.FIGURE_NAMES, in its order) -> how to draw it.
DRAW: dict[str, Callable[[Tables], Figure]] = dict(zip(results.FIGURE_NAMES, (
    plot_throughput, plot_scaling_efficiency, plot_memory, plot_loss_curves, plot_loss_vs_single,
    plot_accuracy, plot_warnings), strict=True))


def load_tables(results_dir: Path | str, tag: str) -> Tables:
    """The per-run tables, with each run's label (its option set in words) in the summary."""
    tables = {name: load_table(results_dir, tag, name) for name in results.TABLES
              if name not in ("medians", "summary", "cells")}
    tables["cells"] = read_cells(results_dir, tag)
    # runs.csv, under the name the figures know it by: its rows carry the plan's cell_id
    tables["summary"] = tables.pop("runs").pipe(lambda runs: runs.assign(label=labels(runs)))
    return tables


def save_all(tables: dict[str, pd.DataFrame], draw: dict[str, Callable], rs: results.ResultSet) -> list[Path]:
    """Draws each figure of `draw` from the tables to figures/<name>.png; returns the paths."""
    paths = []
    with style():
        for name, figure in draw.items():
            path = rs.figure_path(name)
            save(figure(tables), path)
            paths.append(path)
    return paths


def draw_all(results_dir: Path | str, tag: str) -> list[Path]:
    """Writes every figure of results.FIGURE_NAMES to figures/<name>.png; returns the paths."""
    return save_all(load_tables(results_dir, tag), DRAW, results.ResultSet(results_dir, tag))


def main(argv: list[str] | None = None, draw: Callable[[str, str], list[Path]] = draw_all,
         what: str = "figures") -> int:
    parser = argparse.ArgumentParser(description=f"Draw one tag's {what} from its tidy tables.")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", required=True)
    args = parser.parse_args(argv)
    for path in draw(args.results_dir, args.tag):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
