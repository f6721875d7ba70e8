"""Figures and summary.md from fake run records (no training, no GPU).

The mixed experiment below is what a user's own experiment looks like: several option sets
(fp32 and bf16 + channels_last, global batch 512 and 1024, one weak-scaling group, one without
any single run), 1-4 GPUs, throughputs that differ fourfold between option sets, skipped and
failed cells, one cell with a single repeat, and 1-GPU variants whose loss equals single's.
Every figure is checked as a reader would see it at the dpi it is saved with (fakes' checks):
every plotted point inside its axes, no panel without a variant's data, no text over another
or over a neighbouring panel, no note over data. Each check is also shown to fail on a figure
broken on purpose.
"""
from __future__ import annotations

import math
import re
from dataclasses import astuple

import matplotlib
import matplotlib.image
import numpy as np
import pytest
from fakes import (
    SYNTHETIC_PROVENANCE,
    dp_warning,
    drawn_artists,
    empty_panels,
    fake_result_set,
    is_placeholder,
    notes_over_data,
    outside_points,
    overlapping_texts,
    untagged,
)
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from dpbench import results
from dpbench.analysis.collect import read_cells
from dpbench.report import plots
from dpbench.report.figstyle import DATA, DPI, NOTE_BOX, REFERENCE, panel_grid, panel_title, save, style
from dpbench.report.markdown import md_table
from dpbench.report.plots import DRAW, NO_IDEAL, draw_all, load_tables
from dpbench.report.summarize import render_summary, write_summary_md

matplotlib.use("Agg")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SKIP_REASON = "needs 4 GPUs, 2 visible"


def drift(scale):
    """A loss that strays from single's by a visible, known amount."""
    return lambda s, r: 2.3 * math.exp(-s / 15) + 0.01 * r + scale * math.sin(s / 3)


FP32, FP32_1K, FP32_2K = {"global_batch": 512}, {"global_batch": 1024}, {"global_batch": 2048}
BF16 = {"global_batch": 512, "precision": "bf16", "channels_last": True}
BF16_1K = {"global_batch": 1024, "precision": "bf16", "channels_last": True}
WEAK = {"per_gpu_batch": 256}
MIXED = [
    dict(variant="single", options=FP32, images_per_s=[21700.0, 21800.0, 21900.0]),
    dict(variant="dp", gpus=1, options=FP32, images_per_s=[21500.0, 21600.0]),
    dict(variant="dp", gpus=2, options=FP32, images_per_s=[10200.0, 9300.0], memory=[2007, 1308],
         warnings=[dp_warning(98)], loss=drift(0.01)),
    dict(variant="dp_mean", gpus=2, options=FP32, images_per_s=[10000.0], memory=[2007, 1308],
         warnings=[dp_warning(3)], loss=drift(0.02)),
    dict(variant="ddp", gpus=1, options=FP32, images_per_s=[21000.0, 21200.0]),
    dict(variant="ddp", gpus=2, options=FP32, images_per_s=[36500.0, 35700.0],
         memory=[1716, 1716], loss=drift(0.005)),
    dict(variant="ddp", gpus=3, options=FP32, status="failed", images_per_s=None, memory=[],
         reason="NCCL error: rank 2 crashed"),
    dict(variant="dp", gpus=4, options=FP32, status="skipped", images_per_s=None,
         reason=SKIP_REASON),
    dict(variant="dp", gpus=2, options=FP32_1K, images_per_s=[15000.0, 15500.0],
         memory=[3500, 2300], loss=drift(0.01)),
    dict(variant="ddp", gpus=2, options=FP32_1K, images_per_s=[40000.0, 41000.0],
         memory=[2900, 2900], loss=drift(0.005)),
    dict(variant="single", options=BF16, images_per_s=[51000.0, 52000.0]),
    dict(variant="dp", gpus=1, options=BF16, images_per_s=[50500.0, 50000.0]),
    dict(variant="ddp", gpus=2, options=BF16, images_per_s=[88000.0, 90000.0], memory=[900, 900],
         loss=drift(0.005)),
    dict(variant="ddp", gpus=2, options=BF16_1K, images_per_s=[93000.0, 94000.0],
         memory=[1500, 1500], loss=drift(0.005)),
    dict(variant="single", options=WEAK, per_gpu_batch=256, images_per_s=[20000.0, 20400.0]),
    dict(variant="ddp", gpus=4, options=WEAK, per_gpu_batch=256, images_per_s=[70000.0, 71000.0],
         memory=[1200] * 4, loss=drift(0.005)),
    # no single run at 2048 nor at 1024 (its per-GPU batch): no ideal line, no efficiency
    dict(variant="ddp", gpus=2, options=FP32_2K, images_per_s=[42000.0, 42500.0],
         memory=[4500, 4500], loss=drift(0.005)),
]
# dp at a tiny batch is a fraction of single's speed (one process scatters 8 images to each of
# 4 GPUs), so with the ideal at 4 × single that panel spans more than 50×: a log axis there, a
# linear one beside it.
TINY_BATCH = [
    dict(variant="single", options={"global_batch": 32}, images_per_s=[9000.0, 9200.0]),
    dict(variant="dp", gpus=4, options={"global_batch": 32}, images_per_s=[150.0, 160.0]),
    dict(variant="ddp", gpus=4, options={"global_batch": 32}, images_per_s=[2400.0, 2500.0]),
    dict(variant="single", options=FP32, images_per_s=[21700.0, 21900.0]),
    dict(variant="ddp", gpus=4, options=FP32, images_per_s=[80000.0, 81000.0]),
]
# A small strong-scaling experiment: single's median is 1000 images/s and ddp-g2's 1770, so the
# summary must say 1.77× and 88%.
SIMPLE = [
    dict(variant="single", images_per_s=[990.0, 1010.0]),
    dict(variant="dp", gpus=1, images_per_s=[960.0, 980.0]),
    dict(variant="dp", gpus=2, images_per_s=[1400.0, 1440.0], memory=[2100, 1200],
         warnings=[dp_warning()]),
    dict(variant="ddp", gpus=1, images_per_s=[985.0, 995.0]),
    dict(variant="ddp", gpus=2, images_per_s=[1760.0, 1780.0]),
    dict(variant="ddp", gpus=4, status="skipped", images_per_s=None, reason=SKIP_REASON),
]


