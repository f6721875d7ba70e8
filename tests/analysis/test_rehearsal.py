"""Rehearsal (issue 38): N ranks sharing one GPU over gloo, each its own process and allocator.
On the CPU a rehearsed run is gloo ranks as always: its records must be marked and equal an
ordinary run's; a rehearsed record never enters a throughput or scaling table; the memory
model's per-rank components match the tensors counted on 1, 2 and 4 gloo ranks, its largest
unit what one all-gather brings (nested units too); the plan holds one GPU for N rehearsed
ranks, and a rank count whose per-rank estimates do not fit the GPU is skipped with the sum;
C9's text is computed from search records, with its conditions."""
from __future__ import annotations

import csv
import json
import math
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from fakes import fake_result_set
from sharded_ranks import (NESTED, TINY_LM, Case, Inner, Outer, max_differences, share_two_ranks, train_all,
                           two_rank_results)

from dpbench import results
from dpbench.analysis import memory_model as M
from dpbench.analysis import rehearsal as R
from dpbench.analysis import traffic_model as T
from dpbench.analysis.cell_table import cells
from dpbench.analysis.tables import speed_runs
from dpbench.claims import NUANCE
from dpbench.claims.c9 import rehearsed, text, verdict
from dpbench.claims.c9.rehearsal import SAFE, search_budget
from dpbench.plan import skips
from dpbench.plan.config import RunConfig
from dpbench.run import components, sharded
from dpbench.run.launch import main as launch_main

MIB = 2 ** 20
TOLERANCE = 1e-6


# -- the option, the lease and the fit ---------------------------------------------------------------

def test_rehearsed_ranks_hold_one_gpu_and_only_distributed_variants_rehearse():
    cfg = RunConfig.from_dict({"variant": "fsdp", "gpus": 4, "rehearse": True})
    assert cfg.gpus_held == 1 and cfg.to_dict()["rehearse"] is True
    assert skips.skip_reason(cfg, 1) is None                          # four ranks, one GPU
    assert skips.skip_reason(RunConfig.from_dict({"variant": "fsdp", "gpus": 4}), 1) == "needs 4 GPUs, 1 visible"
    assert "rehearse" not in RunConfig.from_dict({"variant": "ddp", "gpus": 2}).to_dict()   # identity as before
    with pytest.raises(ValueError, match="rehearse"):
        RunConfig.from_dict({"variant": "single", "rehearse": True})
    # on the CPU: gloo ranks as always, within max_cpu_ranks
    assert skips.skip_reason(RunConfig.from_dict({"variant": "ddp", "gpus": 4, "rehearse": True}), 0).startswith("needs 4")


def test_a_rank_count_that_does_not_fit_the_gpu_is_skipped_with_the_sum(monkeypatch):
    p, gib = 2_000_000_000, 2 ** 30
    ddp = M.Setting(variant="ddp", parameters=p, ranks=8)
    per_rank = 16 * p + M.CONTEXT_BYTES                  # fp32, momentum, DDP's buckets
    reason = M.rehearsal_misfit(ddp, 8, 139 * gib)
    assert reason is not None and f"{8 * per_rank / gib:.2f}" in reason and "139.00" in reason   # the sum, the GPU
    assert M.rehearsal_misfit(M.Setting(variant="fsdp", parameters=p, ranks=8), 8, 139 * gib) is None
    capped = M.rehearsal_misfit(M.Setting(variant="fsdp", parameters=10_000, ranks=8), 8, 139 * gib, cap_bytes=22 * gib)
    assert f"{8 * (22 * gib + M.CONTEXT_BYTES) / gib:.2f}" in capped   # a cap per rank: N x (cap + context)
    # the allocator's replay of the case where it reserves more than the state: 1.97B hsdp at
    # N = 8 (shard groups of 2), whose state fits 8 ranks of an H200 while its replay does not
    hsdp = M.Setting(variant="hsdp", parameters=p, ranks=8, hsdp_shard_size=2)
    assert M.rehearsal_misfit(hsdp, 8, 139 * gib) is None
    replayed = M.rehearsal_misfit(hsdp, 8, 139 * gib, replayed_bytes=18_320 * 2 ** 20)
    assert f"{8 * (18_320 * 2 ** 20 + M.CONTEXT_BYTES) / gib:.2f}" in replayed
    assert M.rehearsal_misfit(hsdp, 8, 139 * gib, replayed_bytes=gib) is None   # below the state: the state's
    # the rank's own check: ranks on this device x the estimate against its memory
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=139 * gib))
    cfg = RunConfig.from_dict({"variant": "ddp", "gpus": 8, "rehearse": True})
    sizes = {"parameters": p, "param_bytes": 4 * p}
    assert sharded.rehearsal_misfit(cfg, sizes, torch.device("cuda", 0)) == reason
    assert sharded.rehearsal_misfit(cfg, sizes, torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)   # round-robin over 8 GPUs: one rank each
    assert sharded.rehearsal_misfit(cfg, sizes, torch.device("cuda", 0)) is None


