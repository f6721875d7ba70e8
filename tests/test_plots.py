"""Figures and summary.md from small fake tidy tables (no training, no GPU)."""
from __future__ import annotations

import math

import matplotlib.image
import pytest

from dpbench import results
from dpbench.plots import FIGURES, draw_all
from dpbench.markdown import md_table
from dpbench.summarize import write_summary_md

TAG = "fake"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DP_WARNING = ("Was asked to gather along dimension 0, but all input tensors were scalars; "
              "will instead unsqueeze and return a vector.")
SKIP_REASON = "needs 4 GPUs, 2 visible"

# images/s per (variant, gpus), one value per repeat. single's median is 1000 and ddp-g2's
# 1770, so the summary must say 1.77×.
IMAGES_PER_S = {("single", 1): [990.0, 1010.0], ("dp", 1): [960.0, 980.0],
                ("dp", 2): [1400.0, 1440.0], ("ddp", 1): [985.0, 995.0],
                ("ddp", 2): [1760.0, 1780.0]}
PROVENANCE = {"torch": "2.14.1+cu130", "cuda": "13.0", "cudnn": 91900, "nccl": "2.28.9",
              "driver": "580.159.04", "gpu_names": ["NVIDIA H200", "NVIDIA H200"],
              "python": "3.11.7", "hostname": "node-7", "git_sha": "abc1234", "tag": TAG,
              "n_runs": 11}


def key(variant, gpus, repeat):
    return {"run_id": results.run_id(variant, gpus, repeat), "variant": variant, "gpus": gpus,
            "repeat": repeat, "options": ""}


def device_mib(variant, gpus):
    """DataParallel's device 0 carries the master copy: 2100 MiB against 1200 elsewhere."""
    if variant == "dp" and gpus > 1:
        return [2100.0] + [1200.0] * (gpus - 1)
    return [1300.0] * gpus


def fake_rows():
    rows = {name: [] for name in results.TABLES}
    for (variant, gpus), speeds in IMAGES_PER_S.items():
        for repeat, ips in enumerate(speeds):
            k = key(variant, gpus, repeat)
            mib = device_mib(variant, gpus)
            ratio = mib[0] / (sum(mib[1:]) / len(mib[1:])) if gpus > 1 else None
            rows["summary"].append({**k, "status": "ok", "images_per_s": ips,
                                    "step_ms_p50": 128e3 / ips, "peak_mem_mib": max(mib),
                                    "mem_dev0_over_mean_others": ratio, "final_loss": 0.9,
                                    "test_acc": 0.6, "global_batch": 128, "device_type": "cuda"})
            rows["memory"] += [{**k, "device": d, "allocated_mib": m} for d, m in enumerate(mib)]
            rows["steps"] += [{**k, "epoch": 1 + s // 20, "step": s, "lr": 0.1,
                               "loss_global": 2.3 * math.exp(-s / 15) + 0.01 * repeat,
                               "loss_reported": 2.3 * math.exp(-s / 15)} for s in range(40)]
            rows["accuracy"] += [{**k, "epoch": e, "test_acc": 0.3 + 0.1 * e,
                                  "test_loss": 2 - e / 2} for e in (1, 2)]
            if variant == "dp" and gpus > 1:
                rows["warnings"].append({**k, "category": "UserWarning", "message": DP_WARNING,
                                         "count": 98, "first_step": 0, "rank": 0,
                                         "location": "torch/nn/parallel/_functions.py:70"})
    rows["summary"].append({**key("ddp", 4, 0), "status": "skipped", "reason": SKIP_REASON})
    return rows


def write_tables(root, rows, provenance=None):
    for name, columns in results.TABLES.items():
        results.write_csv(results.table_path(root, TAG, name), columns, rows.get(name, []))
    if provenance is not None:
        results.write_json(results.tag_dir(root, TAG) / "provenance.json", provenance)