def draw_figures(rs) -> dict:
    """Every pipeline figure of a result set, drawn in the project's style at the dpi it is saved
    with (the canvas drawn, so its layout is final)."""
    tables = load_tables(rs.root, rs.tag)
    with style():
        figures = {name: DRAW[name](tables) for name in results.FIGURE_NAMES}
    for fig in figures.values():
        assert fig.dpi == DPI
        fig.canvas.draw()
    return figures


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    rs = fake_result_set(tmp_path_factory.mktemp("mixed"), MIXED)
    return rs, draw_figures(rs)


@pytest.fixture(scope="module")
def simple(tmp_path_factory):
    rs = fake_result_set(tmp_path_factory.mktemp("simple"), SIMPLE)
    return rs, draw_all(rs.root, rs.tag), write_summary_md(rs.root, rs.tag)


@pytest.fixture(scope="module")
def tiny_batch(tmp_path_factory):
    return draw_figures(fake_result_set(tmp_path_factory.mktemp("tiny"), TINY_BATCH))


# -- geometry checks ------------------------------------------------------------------------

FIXTURES = ("mixed", "one_epoch", "tiny_batch")


def figures_of(request, fixture: str) -> dict:
    value = request.getfixturevalue(fixture)
    return value[1] if fixture == "mixed" else value


def test_every_mixed_figure_draws_data(mixed):
    assert not [name for name, fig in mixed[1].items() if is_placeholder(fig)]


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("name", results.FIGURE_NAMES)
def test_every_point_lies_inside_its_axes(request, fixture, name):
    assert outside_points(figures_of(request, fixture)[name]) == []


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("name", results.FIGURE_NAMES)
def test_no_panel_is_empty(request, fixture, name):
    fig = figures_of(request, fixture)[name]
    assert untagged(fig) == []
    assert is_placeholder(fig) or empty_panels(fig) == []


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("name", results.FIGURE_NAMES)
def test_no_text_overlaps_another_or_a_neighbouring_panel(request, fixture, name):
    assert overlapping_texts(figures_of(request, fixture)[name]) == []


@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("name", results.FIGURE_NAMES)
def test_no_note_covers_data(request, fixture, name):
    assert notes_over_data(figures_of(request, fixture)[name]) == []


def redraw(rs, name: str, freeze: bool = False):
    """One figure drawn again (a module fixture's figures stay as they are); freeze: the layout
    stays as drawn, so that an artist moved afterwards is not made room for."""
    with style():
        fig = DRAW[name](load_tables(rs.root, rs.tag))
    fig.canvas.draw()
    if freeze:
        fig.set_layout_engine("none")
    return fig


def plant(fig, how: str) -> None:
    first, lower = fig.axes[0], fig.axes[-1]   # throughput: 4 panels in the first row, 2 below
    if how == "unwrapped title":
        first.set_title("channels_last=True,global_batch=1024,precision=bf16,warmup_steps=20")
    elif how == "title up into the panel above":
        lower.set_title(lower.get_title(), y=1.25)
    elif how == "note into the next panel":
        first.text(1.1, 0.5, "a note", transform=first.transAxes, bbox=NOTE_BOX)
    elif how == "legend over a panel":
        fig.legends[0].set_bbox_to_anchor((0.3, 0.5), transform=fig.transFigure)
    elif how == "footnote over the panels":
        fig.supxlabel("a footnote", x=0.1, y=0.3)
    fig.canvas.draw()


@pytest.mark.parametrize("how", ["unwrapped title", "title up into the panel above",
                                 "note into the next panel", "legend over a panel",
                                 "footnote over the panels"])
def test_the_overlap_check_finds_a_planted_overlap(mixed, how):
    fig = redraw(mixed[0], "throughput", freeze=True)
    assert overlapping_texts(fig) == []
    plant(fig, how)
    assert overlapping_texts(fig), how


