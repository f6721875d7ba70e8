"""The perf experiment, its overlays and `dpbench perf-targets` (dpbench.analysis.perf_targets,
analysis.experiment_time, report.perf_targets) on fake result sets (CPU only): what the targets read from the records, the verdicts of cells that were not measured, the
whole default experiment's time, the recipe ladder and the figures."""
from __future__ import annotations

import json
import math
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from fakes import SYNTHETIC_PROVENANCE, fake_result_set, write_fake_run

from dpbench import cli, results
from dpbench.analysis import cell_table, experiment_time, intervals
from dpbench.analysis import perf_cells, perf_tables, perf_targets
from dpbench.plan import pipeline
from dpbench.report import figstyle
from dpbench.report import perf_targets as words

ROOT = Path(__file__).resolve().parents[2]
SKIP_REASON = "needs 2 GPUs, 1 visible (CUDA_VISIBLE_DEVICES=unset)"
CL = {"global_batch": 512, "channels_last": True}
BF16_CL = {**CL, "precision": "bf16"}
DDP_WEAK = {"per_gpu_batch": 512, "bucket_cap_mb": 25, "gradient_as_bucket_view": True,
            "static_graph": True}
LADDER = ["fp32, contiguous", "+ channels_last", "bf16 + channels_last", "+ cudnn.benchmark",
          "+ compile (cudnn.benchmark off)"]
# What the records of a run on real CIFAR-10 say about where they ran
CIFAR = {**SYNTHETIC_PROVENANCE, "dataset": {"name": "cifar10", "train_size": 50000, "test_size": 10000}}


def torch_bucket_default():
    """DDP's default bucket size as the torch here builds it (what `dpbench perf-targets` asks)."""
    from dpbench.run.device_facts import ddp_default_bucket_mb
    return ddp_default_bucket_mb()


def _perf_set(tmp_path, ddp_measured: bool = False, provenance: dict = CIFAR):
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
    rs = fake_result_set(tmp_path, [dict(e, provenance=provenance) for e in spec])
    return rs.root / rs.tag


def _set_throughput(folder: Path, **fields) -> None:
    """Adds throughput fields (e.g. compile_s) to every ok record of a fake result set."""
    rs = results.ResultSet.at(folder)
    for rec, rdir in rs.runs():
        if rec["status"] == "ok":
            rec["throughput"].update(fields)
            results.write_json(rdir / results.METRICS, rec)


# -- the targets, the tables and the recipe ladder ----------------------------------------------------

def test_unmeasured_cells_never_read_ok_and_the_figure_shows_the_ladder(tmp_path):
    folder = _perf_set(tmp_path)
    md, js, png = tmp_path / "targets.md", tmp_path / "targets.json", tmp_path / "fig" / "recipe.png"
    assert cli.main(["perf-targets", str(folder), "--md", str(md), "--json", str(js), "--figure", str(png)]) == 0

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

    ladder = perf_tables.recipe_rows(perf_cells.load_cells(folder))
    assert [r["label"] for r in ladder if r["kind"] == "step"] == LADDER
    kinds = [(r["kind"], r["label"]) for r in ladder]
    assert kinds.index(("ceiling", "ceiling: one fixed batch (fp32)")) == kinds.index(("step", "+ channels_last")) + 1
    by = {r["label"]: r for r in ladder}
    assert abs(by["+ channels_last"]["gain"] - (36500 / 22000 - 1)) < 1e-9
    assert by["+ compile (cudnn.benchmark off)"]["over"] == "bf16 + channels_last"
    assert abs(by["bf16 + channels_last"]["epoch_s"] - 50000 / 55000) < 1e-9
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_epoch_is_the_training_split_the_records_name(tmp_path):
    """Not CIFAR-10's 50,000 written into the tool: a run on 10,000 images has a five times
    shorter epoch, and a run whose records name no split gets no epoch time at all."""
    small = perf_cells.load_cells(_perf_set(tmp_path / "small", provenance={
        **CIFAR, "dataset": {"name": "synthetic", "train_size": 10000, "test_size": 100}}))
    epoch = next(r for r in perf_targets.target_rows(small) if r["target"] == "single bf16 + channels_last epoch (s)")
    assert epoch["measured"] == pytest.approx(10000 / 55000) and epoch["outcome"] == "pass"
    assert words.epoch_words(small) == "epoch = 10,000 images"

    unknown = perf_cells.load_cells(_perf_set(tmp_path / "unknown", provenance=SYNTHETIC_PROVENANCE))
    rows = [r for r in perf_targets.target_rows(unknown) if r["kind"] == "epoch" and "cell" in r]
    assert rows and {r["verdict"] for r in rows} == {"not measured (its records name no training split)"}
    assert all(r["epoch_s"] is None for r in perf_tables.fastest_rows(unknown))


