"""One figure style for the pipeline's figures (dpbench.report.plots) and the claims ledger's
(dpbench.claims.figures): sizes, colours, panel grids, titles that fit their panel, notes and
footnotes sized from their drawn text, legends, placeholders and byte-stable PNG output.

Figures are drawn on the Agg canvas without pyplot (no global state), with fixed panel sizes
and dpi, and saved without the Software/date metadata, so the same data give the same bytes.
What a drawn artist shows is in its gid (data_gid, reference_gid), for readers of a drawn
figure such as the tests.
"""
from __future__ import annotations

import io
import math
import re
import textwrap
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import Formatter, NullFormatter, StrMethodFormatter

from dpbench import VARIANTS, results

PANEL_IN = (4.2, 3.2)     # inches per panel
LEGEND_IN = 1.7           # inches kept for the legend right of the panels
DPI = 110
MAX_COLS = 4              # panels per row before a grid wraps
# The colorblind palette's first colours in the variants' order, but the sharded variants' own:
# its light pink (next in line) is hard to tell from ddp's, so fsdp and hsdp take sky blue and yellow.
COLORBLIND = sns.color_palette("colorblind", 10)
PALETTE = dict(zip(VARIANTS, [COLORBLIND[i] for i in (0, 1, 2, 3, 4, 5, 9, 8)]))
OTHER_COLOR = "0.45"      # variants this module does not know yet
REFERENCE_COLOR = "0.3"   # ideal lines, zero lines
TITLE_CHARS = 50          # characters per line of a panel title at PANEL_IN's width
SHARE_RATIO = 2.0         # panels share a y scale when their tops differ by less than this
NOTE_INSET = 0.03         # a note's distance from the panel's edges (axes fraction)
NOTE_BOX = dict(boxstyle="round,pad=0.25", fc="white", ec="0.8", alpha=0.9)
# Where a panel title may break: after a phrase's separator, so "batch 512" stays whole.
PHRASE_END = re.compile(r"(?<=, )|(?<= · )|(?<= \+ )")
DATA, REFERENCE = "data:", "reference:"   # gid prefixes of drawn artists
PLACEHOLDER = "placeholder"                # the gid of a placeholder's one panel


def data_gid(variant: str) -> str:
    """The gid of an artist that draws a variant's measurements."""
    return DATA + variant


def reference_gid(what: str) -> str:
    """The gid of a line drawn for comparison (an ideal, 1.0, 0), not measured."""
    return REFERENCE + what


def palette(variants: Sequence[str]) -> dict[str, object]:
    return {v: PALETTE.get(v, OTHER_COLOR) for v in variants}


def color(variant: str) -> object:
    return PALETTE.get(variant, OTHER_COLOR)


def new_figure(n_rows: int = 1, n_cols: int = 1, legend: bool = True,
               sharey: bool = True) -> tuple[Figure, list]:
    """A constrained-layout figure of n_rows × n_cols panels (a list of rows of axes)."""
    width = PANEL_IN[0] * n_cols + (LEGEND_IN if legend else 0)
    fig = Figure(figsize=(width, PANEL_IN[1] * n_rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)   # the canvas it is saved with, whose renderer measures notes
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharey=sharey)
    return fig, axes


def panel_grid(n: int, n_cols: int | None = None, legend: bool = True,
               row_breaks: Sequence[int] = ()) -> tuple[Figure, list[Axes]]:
    """Exactly n panels (no empty ones), wrapped at n_cols (default: up to MAX_COLS).

    row_breaks: panel indices that start a new row (e.g. the first weak-scaling panel).
    Slots a wrap leaves unused are removed from the figure.
    """
    n_cols = max(1, min(n_cols or MAX_COLS, n))
    slots, col = [], 0
    row = 0
    for i in range(n):
        if i and (col == n_cols or i in row_breaks):
            row, col = row + 1, 0
        slots.append((row, col))
        col += 1
    fig, grid = new_figure(row + 1, n_cols, legend=legend, sharey=False)
    used = set(slots)
    for r, cells in enumerate(grid):
        for c, ax in enumerate(cells):
            if (r, c) not in used:
                fig.delaxes(ax)
    return fig, [grid[r][c] for r, c in slots]