def test_the_empty_panel_check_fails_when_no_data_is_drawn(mixed, monkeypatch):
    def nothing_drawn(ax, runs, med, y, variants):   # the values, for the axis range, but no artist
        return list(runs[y].dropna())
    monkeypatch.setattr(plots, "points_medians_intervals", nothing_drawn)
    for name in ("throughput", "scaling_efficiency"):   # ideal lines and the 1.0 lines remain
        fig = redraw(mixed[0], name)
        assert empty_panels(fig) == [ax.get_title() for ax in fig.axes], name
    monkeypatch.setattr(Axes, "plot", lambda self, *a, **k: [])   # curves; the zero line remains
    monkeypatch.setattr(Axes, "fill_between", lambda self, *a, **k: None)
    fig = redraw(mixed[0], "loss_vs_single")
    assert empty_panels(fig) == [ax.get_title() for ax in fig.axes]


def panel_titles(fig):
    return [ax.get_title().replace("\n", " ") for ax in fig.axes]


def test_panels_come_from_the_data_and_say_the_options_in_words(mixed):
    _, figures = mixed
    titles = panel_titles(figures["throughput"])
    assert titles == ["fp32, batch 512", "fp32, batch 1024", "fp32, batch 2048", "fp32, 256 per GPU",
                      "bf16 + channels_last, batch 512", "bf16 + channels_last, batch 1024"]
    memory = panel_titles(figures["memory"])
    # no 1-GPU run at batch 1024, no 3-GPU ok run: no such panel
    assert "fp32, batch 1024 · 1 GPU" not in memory and not any("3 GPUs" in t for t in memory)
    assert "fp32, 256 per GPU · 4 GPUs" in memory
    assert not any("=" in t for f in figures.values() for t in panel_titles(f))


def ideal_lines(fig) -> dict[str, dict[str, tuple[list, list, bool]]]:
    """panel title -> kind -> (GPU counts, heights, drawn as a line) of its ideal lines."""
    out = {}
    for ax in fig.axes:
        out[ax.get_title()] = {
            line.get_gid().removeprefix(f"{REFERENCE}ideal "):
                (list(line.get_xdata()), pytest.approx(list(line.get_ydata())),
                 line.get_linestyle() != "None")
            for line in drawn_artists(ax, f"{REFERENCE}ideal")}
    return out


def notes_of(ax) -> str:
    return " ".join(t.get_text() for t in ax.texts)


# By hand from MIXED: single's medians are 21,800 images/s (fp32, batch 512), 20,200 (fp32, 256)
# and 51,500 (bf16 + channels_last, 512). Strong: GPUs × single at the panel's global batch, a
# line from 1 GPU where the panel was planned strong. Weak: GPUs × single at the per-GPU batch,
# a line where planned weak, else a mark per GPU count.
IDEALS = {
    "fp32, batch 512": {"strong": ([1, 2], [21800, 2 * 21800], True), "weak": ([2], [2 * 20200], False)},
    "fp32, batch 1024": {"weak": ([2], [2 * 21800], False)},
    "fp32, batch 2048": {},   # no single at 2048, nor at 1024
    "fp32, 256 per GPU": {"weak": ([1, 4], [20200, 4 * 20200], True)},
    "bf16 + channels_last, batch 512": {"strong": ([1, 2], [51500, 2 * 51500], True)},
    "bf16 + channels_last, batch 1024": {"weak": ([2], [2 * 51500], False)},
}


def test_ideal_lines_have_the_hand_computed_heights_or_a_note_says_why(mixed):
    fig = mixed[1]["throughput"]
    assert ideal_lines(fig) == IDEALS
    for ax in fig.axes:
        assert notes_of(ax) == ("" if IDEALS[ax.get_title()] else NO_IDEAL), ax.get_title()


def test_the_ideal_line_check_fails_without_ideal_lines(mixed, monkeypatch):
    monkeypatch.setattr(plots, "ideal_points", lambda panel, pools, kind: ([], []))
    fig = redraw(mixed[0], "throughput")
    assert ideal_lines(fig) != IDEALS
    assert all(notes_of(ax) == NO_IDEAL for ax in fig.axes)


def test_a_panel_spanning_more_than_50x_gets_a_log_axis(tiny_batch):
    axes = {ax.get_title(): ax for ax in tiny_batch["throughput"].axes}
    tiny, plain = axes["fp32, batch 32"], axes["fp32, batch 512"]
    # dp on 4 GPUs at 150-160 images/s, the ideal at 4 × 9,100: 243× apart
    assert tiny.get_yscale() == "log" and tiny.get_ylabel() == "images/s (log scale)"
    low, high = tiny.get_ylim()
    assert 0 < low < 150 and high > 4 * 9100
    assert ideal_lines(tiny_batch["throughput"])["fp32, batch 32"] == \
        {"strong": ([1, 4], [9100, 4 * 9100], True)}
    assert plain.get_yscale() == "linear" and plain.get_ylabel() == "images/s"
    assert tiny.yaxis.get_major_formatter()(10000, 0) == "10,000"


