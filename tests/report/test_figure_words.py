"""Figures say what ran: a set made on the CPU never reads "GPU", a small model's parameter
count is not "0M", and small axes get ticks that differ (not 0, 0, 0, 1, 1)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes import fake_result_set, sharded_run
from matplotlib.text import Text

from dpbench import results
from dpbench.report import plots
from dpbench.report import sharding_plots as S
from dpbench.report.figstyle import style

REPO = Path(__file__).resolve().parents[2]
CPU_SET = "cpu-paired-213-vs-2141-43b8177"   # a paired launch made on the CPU (gloo)


def texts(fig) -> list[str]:
    fig.canvas.draw()
    found = [t.get_text() for t in fig.findobj(Text)]
    for ax in fig.axes:
        found += [t.get_text() for t in ax.get_yticklabels() + ax.get_xticklabels()]
    return [t for t in found if t]


@pytest.fixture(scope="module")
def cpu_figures(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu")
    shutil.copytree(REPO / "results" / "reference" / CPU_SET, root / CPU_SET,
                    ignore=shutil.ignore_patterns("figures", "logs", "runs"))
    tables = plots.load_tables(root, CPU_SET)
    with style():
        return {name: draw(tables) for name, draw in plots.DRAW.items()}


def test_no_figure_of_a_cpu_set_says_gpu(cpu_figures):
    said = {name: [t for t in texts(fig) if "GPU" in t] for name, fig in cpu_figures.items()}
    assert not any(said.values()), said


@pytest.mark.parametrize("count, words", [(350_000, "350K"), (1_500_000, "1.5M"), (12_000_000, "12M"),
                                          (124_000_000, "124M"), (1_100_000_000, "1.1B"), (900, "900")])
def test_parameter_counts_read_right(count, words):
    assert S.size_words(count) == words


def test_a_tiny_cpu_transformer_panel_reads_its_size_and_distinct_ticks(tmp_path):
    spec = [dict(sharded_run(v, 2, parameters=210_000, workload="transformer-lm",
                             options={"global_batch": 8}), device_type="cpu") for v in ("ddp", "fsdp")]
    rs = fake_result_set(tmp_path, spec)
    tables = S.sharding_tables(rs.root, rs.tag)
    # a tiny model: a few MiB per device, the ticks fractions of one
    mc = tables["memory_components"]
    for col in [c for c in mc.columns if c.endswith("_mib")]:
        mc[col] = mc[col] / 400.0
    with style():
        fig = S.DRAW["memory_components"](tables)
    said = texts(fig)
    assert any("210K parameters" in t for t in said), said
    assert not any("0M parameters" in t for t in said)
    assert not any("GPU" in t for t in said), [t for t in said if "GPU" in t]
    ax = next(a for a in fig.axes if a.get_ylabel() == "MiB per device")
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) == len(set(labels)) >= 3, labels
    assert results.SHARDING_FIGURE_NAMES