def test_ratios_and_efficiencies_carry_dpbench_tables_intervals(tmp_path):
    """Three repeats a side: the fixed-batch ratio is intervals.ratio_ci's (value, interval and
    its confidence), and a DDP cell's efficiency is cell_table.cells' weak efficiency."""
    spec = [dict(options=BF16_CL, images_per_s=[54000.0, 55000.0, 56000.0]),
            dict(options={**BF16_CL, "feed": "fixed"}, images_per_s=[56000.0, 57000.0, 58000.0]),
            dict(variant="ddp", gpus=2, options={**DDP_WEAK, "precision": "bf16", "channels_last": True},
                 images_per_s=[99000.0, 100000.0, 101000.0])]
    rs = fake_result_set(tmp_path, [dict(e, provenance=CIFAR) for e in spec])
    cells = perf_cells.load_cells(rs.root / rs.tag)
    row = next(r for r in perf_targets.target_rows(cells) if r["target"].startswith("single bf16 + channels_last vs"))
    expected = intervals.ratio_ci([54000, 55000, 56000], [56000, 57000, 58000])
    assert (row["measured"], row["low"], row["high"]) == pytest.approx(expected[:3])
    assert row["interval"] == intervals.interval_text(expected, "{:.3f}", 3) and "CI" in row["interval"]
    # 0.97 lies between 54,000 / 58,000 and 56,000 / 56,000: said, whichever way the median falls
    assert row["verdict"] == "FAIL (the goal lies inside the interval)"

    [ddp] = perf_tables.sweep_rows(cells)
    cell = cell_table.cells(rs.table("summary"))
    want = cell[cell["variant"] == "ddp"].iloc[0]
    assert ddp["efficiency"] == pytest.approx(want["efficiency_weak"]) == pytest.approx(100000 / (2 * 55000))
    assert (ddp["efficiency_low"], ddp["efficiency_high"]) == pytest.approx(
        (want["efficiency_weak_ci_low"], want["efficiency_weak_ci_high"]))


def test_compile_time_is_a_column_from_the_records(tmp_path):
    folder = _perf_set(tmp_path, ddp_measured=True)
    _set_throughput(folder, compile_s=12.5)
    cells = perf_cells.load_cells(folder)
    assert {r["compile_s"] for r in perf_tables.fastest_rows(cells)} == {12.5}
    assert perf_tables.sweep_rows(cells)[0]["compile_s"] == 12.5
    compiled = next(r for r in perf_tables.fastest_rows(cells) if "compile" in r["recipe"])
    assert (compiled["images_per_s"], round(compiled["epoch_s"], 2)) == (61000, 0.82)
    text = words.markdown(folder, cells, perf_targets.target_rows(cells))
    assert compiled["recipe"] in text   # the recipes' table shows each row
    step = next(r for r in perf_tables.recipe_rows(cells) if r["label"].startswith("+ compile"))
    assert step["compile_s"] == 12.5