@pytest.mark.parametrize("text,lines", [
    ("fp32, batch 512 · 2 GPUs", ["fp32, batch 512 · 2 GPUs"]),
    ("bf16 + channels_last, cudnn.benchmark on, batch 512",
     ["bf16 + channels_last, cudnn.benchmark on,", "batch 512"]),
    ("fp32, cudnn.benchmark off, 40 steps, 10 warm-up steps, batch 512",
     ["fp32, cudnn.benchmark off, 40 steps,", "10 warm-up steps, batch 512"]),
    ("fp32, DataLoader feed, 2 workers, batch 128 · 2 GPUs",
     ["fp32, DataLoader feed, 2 workers, batch 128", "2 GPUs"]),
    ("bf16 + channels_last + compile reduce-overhead + one fixed batch",
     ["bf16 + channels_last + compile reduce-overhead +", "one fixed batch"]),
    ("fp32, " + "a phrase of many words longer than any line of a title" + ", batch 512",
     ["fp32,", "a phrase of many words longer than any line of a", "title,", "batch 512"]),
])
def test_panel_titles_break_between_phrases(text, lines):
    _, (ax,) = panel_grid(1)
    panel_title(ax, text)
    assert ax.get_title().split("\n") == lines


def test_titles_of_every_figure_keep_their_phrases_whole(mixed, one_epoch, tiny_batch):
    for figures in (mixed[1], one_epoch, tiny_batch):
        for fig in figures.values():
            for ax in fig.axes:
                for before, after in zip(ax.get_title().split("\n"), ax.get_title().split("\n")[1:]):
                    assert not before.endswith(("batch", "per")) and not after[0].isdigit(), ax.get_title()


def test_cells_without_an_ok_run_are_named_under_every_figure(mixed, one_epoch):
    footnote = ("Not drawn, no ok run: dp on 4 GPUs · fp32, batch 512 (skipped); "
                "ddp on 3 GPUs · fp32, batch 512 (failed); reasons in summary.md")
    counted = "Not drawn, no ok run: 2 cells (1 failed, 1 skipped); which and why in summary.md"
    assert {name: fig.get_supxlabel() for name, fig in mixed[1].items()} == \
        {name: counted if name == "warnings" else footnote   # two panels: too narrow for the names
         for name in results.FIGURE_NAMES}
    assert {fig.get_supxlabel() for fig in one_epoch.values()} == {""}   # every cell ran


def test_a_footnote_too_long_for_its_figure_counts_the_cells(tmp_path):
    spec = [dict(variant="single", images_per_s=[1000.0, 1010.0])]
    spec += [dict(variant=v, gpus=4, options={"bucket_cap_mb": mb}, status=status, images_per_s=None,
                  reason=SKIP_REASON) for mb in (1, 5, 25, 100)
             for v, status in (("ddp", "skipped"), ("dp", "failed"))]
    rs = fake_result_set(tmp_path, spec)
    fig = redraw(rs, "throughput")
    assert fig.get_supxlabel() == ("Not drawn, no ok run: 8 cells (4 failed, 4 skipped); "
                                   "which and why in summary.md")
    assert overlapping_texts(fig) == []


def test_scaling_efficiency_shows_strong_and_weak(mixed):
    rs, figures = mixed
    t = load_tables(rs.root, rs.tag)
    ok = plots.speed_runs(plots.ok_runs(t["summary"])).dropna(subset=["rate"])
    panels = plots.efficiency_panels(plots.with_efficiency(ok), t["cells"])
    batch = {plots.STRONG: "global_batch", plots.WEAK: "per_gpu_batch"}
    held = {(kind, runs["precision"].iloc[0], runs[batch[kind]].iloc[0]): set(zip(runs["variant"], runs["gpus"],
                                                                                 runs["global_batch"]))
            for kind, _, runs, _ in panels}
    assert len(figures["scaling_efficiency"].axes) == len(panels)
    assert {(plots.STRONG, "fp32", 512), (plots.WEAK, "fp32", 512), (plots.WEAK, "bf16", 512)} <= held.keys()
    # ddp at 1024 on 2 GPUs has no single at 1024 but one at 512: a weak panel holds it
    assert ("ddp", 2, 1024) in held[plots.WEAK, "fp32", 512] and ("ddp", 2, 1024) in held[plots.WEAK, "bf16", 512]
    assert not any(kind == plots.STRONG and b == 1024 for kind, _, b in held)
    for ax in figures["scaling_efficiency"].axes:
        assert any(np.allclose(line.get_ydata(), 1.0) for line in ax.lines), ax.get_title()


def medians_drawn(ax) -> dict[tuple[str, int], float]:
    """(variant, GPUs) -> the median a panel's line shows (x is dodged a little per variant)."""
    return {(line.get_gid().removeprefix(DATA), round(x)): y for line in drawn_artists(ax, DATA)
            if line in ax.lines and line.get_marker() == "o" for x, y in line.get_xydata()}