@pytest.fixture(scope="module")
def fake_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    write_tables(root, fake_rows(), PROVENANCE)
    return root, draw_all(root, TAG), write_summary_md(root, TAG)


def assert_every_figure(root, paths):
    assert [p.name for p in paths] == [f"{name}.png" for name in FIGURES]
    for path in paths:
        assert path.parent == results.figures_dir(root, TAG)
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        height, width = matplotlib.image.imread(path).shape[:2]
        assert height > 100 and width > 100


def test_every_figure_is_a_png(fake_results):
    root, paths, _ = fake_results
    assert_every_figure(root, paths)


def test_same_data_gives_same_bytes(fake_results):
    root, paths, _ = fake_results
    first = [p.read_bytes() for p in paths]
    assert [p.read_bytes() for p in draw_all(root, TAG)] == first


@pytest.mark.parametrize("rows, provenance", [
    ({"summary": [{**key("ddp", 2, 0), "status": "skipped", "reason": SKIP_REASON},
                  {**key("dp", 2, 0), "status": "skipped", "reason": SKIP_REASON}]}, PROVENANCE),
    ({}, None),
], ids=["all-skipped", "empty"])
def test_figures_and_summary_without_ok_runs(tmp_path, rows, provenance):
    write_tables(tmp_path, rows, provenance)
    assert_every_figure(tmp_path, draw_all(tmp_path, TAG))
    text = write_summary_md(tmp_path, TAG).read_text()
    assert "No successful runs." in text
    assert (SKIP_REASON in text) == bool(rows)


def test_summary_md_headline_reasons_and_provenance(fake_results):
    _, _, summary_md = fake_results
    text = summary_md.read_text()
    assert text.startswith(f"# dpbench results: {TAG}\n")
    speedup = 1770.0 / 1000.0  # medians of ddp-g2 and single
    assert f"ddp on 2 GPUs: {speedup:.2f}× single" in text
    assert "scaling efficiency 88%" in text  # 1.77 / 2
    assert "device 0 holds 1.75× the mean" in text  # dp-g2: 2100 / 1200
    assert f"- {SKIP_REASON}: `ddp-g4-r0`" in text
    assert "| torch" in text and "2.14.1+cu130" in text
    assert text.count(DP_WARNING) == 1 and "×196 in 2 run(s)" in text


def test_md_table_escapes_pipes_and_aligns():
    table = md_table(["a", "n"], [["x|y", "1"], ["z", "10"]], right=[1])
    assert table.splitlines() == ["| a    |   n |", "| ---- | --: |",
                                  "| x\\|y |   1 |", "| z    |  10 |"]


def test_gpu_provenance_shows_models_and_the_most_gpus_a_run_saw():
    from dpbench.summarize import _fmt_gpus
    assert _fmt_gpus([["NVIDIA H200"], ["NVIDIA H200", "NVIDIA H200"]]) == "2 × NVIDIA H200"
    assert _fmt_gpus(["NVIDIA H200"]) == "1 × NVIDIA H200"
    assert _fmt_gpus([]) == "none"


def test_summary_of_cpu_runs_says_gpu_counts_are_processes(tmp_path):
    from dpbench import results as R
    from dpbench.summarize import render_summary
    cols = R.SUMMARY_COLUMNS
    row = dict.fromkeys(cols, "")
    row.update(run_id="single-g1-r0", variant="single", gpus=1, repeat=0, status="ok",
               images_per_s=50.0, device_type="cpu")
    R.write_csv(R.table_path(tmp_path, "t", "summary"), cols, [row])
    R.write_csv(R.table_path(tmp_path, "t", "warnings"), R.WARNING_COLUMNS, [])
    R.write_json(R.provenance_path(tmp_path, "t"), {"torch": "x"})
    assert "ran on the CPU" in render_summary(tmp_path, "t")
    row["device_type"] = "cuda"
    R.write_csv(R.table_path(tmp_path, "t", "summary"), cols, [row])
    assert "ran on the CPU" not in render_summary(tmp_path, "t")
