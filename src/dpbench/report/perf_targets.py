"""The perf targets in words and pictures: targets.md (the targets table, DDP's cells with their
knobs, the single-GPU recipes, how far images/s is from what the median step time implies),
targets.json (dpbench.analysis.perf_targets' and perf_tables' rows as they are), what each step
of the fast single-GPU recipe buys (recipe_steps.png) and DDP's throughput against bucket size
(bucket_sweep.png). A benchmark's report, not a test: it prints and never fails.

    dpbench perf-targets [results/perf-torch-<version>] [--default-experiment DIR]
        [--md FILE] [--json FILE] [--figure FILE.png] [--sweep-figure FILE.png]

A gap between images/s and what the median step time implies means untimed work crept into the
timed steps, or a few slow steps: both worth a look.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dpbench import results
from dpbench.analysis import options
from dpbench.analysis.experiment_time import default_experiment_row
from dpbench.analysis.perf_cells import BucketDefault, Cell, load_cells, why_unmeasured
from dpbench.analysis.perf_tables import agreement_rows, fastest_rows, recipe_rows, sweep_rows
from dpbench.analysis.perf_targets import NOT_MEASURED, target_rows
from dpbench.host.source import PROJECT

# matplotlib and seaborn (the optional [plots] extra) and figstyle, which imports them, load only
# where a figure is drawn: the tables and targets.json need neither.


def find_result_set(given: str | None) -> Path:
    if given:
        path = Path(given)
        return path.parent if path.name in ("summary.csv", "runs.csv") else path
    # runs.csv: what the targets read (a set collected before it existed: collect it again)
    found = sorted((PROJECT / "results").glob("perf-*/runs.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit("no results/perf-*/runs.csv: run the perf experiment first "
                 "(snakemake --cores all --config experiment=perf), or name the result set")
    return found[-1].parent


# -- targets.md -------------------------------------------------------------------------------------

def epoch_words(cells: list[Cell]) -> str:
    """'epoch = 50,000 images', or what the cells' training splits are when they differ."""
    sizes = sorted({c.train_size for c in cells if c.train_size})
    if len(sizes) == 1:
        return f"epoch = {sizes[0]:,} images"
    return "epoch = each run's training split" if sizes else "no run names its training split"


def fmt(value, spec: str = ",.0f") -> str:
    return "" if value is None else format(value, spec)


def outcome_counts(rows: list[dict]) -> str:
    """'2 pass, 1 FAIL, 12 not measured (of 15 rows)'."""
    counts = [(o, sum(r["outcome"] == o for r in rows)) for o in ("pass", "FAIL", NOT_MEASURED)]
    return ", ".join(f"{n} {o}" for o, n in counts if n) + f" (of {len(rows)} rows)"


GOAL = {"epoch": "<= {:g} s", "ratio": ">= {:g}", "wall": "<= {:g} min"}
MEASURED = {"epoch": ".2f", "ratio": ".3f", "wall": ".1f"}