def test_the_bucket_size_in_effect_is_the_runs_or_pytorchs_said_as_such(tmp_path):
    spec = [dict(options=BF16_CL, images_per_s=55000.0),
            dict(variant="ddp", gpus=2, images_per_s=100000.0,
                 options={"per_gpu_batch": 512, "precision": "bf16", "channels_last": True}),
            dict(variant="ddp", gpus=2, images_per_s=98000.0,
                 options={**DDP_WEAK, "bucket_cap_mb": 5, "precision": "bf16", "channels_last": True})]
    rs = fake_result_set(tmp_path, [dict(e, provenance=CIFAR) for e in spec])
    rows = {r["bucket_mb"]: r for r in perf_tables.sweep_rows(perf_cells.load_cells(rs.root / rs.tag, lambda: (40.0, "9.9")))}
    assert set(rows) == {5.0, 40.0}
    assert rows[5.0]["setting"] == "bucket 5 MB, views + static graph" and rows[5.0]["bucket_note"] == ""
    assert rows[40.0]["setting"] == ("bucket 40 MB (PyTorch's default in torch 9.9; the runs used "
                                     f"{CIFAR['torch']}), knobs off")


def test_pytorchs_default_bucket_size_is_read_from_torch():
    import torch
    from dpbench.run.device_facts import ddp_default_bucket_mb
    mb, version = ddp_default_bucket_mb.__wrapped__()   # a DDP built here, on a one-rank gloo group
    assert (mb, version) == (25.0, torch.__version__)   # DDP's documented default, in MB of 2**20 bytes


# -- the perf experiment's plan ------------------------------------------------------------------------

def _plan(experiment: str, gpus: int, **config):
    return pipeline.make_plan(pipeline.load_experiment({"experiment": experiment, "gpus_available": gpus,
                                                        **config}, ROOT))


def test_perf_experiment_plans_every_target_cell_once(tmp_path):
    """Records made from the perf plan on 2 GPUs: every target finds its runs and exactly one
    baseline, and the ratios are what the numbers say."""
    plan = _plan("perf", 2)
    assert all(rc.gpus <= 2 for rc in plan.runs.values())
    for rid, rc in plan.runs.items():
        write_fake_run(tmp_path / "perf" / "runs", variant=rc.variant, gpus=rc.gpus, repeat=rc.repeat,
                       options=rc.options, config=rc.to_dict(), provenance=CIFAR,
                       images_per_s=20000.0 if rc.variant == "single" else 39000.0 * rc.gpus / 2)
    fake = fake_result_set(tmp_path, [], tag="perf")
    cells = perf_cells.load_cells(fake.root / fake.tag)
    targets = perf_targets.target_rows(cells)
    assert {r["target"] for r in targets} == {t[0] for t in perf_targets.TARGETS}
    assert all(r["measured"] is not None for r in targets), [r for r in targets if r["measured"] is None]
    strong = [r for r in targets if r["target"].startswith("ddp fp32, 2 GPUs, strong")]
    assert sorted(r["setting"] for r in strong) == ["bucket 100 MB, views + static graph",
                                                    "bucket 25 MB, knobs off", "bucket 25 MB, views + static graph"]
    assert all(math.isclose(r["measured"], 39000 / 40000) and r["verdict"] == "pass" for r in strong)
    epoch = next(r for r in targets if r["target"].startswith("single bf16") and r["kind"] == "epoch")
    assert math.isclose(epoch["measured"], 2.5) and epoch["verdict"] == "FAIL"
    sweep = perf_tables.sweep_rows(cells)
    assert len(sweep) == sum(rc.variant == "ddp" for rc in plan.runs.values())
    # every cell but the compiled one (its own step budget, a setup of its own) has its baseline
    assert [r["cell"] for r in sweep if r["efficiency"] is None] == [
        next(plan.identities[rid].cell_id for rid, rc in plan.runs.items() if rc.variant == "ddp" and
             rc.compile != "none")]
    assert all(abs(r["gap"]) < 1e-9 for r in perf_tables.agreement_rows(cells))
    md = words.markdown(fake.root / fake.tag, cells, targets)
    assert all(r["target"] in md for r in targets)   # every target has its row