# By hand from MIXED: each run's median images/s over GPUs × single's median at the batch the
# kind asks for (single: 21,800 at 512, 20,200 at 256, bf16 51,500 at 512).
EFFICIENCIES = {
    "strong scaling · fp32, batch 512": {
        ("dp", 1): 21550 / 21800, ("ddp", 1): 21100 / 21800, ("dp", 2): 9750 / (2 * 21800),
        ("dp_mean", 2): 10000 / (2 * 21800), ("ddp", 2): 36100 / (2 * 21800)},
    "weak scaling · fp32, 256 per GPU": {   # ddp on 4 GPUs planned weak; the 2-GPU runs at 512
        ("dp", 2): 9750 / (2 * 20200), ("dp_mean", 2): 10000 / (2 * 20200),
        ("ddp", 2): 36100 / (2 * 20200), ("ddp", 4): 70500 / (4 * 20200)},
    "weak scaling · fp32, 512 per GPU": {   # the 2-GPU runs at 1024; on 1 GPU weak is strong
        ("dp", 1): 21550 / 21800, ("ddp", 1): 21100 / 21800, ("dp", 2): 15250 / (2 * 21800),
        ("ddp", 2): 40500 / (2 * 21800)},
    "weak scaling · bf16 + channels_last, 512 per GPU": {
        ("dp", 1): 50250 / 51500, ("ddp", 2): 93500 / (2 * 51500)},
}


def test_scaling_efficiency_values_are_the_hand_computed_ones(mixed):
    axes = {ax.get_title().replace("\n", " "): ax for ax in mixed[1]["scaling_efficiency"].axes}
    for title, expected in EFFICIENCIES.items():
        assert medians_drawn(axes[title]) == pytest.approx(expected), title


def test_scaling_efficiency_keeps_cells_that_differ_only_in_ddp_knobs_apart(tmp_path):
    # A bucket sweep: every ddp cell compares with the same single runs, but each is its own point.
    spec = [dict(variant="single", images_per_s=[1000, 1010, 990])]
    spec += [dict(variant="ddp", gpus=2, options={"bucket_cap_mb": mb}, images_per_s=ips)
             for mb, ips in ((1, [1300, 1310]), (25, [1800, 1790]))]
    rs = fake_result_set(tmp_path, spec)
    fig = DRAW["scaling_efficiency"](load_tables(rs.root, rs.tag))
    strong = {ax.get_title(): ax for ax in fig.axes if ax.get_title().startswith("strong")}
    assert len(strong) == 2, list(strong)
    medians = sorted(float(max(line.get_ydata())) for ax in strong.values() for line in ax.lines
                     if line.get_marker() == "o")
    assert medians == pytest.approx([1305 / 2000, 1795 / 2000])


def test_memory_bars_show_the_resident_dataset_as_their_base(tmp_path):
    # dp on 2 GPUs with the gpu feed: 259 MiB of data on device 0, none on device 1
    dev = [{"device": 0, "allocated_mib": 1634.0, "reserved_mib": 2000.0, "nvml_used_mib": None, "data_mib": 259.0},
           {"device": 1, "allocated_mib": 1308.0, "reserved_mib": 1600.0, "nvml_used_mib": None, "data_mib": 0.0}]
    rs = fake_result_set(tmp_path, [dict(variant="dp", gpus=2, memory=dev)])
    fig = DRAW["memory"](load_tables(rs.root, rs.tag))
    bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_height() > 0]
    hatched = [(p.get_y(), p.get_height()) for p in bars if p.get_hatch()]
    solid = sorted((p.get_y(), p.get_y() + p.get_height()) for p in bars if not p.get_hatch())
    assert hatched == [(0.0, 259.0)]
    assert solid == [(0.0, 1308.0), (259.0, 1634.0)]   # each bar still tops out at the peak
    assert any("dataset" in t.get_text() for leg in fig.legends for t in leg.get_texts())


def curves_of(fig, title: str | None = None) -> tuple[set[str], set[str], str]:
    """The variants a panel (the one of that title; else the first) draws, those drawn dashed
    (identical to single), and its note."""
    ax = next(a for a in fig.axes if title is None or a.get_title() == title)
    lines = [(line.get_gid()[len(DATA):], line.get_linestyle()) for line in ax.get_lines()
             if (line.get_gid() or "").startswith(DATA)]
    return {v for v, _ in lines}, {v for v, ls in lines if ls != "-"}, " ".join(t.get_text() for t in ax.texts)