def panel_title(ax: Axes, text: str) -> None:
    """A panel title wrapped to the panel's width, so neighbours' titles never overlap. Lines
    break between phrases (after ', ', ' + ' or ' · ', the last dropped at a break), never
    inside one ("batch 512", "20 warm-up steps"); only a phrase longer than a line breaks
    between its words."""
    lines = [""]
    for phrase in PHRASE_END.split(text):
        if lines[-1] and len((lines[-1] + phrase).rstrip()) > TITLE_CHARS:
            lines.append("")
        lines[-1] += phrase
    wrapped = [w for line in lines
               for w in textwrap.wrap(line.rstrip().removesuffix(" ·"), TITLE_CHARS,
                                      break_on_hyphens=False) or [line]]
    ax.set_title("\n".join(wrapped))


def figure_title(fig: Figure, text: str) -> None:
    """The figure's title, wrapped to the figure's width (constrained layout keeps it clear of
    the panels)."""
    chars = max(30, int(fig.get_figwidth() * 10.5))
    fig.suptitle("\n".join(textwrap.wrap(text, chars, break_on_hyphens=False)))


def placeholder(title: str, message: str) -> Figure:
    """A figure that says why there is nothing to draw."""
    fig, axes = new_figure(legend=False)
    ax = axes[0][0]
    ax.set_axis_off()
    ax.set_gid(PLACEHOLDER)
    # Wrapped here: matplotlib's own wrap measures against the figure before a tight save crops it.
    ax.text(0.5, 0.5, textwrap.fill(message, 48), ha="center", va="center", transform=ax.transAxes)
    figure_title(fig, title)
    return fig


def data_in_axes(ax: Axes, samples: int = 24) -> np.ndarray:
    """Every drawn data point of a panel in axes fractions (0..1 inside it): line vertices and
    points along their segments, scatter points, error bar ends, bands' outlines, bar tops."""
    to_axes = ax.transAxes.inverted()
    parts = []
    for line in ax.lines:
        xy = line.get_xydata()
        xy = to_axes.transform(line.get_transform().transform(xy[np.isfinite(xy).all(axis=1)]))
        parts.append(xy)
        if line.get_linestyle() not in ("None", "none", "", " ") and len(xy) > 1:
            t = np.linspace(0, 1, samples)[:, None, None]
            parts.append((xy[:-1] + t * (xy[1:] - xy[:-1])).reshape(-1, 2))
    for coll in ax.collections:
        if isinstance(coll, LineCollection):
            segs = [s for s in coll.get_segments() if len(s)]
            if segs:
                parts.append(to_axes.transform(coll.get_transform().transform(np.concatenate(segs))))
        elif isinstance(coll, PathCollection):   # scatter points
            parts.append(to_axes.transform(coll.get_offset_transform().transform(coll.get_offsets())))
        else:   # the outline of a band (fill_between)
            parts += [to_axes.transform(coll.get_transform().transform(path.vertices))
                      for path in coll.get_paths()]
    for patch in ax.patches:
        if isinstance(patch, Rectangle):
            (x0, _), (x1, y1) = patch.get_bbox().get_points()
            parts.append(to_axes.transform(patch.get_data_transform().transform([[(x0 + x1) / 2, y1]])))
    return np.concatenate(parts) if parts else np.empty((0, 2))


def place_notes(fig: Figure, notes: Sequence[tuple[Axes, str]]) -> None:
    """Short remarks inside panels (e.g. curves that coincide) on a white box, each in the
    first corner of top right, top left, bottom right, bottom left of its panel whose box covers
    no data; where each would, the y range grows at the top to free the top right. The boxes
    are measured as drawn, in the panels' final size: call this last, once data, limits,
    titles, legend and footnote are in place."""
    if not notes:
        return
    if (layout := fig.get_layout_engine()) is not None:
        layout.execute(fig)
    renderer = fig.canvas.get_renderer()
    for ax, text in notes:
        art = ax.text(1 - NOTE_INSET, 1 - NOTE_INSET, text, transform=ax.transAxes, ha="right",
                      va="top", fontsize="small", zorder=5, bbox=NOTE_BOX, in_layout=False)
        art.update_bbox_position_size(renderer)
        box, panel = art.get_bbox_patch().get_window_extent(renderer), ax.get_window_extent(renderer)
        w, h = box.width / panel.width, box.height / panel.height
        pts = data_in_axes(ax)
        for top, right in ((True, True), (True, False), (False, True), (False, False)):
            x0, x1 = (1 - NOTE_INSET - w, 1.0) if right else (0.0, NOTE_INSET + w)
            y0, y1 = (1 - NOTE_INSET - h, 1.0) if top else (0.0, NOTE_INSET + h)
            inside = (pts[:, 0] >= x0) & (pts[:, 0] <= x1) & (pts[:, 1] >= y0) & (pts[:, 1] <= y1)
            if not inside.any():
                break
        else:
            top, right = True, True
            _grow_top(ax, float(pts[:, 1].max()), 1 - NOTE_INSET - h - 0.02)
        art.set_position((1 - NOTE_INSET if right else NOTE_INSET, 1 - NOTE_INSET if top else NOTE_INSET))
        art.set_horizontalalignment("right" if right else "left")
        art.set_verticalalignment("top" if top else "bottom")