def test_perf_experiment_covers_the_knobs_and_times_alone():
    """The sweep the issue asks for, and one run at a time (a compile never shares the host with
    a baseline's timed steps)."""
    plan = _plan("perf", 2)
    assert plan.config["exclusive_timing"] is True
    ddp = [rc for rc in plan.runs.values() if rc.variant == "ddp"]
    assert all({"bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers"} <= set(rc.options)
               for rc in ddp), "every DDP cell names all four knobs (a default that moves changes none)"
    assert any(not rc.broadcast_buffers for rc in ddp)
    assert any(rc.gradient_as_bucket_view and not rc.static_graph for rc in ddp)
    assert any(rc.static_graph and not rc.gradient_as_bucket_view for rc in ddp)
    assert len({rc.bucket_cap_mb for rc in ddp if rc.precision == "fp32"}) >= 2
    assert len({rc.bucket_cap_mb for rc in ddp if rc.precision == "bf16"}) >= 3
    assert any(rc.precision == "bf16" and rc.scaling == "strong" and rc.gpus == 2 for rc in ddp)
    assert {rc.gpus for rc in ddp} == {1, 2}


def test_perf_experiments_cost_comment_counts_its_runs():
    text = (ROOT / "experiments" / "perf.yaml").read_text()
    said = {kind: int(n) for n, kind in re.findall(r"(\d+) (single|DDP) runs", text)}
    runs = _plan("perf", 2).runs.values()
    assert said == {"single": sum(rc.variant == "single" for rc in runs), "DDP": sum(rc.variant == "ddp" for rc in runs)}


def test_perf_experiment_on_the_cpu_folds_batches_and_compile_away():
    plan = _plan("perf", 0)
    assert all(rc.compile == "none" and rc.global_batch == 32 and rc.dataset == "synthetic"
               for rc in plan.runs.values())
    assert len(plan.runs) < len(_plan("perf", 2).runs)


def test_the_two_gpu_overlay_measures_every_ddp_target_with_the_perf_experiments_cells():
    """tools/device/perf_ddp_targets.yaml: a short 2-GPU run. Its groups must be perf.yaml's
    (same names, same cells), and together they must hold every DDP target and its baseline."""
    perf = {g["name"]: g for g in yaml.safe_load((ROOT / "experiments" / "perf.yaml").read_text())["matrix"]}
    overlay = yaml.safe_load((ROOT / "tools" / "device" / "perf_ddp_targets.yaml").read_text())["matrix"]
    assert overlay and all(g == perf[g["name"]] for g in overlay)
    train = {**perf_cells.run_defaults(), **pipeline.load_experiment({"experiment": "perf"}, ROOT)["train"]}
    cells = [perf_cells.Cell(g["name"], {**train, **g.get("options", {}), "variant": v,
                                           "gpus": (g.get("gpus") or [1])[0]})
             for g in overlay for v in g["variants"]]
    ddp_targets = [t for t in perf_targets.TARGETS if t[0].startswith("ddp")]
    for name, _, numerator, baseline, *_ in ddp_targets:
        assert any(perf_cells.matches(c, numerator) for c in cells), name
        assert any(perf_cells.matches(c, baseline) for c in cells), name


# -- the whole default experiment's time -------------------------------------------------------------

TWO_H200 = {**CIFAR, "gpu_names": ["NVIDIA H200", "NVIDIA H200"]}