# -- rehearsed runs equal ordinary ones, and are marked ---------------------------------------------

def launch(out, **config) -> dict:
    base = {"gpus": 2, "workload": TINY_LM, "synthetic_size": 32, "global_batch": 8, "max_steps": 3,
            "warmup_steps": 2, "eval_each_epoch": False, "save_checkpoint": True}
    assert launch_main(["--config", json.dumps({**base, **config}), "--out", str(out)]) == 0
    return results.read_metrics(out)


def losses(rdir) -> list[float]:
    return [float(r["loss_global"]) for r in csv.DictReader(open(rdir / results.STEPS))]


@pytest.mark.parametrize("gpus", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_rehearsed_runs_train_as_ordinary_ones_and_are_marked(tmp_path, gpus):
    ordinary = launch(tmp_path / "ordinary", variant="fsdp", gpus=gpus, max_cpu_ranks=4)
    rehearsed_ = launch(tmp_path / "rehearsed", variant="fsdp", gpus=gpus, max_cpu_ranks=4, rehearse=True)
    assert ordinary["status"] == rehearsed_["status"] == "ok", rehearsed_["reason"]
    assert rehearsed_["config"]["rehearse"] is True and "rehearse" not in ordinary["config"]
    a, b = losses(tmp_path / "ordinary"), losses(tmp_path / "rehearsed")
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= TOLERANCE
    pa, pb = (torch.load(tmp_path / d / "model.pt") for d in ("ordinary", "rehearsed"))
    assert max((pa[k] - pb[k]).abs().max().item() for k in pa) <= TOLERANCE
    assert [r["device"] for r in rehearsed_["memory_components"]] == list(range(gpus))


# The two-rank cases of this file, trained in the session's one two-rank spawn (module fixture
# `two_ranks`): a spawn (two interpreters importing torch, a process group) costs more than the
# tiny cases it trains.
PER_RANK_CASES = [Case("ddp", "ddp", TINY_LM), Case("zero1", "zero1", TINY_LM), Case("fsdp", "fsdp", TINY_LM),
                  Case("fsdp_keep", "fsdp", TINY_LM, {"reshard_after_forward": False})]
REHEARSED_CASES = [Case("ddp_r", "ddp", TINY_LM, {"rehearse": True}), Case("fsdp_r", "fsdp", TINY_LM, {"rehearse": True}),
                   Case("zero1_r", "zero1", TINY_LM, {"rehearse": True})]
NESTED_CASES = [Case("nested_ddp", "ddp", NESTED), Case("nested_fsdp", "fsdp", NESTED)]


share_two_ranks(__name__, PER_RANK_CASES + REHEARSED_CASES + NESTED_CASES)


@pytest.fixture(scope="module")
def two_ranks():
    return two_rank_results(__name__)


def test_rehearsed_gloo_ranks_give_ddps_losses_gradients_and_parameters(two_ranks):
    """The engine's pieces with the option set (on the CPU it changes nothing but the record)."""
    trained = two_ranks
    for name in ("ddp_r", "fsdp_r", "zero1_r"):
        assert trained[name].config["rehearse"] is True
        diffs = max_differences(trained["ddp"], trained[name])
        assert all(v <= TOLERANCE for v in diffs.values()), (name, diffs)


# -- never a speed ------------------------------------------------------------------------------------

def test_a_rehearsed_record_never_enters_a_throughput_or_scaling_table(tmp_path):
    from dpbench.report.plots import load_tables, plot_scaling_efficiency, plot_throughput
    from dpbench.report.summarize import render_summary
    rs = fake_result_set(tmp_path, [dict(variant="single", images_per_s=[1000, 1010]),
                                    dict(variant="ddp", gpus=2, images_per_s=[1900, 1920]),
                                    dict(variant="ddp", gpus=4, options={"rehearse": True}, images_per_s=[700, 710])])
    summary = rs.table("summary")
    marked = summary[summary["rehearsed"]]
    assert len(marked) == 2 and marked["images_per_s"].isna().all() and marked["step_ms_p50"].isna().all()
    assert (~summary[~summary["rehearsed"]]["images_per_s"].isna()).all()
    med = cells(summary)
    assert set(speed_runs(med)["gpus"]) == {1, 2}                        # the rehearsed cell is not timed
    four = med[med["gpus"] == 4].iloc[0]
    assert four["rehearsed"] and math.isnan(four["images_per_s"]) and math.isnan(four["efficiency_strong"])
    words = render_summary(rs.root, rs.tag)
    headline = words.split("## Headline")[1].split("## Strong and weak")[0]
    scaling = words.split("## Strong and weak scaling")[1].split("\n## ")[0]
    gpus_in_scaling = {cells_[2].strip() for line in scaling.splitlines()
                       if (cells_ := line.split("|"))[1:2] and cells_[1].strip() == "ddp"}
    assert "rehearse" not in headline and gpus_in_scaling == {"2"}
    assert "2 run(s) were rehearsed" in words
    tables = load_tables(rs.root, rs.tag)
    for draw in (plot_throughput, plot_scaling_efficiency):   # what the figures draw: no 4-rank point
        fig = draw(tables)
        drawn = [line for ax in fig.axes for line in ax.get_lines()] + [c for ax in fig.axes for c in ax.collections]
        xs = {float(x) for artist in drawn for x in getattr(artist, "get_xdata", lambda: [])()}
        assert 4.0 not in xs


def test_traffic_compares_counted_collectives_not_bucket_sizes():
    rows = [{"run_id": "r", "collective": "all_reduce", "count": 1, "bytes": 400, "predicted_bytes": 400.0,
             "source": "buckets"},
            {"run_id": "r", "collective": "all_gather", "count": 4, "bytes": 800, "predicted_bytes": 800.0,
             "source": "counted"}]
    assert [r["collective"] for r in T.comparison(rows)] == ["all_gather"]


# -- the memory model per rank against the tensors counted ---------------------------------------

def record_of(trained, name: str, world: int) -> dict:
    t = trained[name]
    p = t.parameter_count
    return {"run_id": f"{name}-g{world}", "variant": name.split("_")[0], "gpus": world, "status": "ok",
            "options": {"per_gpu_batch": 4}, "config": t.config, "parameters": p, "param_bytes": 4 * p,
            "memory_components": t.memory, "collectives": t.collectives, "size": "32x2", "launch": {"nodes": 1}}


def check_per_rank(world: int, trained: dict) -> None:
    recs = [record_of(trained, c.name, world) for c in PER_RANK_CASES]
    table = R.memory_table(recs)
    by = {(r["variant"], r["component"]): r for r in table}
    for variant in ("ddp", "zero1", "fsdp", "fsdp-keep"):
        for comp in ("parameters", "gradients", "optimizer", "largest_unit"):
            r = by[(variant, comp)]
            assert r["gpus"] == world and r["relative_difference"] == pytest.approx(0, abs=1e-12), r
    p_bytes = 4 * trained["ddp"].parameter_count
    assert by[("fsdp", "parameters")]["measured_mib"] * MIB == p_bytes / world       # 1/N per rank
    assert by[("zero1", "optimizer")]["measured_mib"] * MIB == p_bytes / world        # the mean partition
    unit = by[("fsdp", "largest_unit")]["measured_mib"]
    assert (unit == 0) if world == 1 else (unit > 0)    # one rank gathers nothing; N ranks a whole unit
    traffic = {(t["variant"], t["collective"]): t for t in R.traffic_table(recs)}
    if world > 1:
        assert traffic[("fsdp", "all_gather")]["relative_difference"] == pytest.approx(0, abs=1e-12)
        assert traffic[("fsdp", "all_gather")]["source"] == "counted"


@pytest.mark.parametrize("world", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_memory_model_per_rank_components_match_the_counted_tensors(world, request):
    trained = request.getfixturevalue("two_ranks") if world == 2 else train_all(PER_RANK_CASES, world=world)
    check_per_rank(world, trained)


def test_the_largest_unit_is_a_units_own_parameters_with_nested_units():
    """Without FSDP: each parameter counted in the innermost unit holding it, whatever the list order."""
    model = nn.Sequential(nn.Linear(8, 16), Outer(16), nn.Linear(16, 10))
    outer, inner = model[1], model[1].inner
    for units in ([outer, inner, model], [model, inner, outer]):
        own = {id(u): params for u, params in zip(units, components.own_parameters(units))}   # in the order given
        assert sum(p.numel() for p in own[id(inner)]) == 16 * 16 + 16
        assert sum(p.numel() for p in own[id(outer)]) == 2 * (16 * 64) + 64 + 16      # b and c, not inner's
        assert sum(p.numel() for p in own[id(model)]) == 8 * 16 + 16 + 16 * 10 + 10
    assert components.largest_unit_bytes([outer, inner, model]) == 4 * (2 * 16 * 64 + 64 + 16)
    assert isinstance(inner, Inner)


def test_fsdp_gathers_a_nested_units_own_parameters_and_trains_as_ddp(two_ranks):
    trained = {"ddp": two_ranks["nested_ddp"], "fsdp": two_ranks["nested_fsdp"]}
    diffs = max_differences(trained["ddp"], trained["fsdp"])
    assert all(v <= TOLERANCE for v in diffs.values()), diffs
    own_outer = 4 * (2 * 16 * 64 + 64 + 16)     # Outer's b and c; its Inner gathers on its own
    for row in trained["fsdp"].memory:
        assert row["largest_unit_mib"] * MIB == own_outer == row["largest_gather_mib"] * MIB
    gathers = {r["collective"]: r for r in trained["fsdp"].collectives}["all_gather"]
    assert gathers["count"] == 2 * 5            # 2 Outer + 2 Inner + the root, in forward and backward
    rec = record_of(trained, "fsdp", 2)
    row = R.component_rows(rec)[0]
    assert row["predicted_largest_unit_mib"] * MIB == own_outer


# -- C9 from search records ------------------------------------------------------------------------

def test_the_in_process_search_goes_to_the_lines_edge_and_runs_nothing_far_beyond_the_budget():
    """A straight line's edge takes two trials: the largest batch it puts within the budget, and
    the one above it."""
    ran = []

    def measure(b):   # 500 MiB of state, 100 MiB a sample
        ran.append(b)
        return {"batch": b, "how": "measured", "peak_mib": 500 + 100 * b, "reserved_mib": 600 + 100 * b}
    trials = [measure(1), measure(2)]
    found = search_budget(measure, 2.0, trials, resolution=1 / 64)
    assert found["largest"] == 15 and found["smallest_failing"] == 16
    assert all(500 + 100 * b <= SAFE * 2048 for b in ran)
    assert ran == [1, 2, 15, 16]
    again = search_budget(measure, 1.0, trials, resolution=1 / 64)    # a second budget reuses the trials
    assert again["largest"] == 5 and len(ran) == len(set(ran))


def test_a_search_past_the_launchs_time_is_cut_short_and_its_largest_is_no_c9_row():
    """Trials after the deadline are not run: the search ends at once with what fitted so far as a
    lower bound (no smallest failing batch), and C9 takes no largest batch from it, saying why;
    another budget's search reuses the trials measured before the cut."""
    ran, clock = [], {"late_from": 3}

    def measure(b):   # 500 MiB of state, 100 MiB a sample; the time is spent after 3 trials
        if len(ran) >= clock["late_from"]:
            return {"batch": b, "how": "late", "peak_mib": None, "reserved_mib": None}
        ran.append(b)
        return {"batch": b, "how": "measured", "peak_mib": 500 + 100 * b, "reserved_mib": 600 + 100 * b}
    trials = [measure(1), measure(2)]
    found = search_budget(measure, 2.0, trials, resolution=1 / 64)
    assert found["cut_short"] and found["smallest_failing"] is None
    assert len(ran) == 3 and found["largest"] == (ran[2] if 500 + 100 * ran[2] <= 2048 else 2)
    assert [t["batch"] for t in trials] == ran   # a late answer is no trial
    assert any(t[3] == "late" for t in found["trials"])
    small = search_budget(measure, 0.6, trials, resolution=1 / 64)   # decided by the trials run: 1 fits, 2 not
    assert not small["cut_short"] and (small["largest"], small["smallest_failing"]) == (1, 2)
    rec = {"run_id": "1b-fsdp-g2", "variant": "fsdp", "gpus": 2, "status": "ok", "size": "2048x20",
           "parameters": 1_080_000_000, "param_bytes": 4_320_000_000, "config": {},
           "search": {"24GB": found}}
    (row,) = rehearsed.c9_rows([rec], {"24GB": 2.0})
    assert row["largest_batch"] is None and "cut short" in row["reason"] and str(found["largest"]) in row["reason"]


def test_a_too_flat_first_line_cannot_send_the_first_trial_past_the_shared_gpu():
    """As ddp at 236M on 4 ranks of one H200 (4036c92): batch 1's peak lies above the line of the
    larger batches, so the line through 1 and 2 is far too flat and put the first trial near 47,
    about 36 GiB a rank. The first extrapolated trial now goes at most FIRST_TRIAL_SPAN times the
    largest batch measured, and every trial that runs stays within SAFE x the budget."""
    from dpbench.claims.c9.rehearsal import FIRST_TRIAL_SPAN
    ran = []

    def true_peak(b):
        return {1: 4559.0, 2: 4950.0}.get(b, 4169.0 + 700.0 * b)

    def measure(b):
        ran.append(b)
        return {"batch": b, "how": "measured", "peak_mib": true_peak(b), "reserved_mib": true_peak(b) + 30}
    trials = [measure(1), measure(2)]
    found = search_budget(measure, 22.0, trials)
    assert ran[2] == FIRST_TRIAL_SPAN * 2 < 47
    assert all(true_peak(b) <= SAFE * 22 * 1024 for b in ran)
    assert found["largest"] <= 26 < found["smallest_failing"]   # 4169 + 700 b <= 22 GiB up to b = 26


SIZES = {"256x4": 12_000_000, "512x8": 42_000_000, "1024x16": 235_000_000}


def search_record(variant: str, gpus: int, size: str, largest: dict, reshard: bool = True, trials=None) -> dict:
    """A claims.c9.rehearsal record with its searches (largest batch per budget)."""
    p = SIZES[size]
    return {"run_id": f"{size}-{variant}-g{gpus}", "variant": variant, "gpus": gpus, "status": "ok", "size": size,
            "parameters": p, "param_bytes": 4 * p, "launch": {"nodes": 1},
            "config": {"momentum": 0.9, "rehearse": True, "reshard_after_forward": reshard},
            "search": {name: {"largest": b, "trials": [[1, bool(b), 900.0, "measured"]]} for name, b in largest.items()},
            **({"search_trials": trials} if trials else {})}


def test_c9_text_is_computed_from_search_records_with_its_conditions():
    budgets = {"24GB": 22.0, "16GB": 14.0}
    line = {"256x4": (300, 60), "512x8": (600, 120), "1024x16": (3000, 400)}   # MiB at batch 0, MiB a sample
    recs = []
    for size in SIZES:
        a, b = line[size]
        trials = [{"batch": n, "how": "measured", "peak_mib": a + b * n} for n in (1, 2)]
        recs.append(search_record("ddp", 1, size, {"24GB": 40, "16GB": 20}, trials=trials))
    # on 4 rehearsed ranks: DDP as at one rank; fsdp ahead from 42M; zero1 only at 235M; no budget but the rows'
    recs += [search_record("ddp", 4, s, {"24GB": 40, "16GB": 20}) for s in SIZES]
    recs += [search_record("fsdp", 4, s, {"24GB": v, "16GB": v // 2}) for s, v in zip(SIZES, (40, 44, 60))]
    recs += [search_record("zero1", 4, s, {"24GB": v, "16GB": v // 2}) for s, v in zip(SIZES, (40, 40, 48))]
    rows = rehearsed.c9_rows(recs, budgets)
    assert {r["budget"] for r in rows} == set(budgets) and all(r["rehearsed"] for r in rows)
    assert all(r["samples_per_s_at_largest"] is None for r in rows)
    v = verdict.verdict_from(rows)
    assert v.verdict == NUANCE and v.rehearsed and v.budgets == budgets
    assert {c.quantity for c in v.crossovers} == {"largest_batch"}            # no speed from rehearsed ranks
    first = {(c.variant, c.budget): c.first_exceeds for c in v.crossovers}
    assert first[("fsdp", "24GB")] == 42_000_000 and first[("zero1", "24GB")] == 235_000_000
    assert first[("fsdp", "16GB")] == 42_000_000 and first[("zero1", "16GB")] == 235_000_000
    # the model's largest batch: (budget - state - overhead) / activations a sample, from DDP's one-rank line
    ddp1 = next(r for r in rows if r["variant"] == "ddp" and r["gpus"] == 1 and r["workload"].endswith("1024x16")
                and r["budget"] == "24GB")
    state = 16 * SIZES["1024x16"] / MIB
    assert ddp1["predicted_largest_batch"] == math.floor((22 * 1024 - state - (3000 - state)) / 400)
    f = text.finding(SimpleNamespace(probes={"C9": probe_of(rows)}, measured_on_probe=lambda c: "probe",
                                     gpus_found=lambda: 1))
    assert f.verdict == NUANCE and f.data["rehearsed"] and f.data["budgets"] == budgets
    assert "42M" in f.summary and "22 GiB per rank (24GB)" in f.summary and "12 GiB" not in f.summary
    assert any(e.startswith("Conditions: 1, 4 rank(s)") and "rehearsed" in e for e in f.evidence)
    crossings = {(c["variant"], c["budget"]): c for c in f.data["crossovers"]}
    assert crossings[("fsdp", "24GB")]["predicted_first_exceeds"] is not None
    # within DDP's bracket (its search saw 45 fail): 44 found by a bisection is not for certain more
    bracketed = [dict(r, smallest_failing=45) if r["variant"] == "ddp" and r["budget"] == "24GB" else r for r in rows]
    first = {(c.variant, c.budget): c.first_exceeds for c in verdict.verdict_from(bracketed).crossovers}
    assert first[("fsdp", "24GB")] == 235_000_000 and first[("fsdp", "16GB")] == 42_000_000


def test_c9s_model_leaves_a_sharded_rank_the_gradients_ddp_frees_where_the_backward_peaks():
    a, b = 3000.0, 400.0                       # DDP's one-rank line: MiB at batch 0, MiB a sample
    trials = [{"batch": n, "how": "measured", "peak_mib": a + b * n} for n in (1, 2)]
    ddp = search_record("ddp", 1, "1024x16", {"24GB": 40}, trials=trials)
    fsdp = search_record("fsdp", 4, "1024x16", {"24GB": 48})
    p = SIZES["1024x16"]
    for backward in (True, False):
        # DDP's profiled step peaked in its backward (past its forward's peak), or in its forward
        ddp["memory_components"] = [{"forward_peak_mib": 900.0, "backward_peak_mib": 1000.0 if backward else 800.0}]
        rows = {r["variant"]: r for r in rehearsed.c9_rows([ddp, fsdp], {"24GB": 22.0})}
        freed = 4 * p / MIB if backward else 0.0                       # the gradients zero_grad frees: b·P
        overhead = a - (16 * p / MIB - freed)                           # DDP's line less what it holds then
        held = 12 * p / 4 / MIB - (freed / 4)                          # fsdp on 4: 12·P/4 less its gradients
        assert rows["fsdp"]["predicted_largest_batch"] == math.floor((22 * 1024 - held - overhead) / b)
        assert rows["ddp"]["predicted_largest_batch"] == math.floor((22 * 1024 - a) / b)


def probe_of(rows):
    from dpbench.claims.records import ProbeRecord, obs
    observations = [obs(verdict.CONDITIONS_ID, "where", interconnect="one GPU")]
    observations += [obs(verdict.row_id(r), "a row", **r) for r in rows]
    return ProbeRecord("C9", "C9", {"device_type": "cuda", "gpus_visible": 1}, observations,
                       verdict.verdict_from(rows).verdict, "")


def test_ddps_all_reduces_are_counted_where_the_reducer_runs_them(tmp_path):
    """On CUDA the reducer's thread is out of the dispatch counter's sight: a comm hook counts
    each bucket it all-reduces (rehearsed steps only), so DDP's traffic is counted, not assumed."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from dpbench.claims.c9.rehearsal import count_reducer
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = DDP(nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 3)))
        counts = count_reducer(model)
        model(torch.randn(4, 10)).sum().backward()
        assert counts["count"] == 0                          # off: nothing counted
        counts["on"] = True
        model(torch.randn(4, 10)).sum().backward()
        assert (counts["count"], counts["bytes"]) == (1, 4 * sum(p.numel() for p in model.parameters()))
        assert count_reducer(nn.Linear(2, 2)) == {"on": False, "count": 0, "bytes": 0}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_device_script_runs_its_tiny_part_on_the_cpu(tmp_path):
    """tools/device/rehearse.py --part 1 --tiny: the dpbench launch, N = 1 and 2 on gloo, the
    tables, figures and C9's text, at most 8 files under OUT; --combine redraws from the tar."""
    import subprocess
    import sys
    script = str(Path(__file__).resolve().parents[2] / "tools" / "device" / "rehearse.py")
    done = subprocess.run([sys.executable, script, "--part", "1", "--tiny", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(files) <= 8 and "rehearsal-part1.tar.gz" in files and "rehearsal.md" in files
    rows = list(csv.DictReader(open(tmp_path / "work" / "1" / "memory_per_rank.csv")))
    assert {(r["variant"], r["gpus"]) for r in rows} >= {("ddp", "1"), ("fsdp", "2"), ("fsdp-keep", "2")}
    records = [json.loads(x) for x in (tmp_path / "work" / "1" / "runs" / "cases-2.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and r["config"]["rehearse"] for r in records)
    with tarfile.open(tmp_path / "out" / "rehearsal-part1.tar.gz") as tar:   # every launch's ranks' output
        assert {"launch-1.log", "launch-2.log"} <= set(tar.getnames())
    again = subprocess.run([sys.executable, script, "--combine", str(tmp_path / "out" / "rehearsal-part1.tar.gz"),
                            "--out", str(tmp_path / "combined"), "--work", str(tmp_path / "work")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and (tmp_path / "combined" / "rehearsal.md").read_text().startswith("# Rehearsed")


def test_a_trial_the_shared_gpu_cannot_hold_is_not_run_and_the_search_says_so():
    """Rehearsed ranks share one GPU: a trial whose ranks together would not fit it is decided
    without running (out of memory on one rank mid-step would leave its peers waiting), and the
    search marks its largest batch as limited by the device, not by the budget."""
    def measure(b):
        if b > 4:
            return {"batch": b, "how": "device-full", "peak_mib": None, "reserved_mib": 9e9}
        return {"batch": b, "how": "measured", "peak_mib": 100.0 * b, "reserved_mib": 120.0 * b}
    trials = [measure(1), measure(2)]
    found = search_budget(measure, 1.0, trials, resolution=1 / 64)
    assert found["largest"] == 4 and found["limited_by_device"]
    assert not search_budget(measure, 0.25, trials)["limited_by_device"]


def test_a_trial_too_big_for_the_gpu_above_a_measured_failure_limits_nothing():
    """As 42.3M ddp at N = 8 on one H200: the first trial (52) was too big for the shared GPU, a
    later one (45) failed the budget by measurement: the budget, not the device, set the answer."""
    def measure(b):
        if b >= 50:
            return {"batch": b, "how": "device-full", "peak_mib": None, "reserved_mib": 9e9}
        return {"batch": b, "how": "measured", "peak_mib": 100.0 * b, "reserved_mib": 120.0 * b}
    trials = [measure(1), measure(2)]
    found = search_budget(measure, 4522 / 1024, trials, start=52)   # 52 within SAFE x the cap by the fit
    assert found["smallest_failing"] < 50 and not found["limited_by_device"]
    assert any(d[3] == "device-full" for d in found["trials"])


@pytest.mark.slow
def test_ranks_that_lose_step_end_within_the_collective_timeout(tmp_path):
    """Rank 1 skips a step (the planted desync): its peer's wait ends at the timeout, the case is
    a failed line, and the cases after it are lines that say why they did not run."""
    import os
    import subprocess
    import sys
    tiny = {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 64}
    plan = [{"name": n, "variant": v, "options": {}, "args": tiny, "batch": 2, "budgets": {}}
            for n, v in (("first", "ddp"), ("second", "fsdp"))]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "DPBENCH_PLANT": "rehearsal-desync", "DPBENCH_REHEARSAL_TIMEOUT_S": "5"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "dpbench.claims.c9.rehearsal", "--plan", str(tmp_path / "plan.json"),
                           "--out", str(tmp_path / "cases.jsonl")], env=env, capture_output=True, text=True,
                          timeout=240)
    lines = [json.loads(x) for x in (tmp_path / "cases.jsonl").read_text().splitlines()]
    assert done.returncode != 0
    assert [(r["case"], r["status"]) for r in lines] == [("first", "failed"), ("second", "failed")]
    assert "first" in lines[1]["reason"]


def test_a_second_budget_goes_to_its_edge_from_the_first_budgets_trials():
    """As 1.08B fsdp at N = 2 on one H100 (cb9adc2): the 24GB search left 11 fitting 22 GiB and 12
    failing; within 14 GiB the line puts the edge at 5, so 5 and 6 settle it (the rule before
    this ran 5, then the midpoint 8, then 6)."""
    ran = []

    def measure(b):   # 7,000 MiB of state, 1,400 MiB a sample
        ran.append(b)
        return {"batch": b, "how": "measured", "peak_mib": 7000.0 + 1400.0 * b, "reserved_mib": 7300.0 + 1400.0 * b}
    trials = [measure(2)]
    wide = search_budget(measure, 22.0, trials)
    assert (wide["largest"], wide["smallest_failing"]) == (11, 12)
    ran.clear()
    narrow = search_budget(measure, 14.0, trials)
    assert (narrow["largest"], narrow["smallest_failing"], ran) == (5, 6, [5, 6])


def test_a_line_that_misses_its_edge_falls_back_to_midpoints():
    """A peak that bends upward: each trial the line put within the budget fails, and the
    midpoints after them still settle the edge exactly, in fewer trials than one per batch."""
    ran = []

    def peak(b):
        return 1000.0 + 100.0 * b + 4.0 * b * b

    def measure(b):
        ran.append(b)
        return {"batch": b, "how": "measured", "peak_mib": peak(b), "reserved_mib": peak(b) + 50}
    trials = [measure(1), measure(2)]
    found = search_budget(measure, 8.0, trials, resolution=1 / 64)
    true = max(b for b in range(1, 200) if peak(b) <= 8 * 1024)
    assert (found["largest"], found["smallest_failing"]) == (true, true + 1)
    assert len(ran) - 2 < true // 2


def test_a_line_too_steep_below_the_edge_gives_way_to_doubling():
    """Batches 1 and 2 steeper than the rest: the line puts the edge at 2, batch 3 fits after
    all, and the search doubles from there instead of stepping up one batch a trial (edge_search
    alone: search_budget's SAFE rule would not run a trial the line puts this far out)."""
    from dpbench.claims.c9.rehearsal import edge_search
    ran = []

    def peak(b):
        return 1000.0 + 500.0 * min(b, 2) + 5.0 * max(b - 2, 0)

    trials = [{"batch": b, "how": "measured", "peak_mib": peak(b)} for b in (1, 2)]

    def fits(b):
        ran.append(b)
        trials.append({"batch": b, "how": "measured", "peak_mib": peak(b)})
        return peak(b) <= 2048
    found = edge_search(fits, trials, 2048.0, resolution=1 / 64)
    assert (found["largest"], found["smallest_failing"]) == (11, 12)
    # 2: the bracket, said; 3 and 7 fit where the line put the edge below them, and a doubling
    # follows each (6, 14), where one batch a trial would have stepped up to 12
    assert ran[:5] == [2, 3, 6, 7, 14]