def footnote(fig: Figure, texts: Sequence[str]) -> None:
    """One line under the panels: the first of `texts` (longest, most detailed first) whose
    drawn width fits the figure; none for no texts."""
    if not texts:
        return
    renderer = fig.canvas.get_renderer()
    for text in texts:
        art = fig.supxlabel(text, x=0.01, ha="left", fontsize="small", color=REFERENCE_COLOR)
        if art.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            break


def _grow_top(ax: Axes, highest: float, below: float) -> None:
    """Raise the top of the y range until the highest data point (an axes fraction) lies at
    `below` (on the axis' own scale, linear or log)."""
    scale = ax.transScale
    lo, hi = ax.get_ylim()
    s_lo, s_hi = scale.transform([[0, lo], [0, hi]])[:, 1]
    s_top = s_lo + (s_hi - s_lo) * highest / below
    ax.set_ylim(lo, scale.inverted().transform([[0, s_top]])[0, 1])


def variant_handle(variant: str, bars: bool = False) -> Line2D | Patch:
    if bars:
        return Patch(color=color(variant), label=variant)
    return Line2D([], [], color=color(variant), marker="o", label=variant)


def add_legend(fig: Figure, variants: Sequence[str], bars: bool = False,
               extra: Sequence[Line2D | Patch] = ()) -> None:
    """One legend for the whole figure, right of the panels, so every panel keeps its width."""
    fig.legend(handles=[variant_handle(v, bars) for v in variants] + list(extra),
               loc="outside right center", frameon=False, title="variant")


def fit_y(axes: Sequence[Axes], tops: Sequence[float], bottoms: Sequence[float] | None = None,
          log: bool | Sequence[bool] = False, margin: float = 0.08) -> None:
    """y limits that hold every point. Panels share one range when they share a scale and their
    tops are within SHARE_RATIO of each other (easier to compare); otherwise each panel gets its
    own. `log` (one flag, or one per panel) puts a panel on a log scale; its bottoms must be > 0."""
    n = len(axes)
    bottoms = list(bottoms) if bottoms is not None else [0.0] * n
    logs = list(log) if isinstance(log, (list, tuple)) else [bool(log)] * n
    finite = [t for t in tops if t is not None and math.isfinite(t) and t > 0]
    shared = (bool(finite) and len(set(logs)) == 1 and max(finite) / min(finite) <= SHARE_RATIO)
    for ax, top, bottom, is_log in zip(axes, tops, bottoms, logs):
        if top is None or not math.isfinite(top):
            continue
        hi = max(finite) if shared else top
        lo = min(b for b in bottoms if math.isfinite(b)) if shared else bottom
        if is_log:
            ax.set_yscale("log")
            ax.set_ylim(lo / (1 + margin * 3), hi * (1 + margin * 3))
            ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            span = (hi - lo) or abs(hi) or 1.0
            ax.set_ylim(lo - (margin * span if lo < 0 else 0), hi + margin * span)


class _Thousands(Formatter):
    """Thousands separators, and as many decimals as the ticks need to differ (0.25, 0.5, ...
    on a small axis: never 0, 0, 0, 1, 1)."""

    def set_locs(self, locs):
        self.ticks = [float(v) for v in locs]

    def __call__(self, x, pos=None):
        locs = getattr(self, "ticks", None) or [float(x)]
        digits = next((d for d in range(7) if all(abs(round(v, d) - v) <= 1e-9 * max(1.0, abs(v)) for v in locs)), 6)
        return f"{x:,.{digits}f}"


def thousands(ax: Axes) -> None:
    """y tick labels with thousands separators (12,000 rather than 12000), and decimals where
    the ticks are fractions."""
    if ax.get_yscale() == "linear":
        ax.yaxis.set_major_formatter(_Thousands())


@contextmanager
def style() -> Iterator[None]:
    """dpbench's look, as context managers: the caller's matplotlib settings stay untouched."""
    with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.8):
        yield


def save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    results.write_atomic(path, buf.getvalue())