def _snakemake_log(runs: int, seconds: float | None = 441, done: int | None = None) -> str:
    total = runs + 4
    lines = ["Building DAG of jobs...", "Job stats:", "job        count", "-------  -------",
             f"train         {runs}", "collect        1", "plots          1", "summary        1",
             "all            1", f"total         {total}", ""]
    lines += [f"{i} of {total} steps ({100 * i // total}%) done" for i in range(1, (done or total) + 1)]
    if seconds is not None:
        lines.append(f"pipeline wall time: {seconds:.0f} s")
    return "\n".join(lines) + "\n"


def _default_set(tmp_path, drop: int = 0, provenance: dict = TWO_H200, log: str | None = "logs",
                 plan_doc: dict | None = None, **log_args) -> Path:
    """The default experiment as planned on 2 GPUs, every run recorded (those on 3 and 4 GPUs as
    skipped), with its Snakemake log kept in logs/ (or packed, or nowhere), and its plan.json
    where given (the plan's document with these keys changed)."""
    plan = _plan(experiment_time.DEFAULT_EXPERIMENT, 2)
    rs = results.ResultSet(tmp_path, "default")
    if plan_doc is not None:
        results.write_json(rs.plan_path, {**plan.document(), **plan_doc})
    for rid, rc in sorted(plan.runs.items())[drop:]:
        skipped = plan.skipped(rc)
        write_fake_run(rs.runs_dir, variant=rc.variant, gpus=rc.gpus, repeat=rc.repeat, options=rc.options,
                       config=rc.to_dict(), provenance=provenance, images_per_s=None if skipped else 20000.0,
                       status="skipped" if skipped else "ok", reason="needs 3 GPUs" if skipped else "")
    text = _snakemake_log(len(plan.runs), **log_args)
    if log == "logs":
        results.write_atomic(rs.log_path("snakemake"), text)
    elif log == "packed":
        results.write_atomic(rs.log_path("snakemake"), text)
        with tarfile.open(rs.dir / "logs.tar.gz", "w:gz") as tar:
            tar.add(rs.logs_dir, arcname="logs")
        rs.log_path("snakemake").unlink()
    return rs.dir


@pytest.mark.parametrize("log", ["logs", "packed"])
def test_the_default_experiments_time_is_its_snakemake_logs(tmp_path, log):
    row = experiment_time.default_experiment_row(_default_set(tmp_path, log=log))
    assert row["measured"] == pytest.approx(441 / 60) and row["outcome"] == "pass"
    assert row["verdict"].startswith("pass (the command's wall time, 441 s, from default/")
    slow = experiment_time.default_experiment_row(_default_set(tmp_path / "slow", seconds=960))
    assert slow["outcome"] == "FAIL" and slow["measured"] == pytest.approx(16.0)


@pytest.mark.parametrize("change,why", [
    (dict(log=None), "default keeps no Snakemake log (logs/snakemake.log or pipeline.log); its records hold "
                     "each run's wall time but no start or end"),
    (dict(done=50), "logs/snakemake.log: the log stops at 50 of 73 steps"),
    (dict(seconds=None), "logs/snakemake.log: the log gives no wall time"),
    (dict(drop=1), "default is not the default experiment as planned now: 1 of its 69 runs missing (e.g. ddp-g1-"),
    (dict(provenance={**CIFAR, "gpu_names": ["NVIDIA H200"] * 4}), "its runs saw 4 GPUs; the target is for 2"),
])
def test_the_default_experiments_time_is_not_measured_without_its_evidence(tmp_path, change, why):
    row = experiment_time.default_experiment_row(_default_set(tmp_path, **change))
    assert row["measured"] is None and row["outcome"] == "not measured"
    assert row["verdict"].startswith(f"not measured ({why}"), row["verdict"]


