"""The sharded variants' figures drawn from fixture result sets, checked as a reader sees them."""
from __future__ import annotations

import pandas as pd
import pytest
from fakes import (
    empty_panels,
    fake_result_set,
    is_placeholder,
    outside_points,
    overlapping_texts,
    sharded_run,
    untagged,
)

from dpbench import results
from dpbench.report import sharding_plots as S
from dpbench.report.figstyle import DATA, style

LM = {12_000_000: 64, 124_000_000: 32, 1_100_000_000: 16}
SPEED = {"ddp": 1.0, "zero1": 0.8, "fsdp": 0.5}


def sweep() -> list[dict]:
    """ResNet18 fp32 on 1-2 GPUs, and three transformer sizes on 2 GPUs in bf16."""
    spec = [dict(variant="single", images_per_s=20000.0)]
    spec += [sharded_run(v, g, options={"global_batch": 512}, images_per_s=20000.0 * g / (2 if v == "fsdp" else 1))
             for v in ("ddp", "zero1", "fsdp") for g in (1, 2)]
    for params, batch in LM.items():
        speed = 4e10 / params
        for v, opts in (("ddp", {}), ("zero1", {}), ("fsdp", {}), ("fsdp", {"reshard_after_forward": False})):
            run = sharded_run(v, 2, parameters=params, workload="transformer-lm",
                              options={"global_batch": batch, "precision": "bf16", **opts},
                              images_per_s=speed * SPEED[v] * (0.9 if opts else 1.0))
            spec.append(run)
    return spec


def draw(rs) -> dict:
    tables = S.sharding_tables(rs.root, rs.tag)
    with style():
        figures = {name: S.DRAW[name](tables) for name in results.SHARDING_FIGURE_NAMES}
    for fig in figures.values():
        fig.canvas.draw()
    return figures


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    rs = fake_result_set(tmp_path_factory.mktemp("sweep"), sweep())
    return rs, draw(rs)


@pytest.mark.parametrize("name", results.SHARDING_FIGURE_NAMES)
def test_each_figure_draws_every_panel_inside_its_axes_without_overlaps(swept, name):
    fig = swept[1][name]
    assert not is_placeholder(fig)
    assert untagged(fig) == [] and empty_panels(fig) == []
    assert outside_points(fig) == [] and overlapping_texts(fig) == []


def bar_top(ax, x: int) -> float:
    """The top of the stacked bar at tick x."""
    return max(p.get_y() + p.get_height() for p in ax.patches
               if (p.get_gid() or "").startswith(DATA) and abs(p.get_x() + p.get_width() / 2 - x) < 1e-9)


def test_the_memory_figure_stacks_what_the_table_holds(swept):
    fig = swept[1]["memory_components"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == 4                           # ResNet18 + three transformer sizes
    resnet = next(ax for ax in fig.axes if ax.get_title().startswith("resnet18"))
    labels = [t.get_text() for t in resnet.get_xticklabels()]
    assert labels == ["ddp\n1 GPU", "ddp\n2 GPUs", "zero1\n1 GPU", "zero1\n2 GPUs", "fsdp\n1 GPU", "fsdp\n2 GPUs"]
    mc = swept[0].table("memory_components")
    one = mc[(mc["run_id"] == "fsdp-g2-global_batch512-r0")]
    stacked = one[["parameters_mib", "gradients_mib", "optimizer_mib", "activation_peak_mib"]].sum(axis=1).mean()
    assert bar_top(resnet, labels.index("fsdp\n2 GPUs")) == pytest.approx(stacked)
    lm = next(ax for ax in fig.axes if "1.1B" in ax.get_title())
    assert "fsdp (no reshard)\n2 GPUs" in [t.get_text() for t in lm.get_xticklabels()]


def test_the_size_figure_has_one_line_per_variant_through_every_size(swept):
    fig = swept[1]["sharding_vs_size"]
    assert [ax.get_title() for ax in fig.axes] == ["transformer-lm · 2 GPUs · bf16\nat the experiment's batch"]
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith(DATA)]
    assert len(lines) == 4                            # ddp, zero1, fsdp, fsdp (no reshard)
    assert all(list(ln.get_xdata()) == sorted(LM) for ln in lines)
    assert ax.get_xscale() == "log"


def test_the_largest_batch_table_gives_the_size_figure_its_second_quantity(tmp_path, swept):
    rows = [{"workload": "transformer-lm", "parameters": p, "variant": v, "gpus": 2,
             "largest_batch": (64 if v == "fsdp" else 32) * 124_000_000 // p, "samples_per_s_at_largest": 4e10 / p,
             "precision": "bf16"} for p in LM for v in ("ddp", "fsdp")]
    tables = {**S.sharding_tables(swept[0].root, swept[0].tag), "largest_batch": pd.DataFrame(rows)}
    with style():
        fig = S.plot_sharding_vs_size(tables)
    fig.canvas.draw()
    titles = [ax.get_title() for ax in fig.axes]
    assert [t.replace("\n", " · ") for t in titles] == ["transformer-lm · 2 GPUs · bf16 · at the largest batch",
                                                      "transformer-lm · 2 GPUs · bf16 · largest batch"]
    assert empty_panels(fig) == [] and overlapping_texts(fig) == []


def test_no_sharded_runs_give_placeholders_not_errors(tmp_path):
    rs = fake_result_set(tmp_path, [dict(variant="single"), dict(variant="ddp", gpus=2)])
    assert all(is_placeholder(fig) for fig in draw(rs).values())
    empty = fake_result_set(tmp_path / "none", [])
    assert all(is_placeholder(fig) for fig in draw(empty).values())


def test_draw_all_writes_the_pngs(tmp_path):
    rs = fake_result_set(tmp_path, sweep()[:4])
    paths = S.draw_all(rs.root, rs.tag)
    assert [p.name for p in paths] == [f"{n}.png" for n in results.SHARDING_FIGURE_NAMES]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_a_crowded_sweep_keeps_its_labels_apart(tmp_path):
    spec = [sharded_run(v, g, parameters=p, workload="transformer-lm", options={"global_batch": b, **o})
            for p, b in list(LM.items())[1:] for g in (1, 2, 4)
            for v, o in (("ddp", {}), ("zero1", {}), ("fsdp", {}), ("fsdp", {"reshard_after_forward": False}))]
    fig = draw(fake_result_set(tmp_path, spec))["memory_components"]
    assert [len(ax.get_xticks()) for ax in fig.axes] == [12, 12]
    assert overlapping_texts(fig) == [] and outside_points(fig) == [] and empty_panels(fig) == []