def test_loss_vs_single_shows_each_seed_where_their_mean_would_cancel(tmp_path):
    # dp's two seeds differ from single by +0.5 and -0.5 at every step: a mean of 0, not identical
    def loss(sign):
        return lambda step, repeat: 2.0 + (sign * (0.5 if repeat == 0 else -0.5))
    spec = [dict(variant="single", repeat=r, loss=loss(0)) for r in range(2)]
    spec += [dict(variant="dp", repeat=r, loss=loss(1)) for r in range(2)]
    spec += [dict(variant="ddp", repeat=r, loss=loss(0)) for r in range(2)]
    rs = fake_result_set(tmp_path, spec)
    fig = DRAW["loss_vs_single"](load_tables(rs.root, rs.tag))
    ax = fig.axes[0]
    _, same, note = curves_of(fig)
    assert same == {"ddp"} and "ddp" in note and "dp," not in note   # dp's seeds cancel only in their mean
    bands = [c for c in ax.collections if c.get_paths() and len(c.get_paths()[0].vertices) > 2]
    heights = sorted(float(np.ptp(c.get_paths()[0].vertices[:, 1])) for c in bands)
    assert heights[-1] == pytest.approx(1.0)   # dp's band spans -0.5 to +0.5
    assert ax.get_ylim()[0] < -0.5 and ax.get_ylim()[1] > 0.5


def test_throughput_axes_are_independent_when_ranges_differ(mixed):
    _, figures = mixed
    tops = {ax.get_title(): ax.get_ylim()[1] for ax in figures["throughput"].axes}
    assert tops["bf16 + channels_last, batch 1024"] > 94000
    assert tops["fp32, batch 1024"] < 60000


def test_curves_equal_to_single_are_named(mixed):
    _, figures = mixed
    drawn, same, note = curves_of(figures["loss_vs_single"], "fp32, batch 512 · 1 GPU")
    assert same == {"dp", "ddp"} and all(v in note for v in same)
    # the mean over repeats: single's three repeats against dp's two differ, bf16's two do not
    drawn, same, note = curves_of(figures["loss_curves"], "bf16 + channels_last, batch 512 · 1 GPU")
    assert same == {"dp"} and "dp" in note
    drawn, same, note = curves_of(figures["loss_curves"], "fp32, batch 1024 · 2 GPUs")
    assert "single" not in drawn and "1024" in note   # no single run at that global batch, and the note says which


# One evaluation each (one point per curve), no single run at global batch 512, the best
# accuracy at the top of the panel where a note sat; ddp equal to single on one GPU.
ONE_EPOCH = [
    dict(variant="single", epochs=1, accuracy=[0.44]),
    dict(variant="ddp", epochs=1, accuracy=[0.44]),
    dict(variant="dp", gpus=2, options=FP32, epochs=1, accuracy=[0.200]),
    dict(variant="dp_mean", gpus=2, options=FP32, epochs=1, accuracy=[0.179]),
    dict(variant="dp_sum", gpus=2, options=FP32, epochs=1, accuracy=[0.205]),
    dict(variant="ddp", gpus=2, options=FP32, epochs=1, accuracy=[0.179]),
]


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    return draw_figures(fake_result_set(tmp_path_factory.mktemp("one_epoch"), ONE_EPOCH))


def test_a_note_never_covers_the_band_of_the_repeats(tmp_path):
    # dp's second repeat climbs to 3.0 while the first stays at 1.0: the band reaches the top
    # right corner, their mean (2.0 there) does not; no single run at batch 512 to be noted
    spec = [dict(variant="dp", gpus=2, options=FP32, repeat=r,
                 loss=lambda s, r: 1.0 + (2.0 * s / 39 if r else 0.0)) for r in range(2)]
    fig = redraw(fake_result_set(tmp_path, spec), "loss_curves")
    assert notes_of(fig.axes[0]) == "no single run at global batch 512"
    assert notes_over_data(fig) == []


def test_notes_of_one_point_panels_claim_no_dashes(one_epoch):
    texts = {ax.get_title(): " ".join(t.get_text() for t in ax.texts) for ax in one_epoch["accuracy"].axes}
    assert texts["fp32, batch 128 · 1 GPU"] == "identical to single: ddp"
    assert texts["fp32, batch 512 · 2 GPUs"] == "no single run at global batch 512"
    # the highest point stays in the panel, below its note
    ax = next(a for a in one_epoch["accuracy"].axes if a.get_title() == "fp32, batch 512 · 2 GPUs")
    assert ax.get_ylim()[1] > 0.205


def test_warnings_span_two_decades_on_a_log_axis(mixed):
    _, figures = mixed
    assert {ax.get_yscale() for ax in figures["warnings"].axes} == {"log"}


def test_mixed_summary_names_strong_and_weak(mixed):
    rs, _ = mixed
    text = render_summary(rs.root, rs.tag)   # the words: summary.md snapshot
    assert "### bf16 + channels_last, batch 1024" in text
    # ddp on 2 GPUs at 1024: weak against single at 512, 40,500 / (2 × 21,800)
    assert f"weak scaling: {40500 / 21800:.2f}× single at global batch 512 (the per-GPU batch), " \
           f"efficiency {40500 / 43600:.0%}" in text
    cells = read_cells(rs.root, rs.tag)
    dp_mean = cells[cells["variant"] == "dp_mean"]
    assert list(dp_mean["n_ok"]) == [1] and dp_mean["rate_ci_low"].isna().all()   # ran once: no interval
    assert "`ddp-g3-global_batch512-r0`" in text and SKIP_REASON in text