@pytest.mark.parametrize("plan_doc,measured", [
    ({}, True),
    ({"given": {"experiment": experiment_time.DEFAULT_EXPERIMENT, "tag": "default", "gpus_available": 2}}, True),
    ({"experiment": "perf"}, False),
    ({"gpus_planned": 4}, False),
    ({"given": {"experiment": experiment_time.DEFAULT_EXPERIMENT, "repeats": 1}}, False),
])
def test_a_set_with_its_plan_is_judged_by_that_plan(tmp_path, plan_doc, measured):
    """A set that keeps plan.json is the default experiment as that plan planned it (its
    experiment, its GPUs, nothing given that changes its runs), not as the checkout plans now."""
    row = experiment_time.default_experiment_row(_default_set(tmp_path, plan_doc=plan_doc))
    assert (row["outcome"] == "pass") is measured and (row["measured"] is not None) is measured, row["verdict"]
    assert experiment_time.not_the_default_experiment(_default_set(tmp_path / "all", plan_doc=plan_doc))[1] == 69


def test_a_set_is_judged_by_the_runs_its_plan_lists(tmp_path):
    """The runs the set's plan.json lists are the ones it must hold, with the configs it gives."""
    folder = _default_set(tmp_path, plan_doc={})
    plan = json.loads(results.ResultSet.at(folder).plan_path.read_text())
    rid = sorted(plan["runs"])[0]
    one_less = {**plan, "runs": {k: v for k, v in plan["runs"].items() if k != rid}}
    results.write_json(results.ResultSet.at(folder).plan_path, one_less)
    assert experiment_time.not_the_default_experiment(folder)[1] == 68
    changed = {**plan, "runs": {**plan["runs"], rid: {**plan["runs"][rid], "lr": 0.5}}}
    results.write_json(results.ResultSet.at(folder).plan_path, changed)
    why, runs = experiment_time.not_the_default_experiment(folder)
    assert runs == 69 and why is not None and rid in why


def test_the_perf_set_is_not_the_default_experiment(tmp_path):
    folder = _perf_set(tmp_path)
    row = experiment_time.default_experiment_row(folder)
    assert row["verdict"] == ("not measured (fake holds none of the default experiment's 69 runs; give its "
                              "result set with --default-experiment)")
    given = cli.main(["perf-targets", str(folder), "--default-experiment", str(_default_set(tmp_path / "d")),
                     "--json", str(tmp_path / "t.json")])
    assert given == 0
    last = json.loads((tmp_path / "t.json").read_text())["targets"][-1]
    assert last["target"] == experiment_time.WALL_TARGET and last["outcome"] == "pass"


def test_the_time_is_the_last_whole_invocation_and_those_that_continued_it():
    seconds, why = experiment_time.snakemake_seconds(_snakemake_log(3), runs=69)
    assert seconds is None and why == "no Snakemake invocation in the log made all 69 runs (the others were made before it)"
    # a full rerun: only the last counts
    assert experiment_time.snakemake_seconds(_snakemake_log(69, seconds=500) + _snakemake_log(69), runs=69) == (
        441, "the command's wall time")
    # stopped by a time limit at 50 of 73 steps, then continued with the 23 runs left
    stopped = _snakemake_log(69, seconds=480, done=50) + _snakemake_log(23, seconds=130)
    assert experiment_time.snakemake_seconds(stopped, runs=69) == (
        610, "the command's wall time of 2 Snakemake invocations, each continuing the one before")
    assert experiment_time.snakemake_seconds(_snakemake_log(69, seconds=480, done=50), runs=69) == (
        None, "the log stops at 50 of 73 steps")
    elapsed = _snakemake_log(69, seconds=None) + "Elapsed time: 0:07:11.558465\n"
    assert experiment_time.snakemake_seconds(elapsed, runs=69) == (pytest.approx(431.558465), "Snakemake's elapsed time")


# -- the bucket-size figure ------------------------------------------------------------------------

