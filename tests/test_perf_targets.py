"""tools/device/perf_targets.py on a fake perf result set (CPU only): the verdicts of cells that
were not measured, the recipe ladder's order and the recipe figure."""
from __future__ import annotations

import json
import re
from pathlib import Path

from fakes import fake_result_set, load_perf_targets

SKIP_REASON = "needs 2 GPUs, 1 visible (CUDA_VISIBLE_DEVICES=unset)"
CL = {"global_batch": 512, "channels_last": True}
BF16_CL = {**CL, "precision": "bf16"}
DDP_WEAK = {"per_gpu_batch": 512, "bucket_cap_mb": 25, "gradient_as_bucket_view": True,
            "static_graph": True}
LADDER = ["fp32, contiguous", "+ channels_last", "bf16 + channels_last", "+ cudnn.benchmark",
          "+ compile (cudnn.benchmark off)"]




def _perf_set(tmp_path, ddp_measured: bool = False):
    """The perf experiment's single cells (listed out of recipe order on purpose), two DDP cells
    skipped for want of GPUs, and optionally one DDP cell that ran."""
    spec = [
        dict(options={**BF16_CL, "compile": "default"}, images_per_s=61000.0),
        dict(options={**BF16_CL, "cudnn_benchmark": True}, images_per_s=58000.0),
        dict(options={**CL, "feed": "fixed"}, images_per_s=37000.0),
        dict(options={**BF16_CL, "feed": "fixed"}, images_per_s=56500.0),
        dict(options=BF16_CL, images_per_s=55000.0),
        dict(options=CL, images_per_s=36500.0),
        dict(options={"global_batch": 512}, images_per_s=22000.0),
        dict(options={"global_batch": 256}, images_per_s=20000.0),
        dict(variant="ddp", gpus=2, options={"global_batch": 512, "bucket_cap_mb": 25,
                                             "gradient_as_bucket_view": False, "static_graph": False},
             status="skipped", reason=SKIP_REASON, images_per_s=None),
        dict(variant="ddp", gpus=2, options={**DDP_WEAK, "precision": "bf16", "channels_last": True},
             status="ok" if ddp_measured else "skipped", reason="" if ddp_measured else SKIP_REASON,
             images_per_s=100000.0 if ddp_measured else None),
    ]
    rs = fake_result_set(tmp_path, spec)
    return rs.root / rs.tag


def test_unmeasured_cells_never_read_ok_and_the_figure_shows_the_ladder(tmp_path):
    pt = load_perf_targets()
    folder = _perf_set(tmp_path)
    md, js, png = tmp_path / "targets.md", tmp_path / "targets.json", tmp_path / "fig" / "recipe.png"
    assert pt.main([str(folder), "--md", str(md), "--json", str(js), "--figure", str(png)]) == 0

    targets = json.loads(js.read_text())["targets"]
    unmeasured = [r for r in targets if r["measured"] is None]
    assert unmeasured and all(r["outcome"] == "not measured" for r in unmeasured)
    skipped = [r for r in unmeasured if r.get("cell", "").startswith("ddp")]
    assert skipped and {r["verdict"] for r in skipped} == {"not measured (skipped: needs 2 GPUs, 1 visible)"}
    for r in targets:   # only a measured row carries pass/FAIL, and none ever reads "ok"
        assert not re.search(r"\bok\b", r["verdict"]), r
        assert (r["outcome"] in ("pass", "FAIL")) == (r["measured"] is not None)
    table = [line for line in md.read_text().splitlines() if line.startswith("| ddp")]
    assert table and all(line.split("|")[-2].strip().startswith("not measured (") for line in table)
    assert sum(line.endswith("| not measured (skipped: needs 2 GPUs, 1 visible) |") for line in table) == 2
    assert "No DDP cell was measured (2 cells skipped: needs 2 GPUs, 1 visible)." in md.read_text()

    ladder = pt.recipe_rows(pt.load_cells(folder))
    assert [r["label"] for r in ladder if r["kind"] == "step"] == LADDER
    kinds = [(r["kind"], r["label"]) for r in ladder]
    assert kinds.index(("ceiling", "ceiling: one fixed batch (fp32)")) == kinds.index(("step", "+ channels_last")) + 1
    by = {r["label"]: r for r in ladder}
    assert abs(by["+ channels_last"]["gain"] - (36500 / 22000 - 1)) < 1e-9
    assert by["+ compile (cudnn.benchmark off)"]["over"] == "bf16 + channels_last"
    assert abs(by["bf16 + channels_last"]["epoch_s"] - 50000 / 55000) < 1e-9
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_figure_gets_a_ddp_panel_once_a_ddp_cell_was_measured(tmp_path):
    pt = load_perf_targets()
    folder = _perf_set(tmp_path, ddp_measured=True)
    cells = pt.load_cells(folder)
    assert len(pt.sweep_rows(cells)) == 1
    fig = pt.recipe_figure(folder, cells)
    assert len(fig.axes) == 2 and fig.axes[1].get_title().startswith("DDP on 2 GPUs")
    png = tmp_path / "recipe.png"
    pt.write_figure(folder, cells, png)
    assert png.stat().st_size > 0
    measured = [r for r in pt.target_rows(cells) if r.get("cell", "").startswith("ddp") and r["measured"]]
    assert measured and all(r["verdict"] in ("pass", "FAIL") for r in measured)


def test_the_two_gpu_overlay_measures_every_ddp_target_with_the_perf_experiments_cells():
    """tools/device/perf_ddp_targets.yaml: a short 2-GPU run. Its groups must be perf.yaml's
    (same names, same cells), and together they must hold every DDP target and its baseline."""
    import yaml
    root = Path(__file__).resolve().parents[1]
    perf = {g["name"]: g for g in yaml.safe_load((root / "experiments" / "perf.yaml").read_text())["matrix"]}
    overlay = yaml.safe_load((root / "tools" / "device" / "perf_ddp_targets.yaml").read_text())["matrix"]
    assert overlay and all(g == perf[g["name"]] for g in overlay)
    pt = load_perf_targets()
    train = pt.experiment_train()
    cells = [{"settings": {**train, **g.get("options", {}), "variant": v,
                           "gpus": (g.get("gpus") or [1])[0]}} for g in overlay for v in g["variants"]]
    ddp_targets = [t for t in pt.TARGETS if t[0].startswith("ddp")]
    for name, _, numerator, baseline, *_ in ddp_targets:
        assert any(pt.matches(c, numerator) for c in cells), name
        assert any(pt.matches(c, baseline) for c in cells), name