def scaling_rows(text: str) -> dict[tuple[str, str, str], list[str]]:
    """(variant, GPUs, settings) -> the other cells of a row of summary.md's scaling table."""
    section = text.split("## Strong and weak scaling", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| variant")]
    return {tuple(r[:3]): r[3:] for r in rows}


def test_scaling_table_gives_weak_once_on_one_gpu(mixed):
    rows = scaling_rows(render_summary(mixed[0].root, mixed[0].tag))
    assert rows[("ddp", "1", "fp32, batch 512")][-1] == "= strong"
    assert rows[("ddp", "2", "fp32, batch 512")][-1].startswith(f"{36100 / 40400:.0%} (")
    assert rows[("ddp", "2", "fp32, batch 2048")][-2:] == ["n/a", "n/a"]


@pytest.mark.parametrize("spec,says", [
    ([dict(variant="single"), dict(variant="ddp", gpus=2, status="skipped", images_per_s=None,
                                   reason=SKIP_REASON),
      dict(variant="dp", gpus=2, status="failed", images_per_s=None, reason="CUDA error")],
     "Only single has ok runs (the other variants' runs: 1 failed, 1 skipped; reasons under "
     "\"Skipped and failed runs\" below)."),
    ([dict(variant="single")], "Only single ran: no other variant to compare with it."),
    ([dict(variant="ddp", gpus=2, status="failed", images_per_s=None, reason="CUDA error")],
     "No successful runs."),
], ids=["others-skipped-or-failed", "single-only", "none-ok"])
def test_an_empty_scaling_table_says_what_happened_instead(tmp_path, spec, says):
    text = render_summary(*astuple(fake_result_set(tmp_path, spec)))
    section = text.split("## Strong and weak scaling", 1)[1].split("\n## ", 1)[0]
    assert section.strip().endswith(says)


# -- files, bytes, placeholders and the simple summary ---------------------------------------

def assert_every_figure(rs, paths):
    assert [p.name for p in paths] == [f"{name}.png" for name in results.FIGURE_NAMES]
    for path in paths:
        assert path.parent == results.figures_dir(rs.root, rs.tag)
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        height, width = matplotlib.image.imread(path).shape[:2]
        assert height > 100 and width > 100


def test_every_figure_is_a_png_with_the_same_bytes_for_the_same_data(simple, tmp_path):
    rs, paths, _ = simple
    assert_every_figure(rs, paths)
    tables = load_tables(rs.root, rs.tag)
    for name in ("throughput", "memory"):   # drawn again from the same tables
        with style():
            save(DRAW[name](tables), tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").read_bytes() == \
            (results.figures_dir(rs.root, rs.tag) / f"{name}.png").read_bytes()


@pytest.mark.parametrize("spec", [
    [dict(variant="ddp", gpus=2, status="skipped", images_per_s=None, reason=SKIP_REASON),
     dict(variant="dp", gpus=2, status="skipped", images_per_s=None, reason=SKIP_REASON)],
    [],
], ids=["all-skipped", "empty"])
def test_figures_and_summary_without_ok_runs(tmp_path, spec):
    rs = fake_result_set(tmp_path, spec)
    assert_every_figure(rs, draw_all(rs.root, rs.tag))
    text = write_summary_md(rs.root, rs.tag).read_text()
    assert "No successful runs." in text
    assert (SKIP_REASON in text) == bool(spec)


def test_summary_gives_start_up_times_and_phases_from_records_that_have_them(tmp_path):
    rs = fake_result_set(tmp_path, [dict(variant="single", repeat=r) for r in range(3)]
                         + [dict(variant="ddp", gpus=2, repeat=r) for r in range(2)])
    assert "## Start-up" not in render_summary(rs.root, rs.tag)   # records from before it was measured
    # phase ends since the launch: imports, devices, data, model, feed (records from before the
    # workload's build was a phase of its own: it shows as 0.0); then the first step
    ends = {"single-g1-r0": ([2.0, 3.0, 3.5, 4.0, 4.5], 7.0), "single-g1-r1": ([3.0, 5.0, 5.5, 6.0, 8.0], 9.5),
            "single-g1-r2": ([2.5, 4.0, 4.5, 5.0, 6.0], 8.0), "ddp-g2-r0": (None, 15.25)}
    older = [p for p in results.STARTUP_PHASES if p not in results.LATER_PHASES]
    for rid, (marks, start) in ends.items():
        path = results.ResultSet(rs.root, rs.tag).metrics_path(rid)
        startup = dict(zip(older, marks)) if marks else {}
        results.write_json(path, dict(results.read_json(path), start_s=start, startup=startup))
    text = render_summary(rs.root, rs.tag)
    assert "## Start-up" in text
    # medians per phase: imports 2.5; devices 1.0, 2.0, 1.5 -> 1.5; data 0.5; model 0.5;
    # feed 0.5, 2.0, 1.0 -> 1.0; rest 2.5, 1.5, 2.0 -> 2.0
    assert re.search(r"\| single +\| +1 \| +3 \| +8\.0 \| +7\.0-9\.5 \| +2\.5 \| +1\.5 \| +0\.0 \| +0\.5 \| +0\.5 "
                     r"\| +1\.0 \| +2\.0 \|", text)
    # r1 has no start at all, r0 no phases (a record from before they were measured)
    assert re.search(r"\| ddp +\| +2 \| +1 \| +15\.2 \| +15\.2-15\.2 \| +– \|", text)



def test_start_up_is_given_per_option_set_where_they_differ(tmp_path):
    rs = fake_result_set(tmp_path, [dict(variant="single", repeat=r) for r in range(2)]
                         + [dict(variant="single", repeat=r, options={"deterministic": True}) for r in range(2)])
    for data, _ in results.ResultSet(rs.root, rs.tag).runs():
        slow = data["options"].get("deterministic", False)
        results.write_json(results.ResultSet(rs.root, rs.tag).metrics_path(data["run_id"]), dict(data, start_s=20.0 + data["repeat"] if slow else 8.0 + data["repeat"]))
    section = render_summary(rs.root, rs.tag).split("## Start-up", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "single" in line]
    assert "| settings" in section and len(rows) == 2
    assert sorted(float(r.split("|")[5]) for r in rows) == [8.5, 20.5]   # never pooled into one median


def test_summary_md_headline_intervals_reasons_and_provenance(simple):
    _, _, summary_md = simple
    text = summary_md.read_text()
    assert text.startswith("# dpbench results: fake\n")
    speedup = 1770.0 / 1000.0  # medians of ddp-g2 and single
    # two repeats a cell: their range holds the median at 50%, a ratio's interval at 25% or more
    # images/s's interval names what it covers: this launch, not the next one
    assert f"ddp on 2 GPUs: 1,770 images/s (50% CI of this launch 1,760–1,780); strong scaling: " \
           f"{speedup:.2f}× single at global batch 128, efficiency 88% (≥25% CI 87%–90%)" in text
    assert "They are this launch's" in text
    assert "device 0 holds 1.75×" in text     # dp-g2: 2100 / 1200
    assert f"- {SKIP_REASON}: `ddp-g4-r0`" in text
    assert "| torch" in text and SYNTHETIC_PROVENANCE["torch"] in text
    assert text.count(dp_warning()["message"]) == 1 and "×196 in 2 run(s)" in text


def test_md_table_escapes_pipes_and_aligns():
    table = md_table(["a", "n"], [["x|y", "1"], ["z", "10"]], right=[1])
    assert table.splitlines() == ["| a    |   n |", "| ---- | --: |",
                                  "| x\\|y |   1 |", "| z    |  10 |"]


def test_gpu_provenance_shows_models_and_the_most_gpus_a_run_saw():
    from dpbench.report.summarize import _fmt_gpus, _fmt_provenance
    assert _fmt_gpus({"gpu_names": [["NVIDIA H200"], ["NVIDIA H200", "NVIDIA H200"]]}) == "2 × NVIDIA H200"
    assert _fmt_gpus({"gpu_names": ["NVIDIA H200"]}) == "1 × NVIDIA H200"
    assert _fmt_gpus({"gpu_names": []}) == _fmt_gpus({}) == "none"
    assert _fmt_provenance({"torch": ["2.13.0", "2.14.1"]}, "torch") == "2.13.0; 2.14.1"
    assert _fmt_provenance({"cuda": None}, "cuda") == _fmt_provenance({}, "cuda") == "n/a"


def test_summary_of_cpu_runs_says_gpu_counts_are_processes(tmp_path):
    rs = fake_result_set(tmp_path / "cpu", [dict(variant="single", device_type="cpu")])
    assert "ran on the CPU" in render_summary(rs.root, rs.tag)
    rs = fake_result_set(tmp_path / "gpu", [dict(variant="single", device_type="cuda")])
    assert "ran on the CPU" not in render_summary(rs.root, rs.tag)


def test_cpu_plan_draws_every_figure_in_processes(tmp_path):
    """Without CUDA: single and ddp on 1-2 gloo processes, dp skipped, no device memory."""
    cpu = dict(device_type="cpu", memory=[], global_batch=32)
    rs = fake_result_set(tmp_path, [
        dict(variant="single", images_per_s=[55.0, 54.0], **cpu),
        dict(variant="ddp", gpus=1, images_per_s=[53.0, 52.0], **cpu),
        dict(variant="ddp", gpus=2, images_per_s=[80.0, 82.0], loss=drift(0.01), **cpu),
        dict(variant="dp", gpus=2, status="skipped", images_per_s=None, device_type="cpu",
             reason="nn.DataParallel needs CUDA devices and none is visible")])
    figures = draw_figures(rs)
    for name, fig in figures.items():
        assert outside_points(fig) == [], name
    assert figures["throughput"].axes[0].get_xlabel() == "processes (CPU, gloo)"
    assert panel_titles(figures["loss_curves"])[-1] == "fp32, batch 32 · 2 processes (CPU)"
    assert "CPU runs" in " ".join(t.get_text() for t in figures["memory"].axes[0].texts)