def _sweep_set(tmp_path):
    knobs = {"gradient_as_bucket_view": True, "static_graph": True}
    spec = [dict(options={"global_batch": 256}, images_per_s=20000.0),
            dict(options=BF16_CL, images_per_s=55000.0)]
    spec += [dict(variant="ddp", gpus=2, options={"per_gpu_batch": 512, "precision": "bf16", "channels_last": True,
                                                  "bucket_cap_mb": mb, **knobs},
                  images_per_s=ips) for mb, ips in ((1, 88000.0), (5, 91000.0), (25, [91500.0, 92500.0, 92000.0]),
                                                    (100, 89000.0))]
    spec += [dict(variant="ddp", gpus=2, options={"global_batch": 512, "bucket_cap_mb": mb, **knobs},
                  images_per_s=ips) for mb, ips in ((25, 38500.0), (100, 37500.0))]
    spec += [dict(variant="ddp", gpus=2, options={"global_batch": 512}, images_per_s=38000.0),   # PyTorch's default
             dict(variant="ddp", gpus=1, options={"per_gpu_batch": 512, "precision": "bf16", "channels_last": True,
                                                  "bucket_cap_mb": 25}, images_per_s=50000.0),
             dict(variant="ddp", gpus=2, status="skipped", reason=SKIP_REASON, images_per_s=None,
                  options={"per_gpu_batch": 512, "bucket_cap_mb": 5})]
    rs = fake_result_set(tmp_path, [dict(e, provenance=CIFAR) for e in spec])
    return rs.root / rs.tag


def test_the_bucket_figure_draws_every_measured_cell_inside_its_panel(tmp_path):
    folder = _sweep_set(tmp_path)
    cells = perf_cells.load_cells(folder, torch_bucket_default)
    panels = words.sweep_panels(perf_tables.sweep_rows(cells))
    fig = words.sweep_figure(folder, cells)
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [" ".join(ax.get_title().split()) for ax in axes] == [   # panel_title breaks between phrases
        "2 GPUs · bf16 + channels_last · weak scaling, 512 per GPU",
        "2 GPUs · fp32 · strong scaling, global batch 512",
        "1 GPU · bf16 + channels_last · weak scaling, 512 per GPU"]
    drawn = 0
    for ax, panel in zip(axes, panels.values()):
        assert ax.get_xscale() == "log" and ax.lines, ax.get_title()
        points = figstyle.data_in_axes(ax)
        assert len(points) and ((points >= -1e-9) & (points <= 1 + 1e-9)).all(), ax.get_title()
        lines = [line for line in ax.lines if line.get_linestyle() != "None"]
        assert len(lines) == len(panel)
        drawn += sum(len(line.get_xdata()) for line in lines)
    assert drawn == len(perf_tables.sweep_rows(cells))   # every measured DDP cell is one point of a line
    sweep = [line for line in axes[0].lines if line.get_linestyle() != "None"]
    assert [list(line.get_xdata()) for line in sweep] == [[1, 5, 25, 100]]
    assert list(sweep[0].get_ydata()) == [88000, 91000, 92000, 91000 - 2000]
    assert any(len(c.get_segments()) == 1 for c in axes[0].collections)   # the interval of 3 repeats
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["knobs off", "views + static graph", "PyTorch's default size\n(bucket_cap_mb unset)"]
    hollow = [line for line in axes[1].lines if line.get_linestyle() == "None"]
    assert [(list(h.get_xdata()), h.get_markerfacecolor()) for h in hollow] == [([25.0], "white")]
    fig.canvas.draw()
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["1", "5", "25", "100"]
    png = tmp_path / "sweep.png"
    cli.main(["perf-targets", str(folder), "--sweep-figure", str(png)])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bucket_figure_says_why_it_is_empty(tmp_path):
    folder = _perf_set(tmp_path)
    fig = words.sweep_figure(folder, perf_cells.load_cells(folder))
    texts = [" ".join(t.get_text().split()) for ax in fig.axes for t in ax.texts]   # wrapped lines joined
    assert texts == ["no DDP cell was measured (2 cells skipped: needs 2 GPUs, 1 visible)"]