def markdown(folder: Path, cells: list[Cell], targets: list[dict]) -> str:
    lines = [f"# Performance targets: {folder.name}", "", f"Targets: {outcome_counts(targets)}.", "",
             "| target | goal | DDP knobs | measured | interval | images/s | baseline images/s | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in targets:
        lines.append(f"| {r['target']} | {GOAL[r['kind']].format(r['goal'])} | {r['setting']} | "
                     f"{fmt(r['measured'], MEASURED[r['kind']])} | {r['interval']} | "
                     f"{fmt(r.get('images_per_s'))} | {fmt(r.get('baseline_images_per_s'))} | {r['verdict']} |")
    lines += ["", "## DDP: knobs", ""]
    sweep = sweep_rows(cells)
    if sweep:
        lines += ["vs GPUs x single: images/s over GPUs x the single run of the same setup at the "
                  f"per-GPU batch ({epoch_words(cells)}).", "",
                  "| GPUs | layout | scaling | global batch | bucket | knobs | compile | compile (s) | "
                  "images/s | vs GPUs x single |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sweep:
            eff = fmt(r["efficiency"], ".3f") + (f" ({r['efficiency_interval']})"
                                                  if r["efficiency_low"] is not None else "")
            bucket = (f"{r['bucket_mb']:g} MB" if r["bucket_mb"] is not None else "unknown") + (
                f" ({r['bucket_note']})" if r["bucket_note"] else "")
            lines.append(f"| {r['gpus']} | {r['layout']} | {r['scaling']} | {r['global_batch']} | {bucket} | "
                         f"{r['knobs']} | {r['compile']} | {fmt(r['compile_s'], '.1f')} | "
                         f"{fmt(r['images_per_s'])} | {eff or 'no single run of its setup'} |")
    else:
        lines.append(f"No DDP cell was measured{ddp_unmeasured_words(cells)}.")
    lines += ["", "## One GPU, fastest first", "", f"{epoch_words(cells).capitalize()}.", "",
              "| recipe | images/s | epoch (s) | compile (s) |", "|---|---|---|---|"]
    lines += [f"| {r['recipe']} | {fmt(r['images_per_s'])} | {fmt(r['epoch_s'], '.2f')} | {fmt(r['compile_s'], '.1f')} |"
              for r in fastest_rows(cells)]
    agree = agreement_rows(cells)
    if agree:
        worst = agree[0]
        lines += ["", f"images/s against batch / p50 step time: worst gap {worst['gap']:+.1%} "
                      f"({worst['cell']}: {worst['images_per_s']:,.0f} vs {worst['from_p50']:,.0f}); "
                      f"{sum(abs(r['gap']) > 0.03 for r in agree)} of {len(agree)} cells beyond 3%"]
    skipped = [c for c in cells if c.images_per_s is None]
    if skipped:
        lines += ["", "Cells without a measurement:"]
        lines += [f"- {c.cell}: {', '.join(sorted(set(c.status)))}"
                  f"{': ' + c.reasons[0][:160] if c.reasons else ''}" for c in skipped]
    return "\n".join(lines) + "\n"


def ddp_unmeasured_words(cells: list[Cell]) -> str:
    """' (10 cells skipped: needs 2 GPUs, 1 visible)': why the DDP cells have no measurement."""
    ddp = [c for c in cells if c.settings.get("variant") == "ddp" and c.images_per_s is None]
    if not ddp:
        return ""
    whys = sorted({why_unmeasured(c) for c in ddp})
    return f" ({len(ddp)} cell{'s' if len(ddp) > 1 else ''} {'; '.join(whys)})"


def machine_words(folder: Path) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130' from the result set's provenance (its name without one)."""
    try:
        prov = results.ResultSet.at(folder).provenance()
    except (OSError, ValueError):
        return folder.name
    gpus = results.gpu_models(prov)
    torch = results.provenance_values(prov, "torch")
    words = ", ".join(x for x in [" / ".join(gpus), torch and "torch " + " / ".join(map(str, torch))] if x)
    return words or folder.name


# -- the recipe figure ---------------------------------------------------------------------------

def _speed_words(images_per_s: float, epoch_s: float | None) -> str:
    return f"{images_per_s:,.0f} img/s" + (f" · {epoch_s:.2f} s/epoch" if epoch_s is not None else "")


def _bar_words(row: dict, step_above: str | None) -> str:
    if row["images_per_s"] is None:
        return f"{NOT_MEASURED} ({row['why']})"
    words = _speed_words(row["images_per_s"], row["epoch_s"])
    if row["kind"] == "ceiling":
        return words + (f" · the real feed reaches {row['reached']:.1%} of it" if row.get("reached") else "")
    if row.get("gain") is not None:
        words += f" · {row['gain']:+.0%}"
        if row["over"] != step_above:
            words += f" over {row['over']}"
    if row.get("compile_s") is not None:
        words += f" · compiled in {row['compile_s']:.0f} s"
    return words


CHAR_FRACTION = 0.0068   # of an 11.5-inch figure's panel, at the "small" font


def _bars(ax, rows: list[dict], labels: list[str], words: list[str], colors: list, hatches: list,
          xlabel: str) -> float:
    """Bars top to bottom, each with its words right of its end; returns the x limit that leaves
    every bar's words room (a character takes about CHAR_FRACTION of the panel's width)."""
    y = list(range(len(rows)))
    values = [r["images_per_s"] or 0 for r in rows]
    ax.barh(y, values, color=colors, hatch=hatches, edgecolor="0.35", linewidth=0.6, height=0.7)
    top = max(values) or 1.0
    for yi, value, text in zip(y, values, words):
        ax.annotate(text, (value, yi), xytext=(4, 0), textcoords="offset points", va="center",
                    ha="left", fontsize="small")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"images/s ({xlabel})")
    ax.grid(axis="y", visible=False)
    from matplotlib.ticker import StrMethodFormatter   # the [plots] extra, only for a figure (see the top)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    return max(value / max(0.2, 1 - 0.02 - CHAR_FRACTION * len(w)) for value, w in zip(values + [top], words + [""]))


def recipe_figure(folder: Path, cells: list[Cell]):
    """Horizontal bars, one per recipe step (and fixed-batch ceiling); a second panel with the
    measured DDP cells when there are any."""
    import seaborn as sns   # the [plots] extra, only for a figure (see the top)
    from matplotlib.figure import Figure
    from dpbench.report import figstyle   # imports matplotlib (see the top)

    ladder = recipe_rows(cells)
    sweep = sweep_rows(cells)
    steps = [r for r in ladder if r["kind"] == "step"]
    blues = sns.color_palette("crest", max(2, len(steps)))
    heights = [max(1, len(ladder))] + ([len(sweep)] if sweep else [])
    fig = Figure(figsize=(11.5, 1.5 + 0.42 * sum(heights) + (0.6 if sweep else 0)), dpi=figstyle.DPI,
                 layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, height_ratios=heights)[:, 0]
    some = next((c.settings for c in cells if c.settings.get("variant") == "single"), {})
    ax = axes[0]
    if ladder:
        colors, hatches, labels, words, i, above = [], [], [], [], 0, None
        for r in ladder:
            if r["kind"] == "step":
                colors.append(blues[i])
                hatches.append(None)
                i += 1
            else:
                colors.append("0.88")
                hatches.append("//")
            labels.append(r["label"])
            words.append(_bar_words(r, above))
            if r["kind"] == "step" and r["images_per_s"]:
                above = r["label"]
        right = _bars(ax, ladder, labels, words, colors, hatches, epoch_words(cells))
    else:
        right = 0.0
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no single-GPU cell of the recipe in this result set", ha="center",
                va="center", transform=ax.transAxes)
    # the panels are wide: one-line titles (figstyle.panel_title wraps for narrow panels)
    ax.set_title(f"One GPU · batch 512 · {some.get('dataset', '?')}, gpu feed · "
                 f"%: gain over the step above")
    if sweep:
        ax2 = axes[1]
        labels = [f"{options.gpus_label(r['gpus'])} · {r['layout']} · {r['scaling']}\n{r['setting']}"
                  + ("" if r["compile"] == "none" else f" · compile {r['compile']}") for r in sweep]
        words = [_speed_words(r["images_per_s"], r["epoch_s"])
                 + (f" · {r['efficiency']:.2f} of {r['gpus']} x single" if r["efficiency"] else "")
                 for r in sweep]
        palette = sns.color_palette("flare", len(sweep))
        right = max(right, _bars(ax2, [{"images_per_s": r["images_per_s"]} for r in sweep], labels,
                                 words, list(palette), [None] * len(sweep), epoch_words(cells)))
        ax2.set_title("DDP: knobs · x single: images/s over GPUs x single at the per-GPU batch")
    for a in axes:   # one images/s scale for both panels
        if a.axison:
            a.set_xlim(0, right)
    figstyle.figure_title(fig, f"What each step of the fast recipe buys ({machine_words(folder)})")
    if not sweep:   # the caption says why the DDP knobs have no panel
        fig.supxlabel(f"DDP knobs: no panel, no DDP cell was measured{ddp_unmeasured_words(cells)}",
                      fontsize="small", color="0.3")
    return fig


# -- the bucket-size figure ----------------------------------------------------------------------

def sweep_panels(rows: list[dict]) -> dict[tuple, dict[str, list[dict]]]:
    """The DDP cells with a known bucket size: one panel per GPU count, layout, scaling and
    per-GPU batch; in it one line per knobs and compile mode, its points by bucket size."""
    panels: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r["bucket_mb"] is not None:
            line = r["knobs"] + ("" if r["compile"] == "none" else f", compile {r['compile']}")
            panel = panels.setdefault((r["gpus"], r["layout"], r["scaling"], r["per_gpu_batch"]), {})
            panel.setdefault(line, []).append(r)
    return {k: {line: sorted(pts, key=lambda r: r["bucket_mb"]) for line, pts in sorted(v.items())}
            for k, v in sorted(panels.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2] != "weak"))}


def sweep_figure(folder: Path, cells: list[Cell]):
    """DDP's images/s against its bucket size (log scale): one panel per GPU count, layout and
    scaling (each its own images/s scale), one line per knobs setting (one colour each across
    panels); open markers where the size is PyTorch's default, bars where repeats give an
    interval."""
    import seaborn as sns   # the [plots] extra, only for a figure (see the top)
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    from dpbench.report import figstyle   # imports matplotlib (see the top)

    rows = sweep_rows(cells)
    panels = sweep_panels(rows)
    title = f"DDP throughput against bucket size ({machine_words(folder)})"
    if not panels:
        why = (f"no DDP cell was measured{ddp_unmeasured_words(cells)}" if not rows else
               f"no measured DDP cell has a known bucket size ({rows[0]['bucket_note']})")
        return figstyle.placeholder(title, why)
    knobs = sorted({line for panel in panels.values() for line in panel})
    colors = dict(zip(knobs, sns.color_palette("colorblind", len(knobs))))
    sizes = sorted({r["bucket_mb"] for panel in panels.values() for pts in panel.values() for r in pts})
    fig, axes = figstyle.panel_grid(len(panels), n_cols=min(3, len(panels)))
    defaults = False
    for ax, ((gpus, layout, scaling, per_gpu), panel) in zip(axes, panels.items()):
        for line, pts in panel.items():
            x, y = [r["bucket_mb"] for r in pts], [r["images_per_s"] for r in pts]
            ax.plot(x, y, "-", marker="o", color=colors[line])
            shown = [r for r in pts if r["images_per_s_low"] is not None]
            if shown:
                ax.errorbar([r["bucket_mb"] for r in shown], [r["images_per_s"] for r in shown],
                            yerr=[[r["images_per_s"] - r["images_per_s_low"] for r in shown],
                                  [r["images_per_s_high"] - r["images_per_s"] for r in shown]],
                            fmt="none", ecolor=colors[line], capsize=3)
            unset = [r for r in pts if r["bucket_note"]]
            if unset:
                defaults = True
                ax.plot([r["bucket_mb"] for r in unset], [r["images_per_s"] for r in unset], "o",
                        mfc="white", mec=colors[line], zorder=3)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlim(sizes[0] / 1.6, sizes[-1] * 1.6)
        ax.margins(y=0.25)
        figstyle.thousands(ax)
        ax.set_xlabel("bucket_cap_mb (MB, log scale)")
        ax.set_ylabel("images/s")
        batch = f"{per_gpu} per GPU" if scaling == "weak" else f"global batch {per_gpu * gpus}"
        figstyle.panel_title(ax, f"{options.gpus_label(gpus)} · {layout} · {scaling} scaling, {batch}")
    handles = [Line2D([], [], color=colors[k], marker="o", label=k) for k in knobs]
    if defaults:
        handles.append(Line2D([], [], color="0.4", marker="o", mfc="white", ls="none",
                              label="PyTorch's default size\n(bucket_cap_mb unset)"))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="DDP knobs")
    figstyle.figure_title(fig, title)
    return fig


def write_figure(draw, folder: Path, cells: list[Cell], path: Path) -> None:
    import matplotlib   # the [plots] extra, only for a figure (see the top)
    matplotlib.use("Agg")
    from dpbench.report import figstyle   # imports matplotlib (see the top)
    with figstyle.style():
        fig = draw(folder, cells)
    figstyle.save(fig, path)


def main(argv: list[str] | None = None, pytorch_bucket: BucketDefault | None = None) -> int:
    """The command; `pytorch_bucket` says DDP's default bucket size (dpbench.cli hands in the
    torch one's: this layer never imports torch)."""
    p = argparse.ArgumentParser(prog="dpbench perf-targets",
                                description="The performance targets, read off the perf experiment's results.")
    p.add_argument("results", nargs="?", help="the perf result set (folder or its summary.csv)")
    p.add_argument("--default-experiment", type=Path,
                   help="the default experiment's result set, for the whole-experiment time (default: the perf set)")
    p.add_argument("--md", type=Path, help="also write the tables here (markdown)")
    p.add_argument("--json", type=Path, help="also write the target rows here")
    p.add_argument("--figure", type=Path, help="also draw what each step of the fast recipe buys here (png)")
    p.add_argument("--sweep-figure", type=Path, help="also draw DDP's throughput against bucket size here (png)")
    args = p.parse_args(argv)
    folder = find_result_set(args.results)
    cells = load_cells(folder, pytorch_bucket)
    targets = target_rows(cells) + [default_experiment_row(args.default_experiment or folder)]
    text = markdown(folder, cells, targets)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"result_set": folder.name, "targets": targets,
                                         "sweep": sweep_rows(cells), "single": fastest_rows(cells),
                                         "agreement": agreement_rows(cells),
                                         "recipe": recipe_rows(cells)}, indent=1) + "\n")
    if args.figure:
        write_figure(recipe_figure, folder, cells, args.figure)
    if args.sweep_figure:
        write_figure(sweep_figure, folder, cells, args.sweep_figure)
    return 0