def test_the_recipe_figure_gets_a_ddp_panel_once_a_ddp_cell_was_measured(tmp_path):
    folder = _perf_set(tmp_path, ddp_measured=True)
    cells = perf_cells.load_cells(folder)
    assert len(perf_tables.sweep_rows(cells)) == 1
    fig = words.recipe_figure(folder, cells)
    assert len(fig.axes) == 2 and fig.axes[1].get_title().startswith("DDP: knobs")
    assert fig.axes[1].get_yticklabels()[0].get_text().startswith("2 GPUs · bf16 + channels_last · weak")
    png = tmp_path / "recipe.png"
    words.write_figure(words.recipe_figure, folder, cells, png)
    assert png.stat().st_size > 0
    measured = [r for r in perf_targets.target_rows(cells) if r.get("cell", "").startswith("ddp") and r["measured"]]
    assert measured and all(r["verdict"] in ("pass", "FAIL") for r in measured)
    assert np.isclose(measured[0]["measured"], 100000 / (2 * 55000))


def test_the_wall_time_line_of_every_device_script_is_read():
    """Each device script's own 'pipeline wall time' line, run by bash as the script runs it
    (441 s after its start, Snakemake's status 3), is what the 15-minute row reads, and it
    prints the status it was given (a `$?` read after `$(date)` would print date's 0)."""
    import subprocess
    scripts = ["perf.sh", "pipeline_run.sh", "session.sh"]
    for name in scripts:
        text = (ROOT / "tools" / "device" / name).read_text()
        (line,) = [l for l in text.splitlines() if l.startswith('echo "pipeline wall time:')]
        echo = line.split(" | tee")[0]
        assert "$?" not in echo, f"{name}: read the status into a variable before the line"
        out = subprocess.run(["bash", "-c", f"start=$(( $(date +%s) - 441 )); rc=3; status=3; tag=t; {echo}"],
                             capture_output=True, text=True, check=True).stdout
        log = _snakemake_log(69, seconds=None) + out
        assert experiment_time.snakemake_seconds(log, 69)[0] in (441, 442), (name, out)
        assert "exit" not in out or "exit 3" in out, (name, out)


def test_an_unmeasured_cell_reads_its_reason_without_the_detail_and_recipes_name_fused_sgd():
    reason = ("needs 2 GPUs, 1 visible (CUDA_VISIBLE_DEVICES=unset; "
              "the plan was made for 1 GPU(s))")   # launch's reason, with a nested parenthesis
    skipped = perf_cells.Cell("ddp-g2", {}, status=["skipped"], reasons=[reason])
    assert perf_cells.why_unmeasured(skipped) == "skipped: needs 2 GPUs, 1 visible"
    base = {"variant": "single", "precision": "bf16", "channels_last": True, "global_batch": 512, "feed": "gpu"}
    cells = [perf_cells.Cell(f"single-{fused}", {**base, "fused_sgd": fused}, ips=[ips], images_per_s=ips)
             for fused, ips in ((True, 55146.0), (False, 45526.0))]
    recipes = [r["recipe"] for r in perf_tables.fastest_rows(cells)]
    assert len(set(recipes)) == 2 and "fused SGD" in recipes[0] and "fused SGD" not in recipes[1]


def test_the_perf_experiment_alone_makes_its_targets_as_pipeline_targets():
    """Snakemake's perf_targets rule writes what perf.sh copies out; no other experiment has it."""
    plan = _plan("perf", 2)
    files = pipeline.perf_target_files(plan)
    assert set(files) == {"md", "json", "figure", "sweep_figure"}
    assert set(files.values()) <= set(pipeline.final_targets(plan))
    assert [Path(f).name for f in files.values()] == ["targets.md", "targets.json", "recipe_steps.png",
                                                     "bucket_sweep.png"]
    assert pipeline.perf_target_files(_plan(experiment_time.DEFAULT_EXPERIMENT, 2)) == {}
