"""The claims: probes on the CPU path, and ledger verdicts that follow the evidence."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from dpbench import results
from dpbench.claims import CLAIM_IDS, CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims import c2_device_ids, c3_wrap_optimizer, c4_save_load, c5_gather_warning
from dpbench.claims import c6_reduction, c7_cudnn_threads, from_runs, probe
from dpbench.claims.ledger import FIGURES, experiment_groups, group_labels, write_ledger

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "claims.yaml"
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")


# -- probes --------------------------------------------------------------------------------

@cpu_only
def test_c3_cpu_path_wrapper_is_inert_and_grads_accumulate():
    rec = c3_wrap_optimizer.run()
    obs = {o["what"]: o for o in rec["observations"]}
    cpu = "(cpu, device_ids=[0, 1])"
    assert obs[f"construction {cpu}"]["wrapper.device_ids"] == []  # ids dropped without CUDA
    assert obs[f"wrapper.zero_grad() between two backward passes {cpu}"]["result"].startswith("gradients accumulate")
    assert obs[f"wrapper.state_dict() {cpu}"]["result"] == "{}"
    assert obs[f"torch.optim.lr_scheduler.StepLR(wrapper, step_size=1) {cpu}"]["error"] == \
        "TypeError: DataParallel is not an Optimizer"
    assert not obs[f"wrapper.module.step() {cpu}"]["misbehaves"]
    assert rec["verdict"] == REFUTED
    assert all("needs" in p for p in rec["parts_not_run"]) and len(rec["parts_not_run"]) == 2


def test_c4_article_load_fails_and_alternatives_round_trip_bit_for_bit():
    rec = c4_save_load.run()
    obs = {o["what"]: o for o in rec["observations"]}
    article = next(o for w, o in obs.items() if w.startswith("article's load"))
    assert article["error"] == "RuntimeError: Error(s) in loading state_dict for DataParallel:"
    assert article["second_line"].startswith('Missing key(s) in state_dict: "module.conv1.weight"')
    assert obs["a fresh model differs from the saved one (so round trips are not vacuous)"]["result"]
    exact = [o for o in rec["observations"] if "round_trip_bit_exact" in o]
    assert len(exact) >= 5 and all(o["round_trip_bit_exact"] for o in exact)
    assert rec["verdict"] == NUANCE


def test_c4_identical_sees_one_ulp():
    sd = c4_save_load.trained_like().state_dict()
    other = {k: v.clone() for k, v in sd.items()}
    w = other["linear.bias"]
    w[0] = torch.nextafter(w[0], torch.tensor(1e9))
    assert c4_save_load.identical(sd, {k: v.clone() for k, v in sd.items()})
    assert not c4_save_load.identical(sd, other)


def test_c6_article_arithmetic_exactly():
    a = c6_reduction.article_arithmetic()
    assert a["split"] == [2, 1]
    assert a["one device mean"]["value"] == 0.4333
    assert a["mean of per-device means"]["value"] == 0.525
    assert a["sum / N"]["value"] == 0.4333
    assert a["one device mean"]["per_sample_weights"] == [0.3333] * 3
    assert a["sum / N"]["per_sample_weights"] == [0.3333] * 3
    assert a["mean of per-device means"]["per_sample_weights"] == [0.25, 0.25, 0.5]


def test_c6_chunk_sizes_as_dataparallel_splits():
    assert c6_reduction.chunk_sizes(128, 3) == [43, 43, 42]
    assert c6_reduction.chunk_sizes(80, 3) == [27, 27, 26]
    assert c6_reduction.chunk_sizes(128, 2) == [64, 64]
    assert c6_reduction.chunk_sizes(128, 4) == [32] * 4


def _small_bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)).eval()


def test_c6_cpu_emulation_uneven_split_biases_mean_of_means_only():
    x, y = c6_reduction._batch(10)
    e = c6_reduction.emulate(_small_bn_net(), x, y, 3)
    assert e["chunks"] == [4, 4, 2]
    assert abs(e["loss_sum_over_n"] - e["loss_full_mean"]) < 1e-6
    assert e["grad_rel_diff_sum_over_n"] < 1e-5
    assert e["grad_rel_diff_mean_of_means"] > 1e-3
    assert c6_reduction.biased(e["grad_rel_diff_mean_of_means"], e["grad_rel_diff_sum_over_n"])


def test_c6_cpu_emulation_even_split_has_no_bias():
    x, y = c6_reduction._batch(12)
    e = c6_reduction.emulate(_small_bn_net(), x, y, 3)
    assert e["chunks"] == [4, 4, 4]
    assert e["grad_rel_diff_mean_of_means"] < 1e-5
    assert not c6_reduction.biased(e["grad_rel_diff_mean_of_means"], e["grad_rel_diff_sum_over_n"])


@cpu_only
@pytest.mark.parametrize("module", [c2_device_ids, c5_gather_warning, c7_cudnn_threads])
def test_gpu_probes_report_not_run_on_cpu(module):
    rec = module.run()
    assert rec["verdict"] == NOT_RUN
    assert rec["not_run"].startswith("needs ") and "(found 0)" in rec["not_run"]
    assert rec["ran_on"] == {**rec["ran_on"], "device_type": "cpu", "gpus_visible": 0}


@cpu_only
def test_c5_cpu_path_returns_the_scalar_without_warning():
    (obs,) = c5_gather_warning.run()["observations"]
    assert obs["shape"] == [] and obs["warnings"] == []


def test_probe_cli_writes_the_record(tmp_path):
    out = tmp_path / "claims" / "C3.json"
    proc = subprocess.run([sys.executable, "-m", "dpbench.claims.probe", "C3", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rec = results.read_json(out)
    assert rec["claim"] == "C3" and rec["verdict"] == REFUTED and proc.stdout.startswith("C3: refuted")


def test_param_count_used_for_the_memory_estimate():
    from dpbench.model import resnet18
    assert sum(p.numel() for p in resnet18().parameters()) == from_runs.PARAMS


# -- the experiment file -------------------------------------------------------------------

def test_experiment_groups_are_labelled_per_claim_and_valid():
    pytest.importorskip("snakemake", reason="the schema check goes through snakemake's validator")
    from dpbench.pipeline import load_experiment
    from dpbench.plan import Plan

    labels = group_labels(EXPERIMENT)
    assert len(set(labels.values())) == len(labels)  # a label finds exactly one group
    assert {name.split("_")[0].upper() for name in labels} == {"C1", "C6", "C7", "C8"}
    assert labels["c7_benchmark_on"] == "cudnn_benchmark=True,max_steps=40,warmup_steps=10"
    config = load_experiment({"experiment": "claims"}, ROOT)
    assert config["probes"] == sorted(probe.MODULES)
    runs = Plan(config, 4).runs
    assert {results.options_label(rc.options) for rc in runs.values()} == set(labels.values())


def test_ledger_figures_are_figures_the_plots_draw():
    from dpbench.plots import FIGURES as drawn
    assert {name for names in FIGURES.values() for name in names} <= set(drawn)


# -- the ledger on fake evidence -----------------------------------------------------------

GATHER = c5_gather_warning.ARTICLE_TEXT
RAN_ON_GPU = {"device_type": "cuda", "gpus_visible": 4, "torch": "2.11.0+cu130", "cuda": "13.0",
              "cudnn": 91900, "gpu_names": ["NVIDIA H200"] * 4, "python": "3.12.3"}


def _probe(cid, verdict, observations, ran_on=RAN_ON_GPU):
    return {"claim": cid, "title": cid, "ran_on": ran_on, "observations": observations,
            "verdict": verdict, "advice": "", "not_run": None, "parts_not_run": []}


def fake_gpu_probes():
    return {
        "C2": _probe("C2", NUANCE, [
            {"what": "model on cuda:0, DataParallel(device_ids=[1, 0])", "stage": "first forward",
             "error": "RuntimeError: module must have its parameters and buffers on device cuda:1"},
            {"what": "CUDA_VISIBLE_DEVICES=1 set after torch.cuda.init()", "before": 4, "after": 4},
            {"what": "plain fix: model.to('cuda:1'), device_ids=[1, 0]", "stage": None}]),
        "C3": _probe("C3", REFUTED, [
            {"what": "wrapper.zero_grad() between two backward passes (cuda:0, device_ids=[0, 1])",
             "result": "gradients accumulate (grad == 2 x one pass)"},
            {"what": "calls that misbehave", "result": ["wrapper.zero_grad()", "wrapper.state_dict()"]}]),
        "C4": _probe("C4", NUANCE, [
            {"what": "article's load", "error": "RuntimeError: Error(s) in loading state_dict for DataParallel:",
             "second_line": 'Missing key(s) in state_dict: "module.conv1.weight"'},
            {"what": "load into the bare model, then wrap", "round_trip_bit_exact": True}]),
        "C5": _probe("C5", CONFIRMED, [
            {"what": "device_ids=[0] (the path taken with one visible GPU)", "shape": [], "warnings": []},
            {"what": "all 4 GPUs, batch 8 * n", "shape": [4], "device_ids": [0, 1, 2, 3],
             "exact_article_text": True, "warnings": [GATHER]},
            {"what": "warnings shown over 5 steps, default filters", "shown": 1, "steps": 5},
            {"what": "warnings shown over 5 steps, simplefilter('always')", "shown": 5, "steps": 5}]),
        "C6": _probe("C6", CONFIRMED, [
            {"what": "article's example, split by torch.chunk on 2 devices", **c6_reduction.article_arithmetic()},
            {"what": "CPU emulation, BatchNorm eval: batch 128 as 3 chunks", "chunks": [43, 43, 42],
             "grad_rel_diff_mean_of_means": 0.015, "grad_rel_diff_sum_over_n": 6e-7}]),
        "C7": _probe("C7", CONFIRMED, [
            {"what": "new-thread / same-thread slowdown", "benchmark_on": 65.7, "benchmark_off": 3.9}]),
    }


def fake_cpu_probes():
    cpu = {**RAN_ON_GPU, "device_type": "cpu", "gpus_visible": 0, "gpu_names": [], "cudnn": None}
    recs = {cid: {**rec, "ran_on": cpu} for cid, rec in fake_gpu_probes().items()}
    for cid in ("C2", "C5", "C7"):
        recs[cid].update(verdict=NOT_RUN, observations=[], not_run="needs 2 GPUs (found 0)")
    return recs


class FakeTag:
    """A results/<tag> folder: tidy tables for the claims experiment's groups, probes, provenance."""

    def __init__(self):
        self.labels = group_labels(EXPERIMENT)
        self.summary, self.memory, self.steps, self.warnings = [], [], [], []

    def run(self, group, variant, gpus, status="ok", **metrics):
        opts = dict(kv.split("=") for kv in self.labels[group].split(","))
        rid = results.run_id(variant, gpus, 0, opts)
        self.summary.append({"run_id": rid, "variant": variant, "gpus": gpus, "repeat": 0,
                             "options": self.labels[group], "status": status,
                             "reason": "" if status == "ok" else "DataParallel needs CUDA; no GPU visible",
                             "device_type": "cuda" if status == "ok" else "cpu",
                             "global_batch": int(opts.get("global_batch", 512)), **metrics})
        return rid

    def mem(self, rid, group, variant, gpus, per_device, data_dev0=None):
        self.memory += [{"run_id": rid, "variant": variant, "gpus": gpus, "options": self.labels[group],
                         "repeat": 0, "device": d, "allocated_mib": m, "data_mib": data_dev0 if d == 0 else None}
                        for d, m in enumerate(per_device)]

    def losses(self, rid, group, variant, gpus, values):
        self.steps += [{"run_id": rid, "variant": variant, "gpus": gpus, "options": self.labels[group],
                        "repeat": 0, "epoch": 1, "step": i, "loss_global": v} for i, v in enumerate(values)]

    def write(self, root, tag, probes):
        for name, rows in [("summary", self.summary), ("memory", self.memory), ("steps", self.steps),
                           ("warnings", self.warnings)]:
            results.write_csv(results.table_path(root, tag, name), results.TABLES[name], rows)
        results.write_json(results.tag_dir(root, tag) / "provenance.json",
                           {"torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900,
                            "gpu_names": ["NVIDIA H200"] * 4, "driver": "580.159.04", "tag": tag})
        for cid, rec in probes.items():
            results.write_json(results.tag_dir(root, tag) / "claims" / f"{cid}.json", rec)


def gpu_tag(dev0_extra=150.0, dp_speed=5400.0, dp_bench_on_ms=870.0, mean_gap=1e-3, data_dev0=None):
    t = FakeTag()
    for v in ("dp", "dp_mean"):
        t.mem(t.run("c1_memory_b2048", v, 2), "c1_memory_b2048", v, 2, [3000.0 + dev0_extra, 3000.0], data_dev0)
    t.mem(t.run("c1_memory_b2048", "ddp", 2), "c1_memory_b2048", "ddp", 2, [3000.0, 3000.4])
    base = [2.3 - 0.05 * i for i in range(8)]
    g = "c6_reduction_bn_eval"
    t.losses(t.run(g, "single", 1), g, "single", 1, base)
    t.losses(t.run(g, "dp_sum", 3), g, "dp_sum", 3, [b + 1e-6 * (i > 0) for i, b in enumerate(base)])
    rid = t.run(g, "dp_mean", 3)
    t.losses(rid, g, "dp_mean", 3, [b + mean_gap * (i > 0) for i, b in enumerate(base)])
    t.warnings.append({"run_id": rid, "variant": "dp_mean", "gpus": 3, "options": t.labels[g], "repeat": 0,
                       "category": "UserWarning", "message": GATHER, "count": 391, "first_step": 0})
    for group, ms in [("c7_benchmark_on", {"single": 9.5, "dp": dp_bench_on_ms, "ddp": 6.0}),
                      ("c7_benchmark_off", {"single": 9.4, "dp": 53.0, "ddp": 6.1})]:
        for v, p50 in ms.items():
            t.run(group, v, 1 if v == "single" else 2, step_ms_p50=p50)
    for v, gpus, ips in [("single", 1, 10000.0), ("dp", 1, 9000.0), ("dp", 2, dp_speed),
                         ("ddp", 1, 9800.0), ("ddp", 2, 17700.0)]:
        t.run("c8_fast", v, gpus, images_per_s=ips, wall_s=50000 / ips)
    return t


def ledger(tmp_path, tag, probes):
    tag.write(tmp_path, "t", probes)
    md, js = write_ledger(tmp_path, "t", EXPERIMENT)
    data = results.read_json(js)
    return md.read_text(), {c["id"]: c for c in data["claims"]}


def test_ledger_renders_every_claim_with_a_verdict_from_gpu_evidence(tmp_path):
    fig = results.figures_dir(tmp_path, "t") / "warnings.png"   # drawn by the plots rule, before
    fig.parent.mkdir(parents=True)
    fig.write_bytes(b"png")
    md, claims = ledger(tmp_path, gpu_tag(), fake_gpu_probes())
    assert claims["C5"]["figures"] == ["figures/warnings.png"] and "](figures/warnings.png)" in md
    for cid in ("C1", "C6", "C7", "C8"):   # the ledger's own figures, linked relative to claims.md
        assert claims[cid]["figures"][0] == f"figures/claim_{cid.lower()}.png"
        assert (results.tag_dir(tmp_path, "t") / claims[cid]["figures"][0]).stat().st_size > 10_000
    assert list(claims) == CLAIM_IDS
    verdicts = {cid: c["verdict"] for cid, c in claims.items()}
    assert verdicts == {"C1": NUANCE, "C2": NUANCE, "C3": REFUTED, "C4": NUANCE, "C5": CONFIRMED,
                        "C6": CONFIRMED, "C7": CONFIRMED, "C8": REFUTED}
    for cid, c in claims.items():
        assert re.search(rf"\| {cid} +\| {re.escape(c['title'])} +\| {c['verdict']} +\|", md)
        assert f"## {cid}: " in md and c["summary"] and c["measured_on"] and c["advice"]
    assert "+150 MiB" in claims["C1"]["summary"]
    assert "0.54x" in claims["C8"]["summary"]
    assert any("391 times" in e for e in claims["C5"]["evidence"])
    assert "torch 2.11.0+cu130" in " ".join(claims["C1"]["measured_on"])
    assert claims["C2"]["figures"] == []


@pytest.mark.parametrize("extra, verdict", [(150.0, NUANCE), (0.5, REFUTED), (-150.0, REFUTED)])
def test_c1_verdict_follows_device0_memory(tmp_path, extra, verdict):
    _, claims = ledger(tmp_path, gpu_tag(dev0_extra=extra), fake_gpu_probes())
    assert claims["C1"]["verdict"] == verdict


def test_c1_discounts_the_dataset_resident_on_device0(tmp_path):
    _, claims = ledger(tmp_path, gpu_tag(data_dev0=150.0), fake_gpu_probes())
    assert claims["C1"]["verdict"] == REFUTED


def test_c1_confirmed_when_gathered_outputs_explain_the_excess(tmp_path, monkeypatch):
    monkeypatch.setattr(from_runs, "GATHER_SHARE", 1e-4)  # logits of 2048 samples: 0.08 MiB of 150
    _, claims = ledger(tmp_path, gpu_tag(), fake_gpu_probes())
    assert claims["C1"]["verdict"] == CONFIRMED


@pytest.mark.parametrize("speed, verdict", [(5400.0, REFUTED), (12000.0, NUANCE), (19000.0, CONFIRMED)])
def test_c8_verdict_follows_throughput(tmp_path, speed, verdict):
    _, claims = ledger(tmp_path, gpu_tag(dp_speed=speed), fake_gpu_probes())
    assert claims["C8"]["verdict"] == verdict


@pytest.mark.parametrize("on_ms, verdict", [(870.0, CONFIRMED), (70.0, NUANCE), (53.0, REFUTED)])
def test_c7_verdict_follows_step_times(tmp_path, on_ms, verdict):
    _, claims = ledger(tmp_path, gpu_tag(dp_bench_on_ms=on_ms), fake_gpu_probes())
    assert claims["C7"]["verdict"] == verdict


def test_c6_bias_lost_in_training_noise_needs_nuance(tmp_path):
    _, claims = ledger(tmp_path, gpu_tag(mean_gap=1e-6), fake_gpu_probes())
    assert claims["C6"]["verdict"] == NUANCE


def test_ledger_on_cpu_says_what_was_not_run_and_why(tmp_path):
    t = FakeTag()
    groups = experiment_groups(EXPERIMENT)
    for group in t.labels:
        variants = {"c1": ["dp", "dp_mean"], "c6": ["dp_mean", "dp_sum"], "c7": ["dp"], "c8": ["dp"]}
        for v in variants[group.split("_")[0]]:
            t.run(group, v, max(groups[group]["gpus"]), status="skipped")
        t.run(group, "single", 1, images_per_s=50.0, wall_s=9.0, device_type="cpu")
    md, claims = ledger(tmp_path, t, fake_cpu_probes())
    for cid in CLAIM_IDS:
        assert re.search(rf"\| {cid} +\|", md)
    for cid, n in [("C1", 2), ("C8", 2)]:
        assert claims[cid]["verdict"] == NOT_RUN
        assert claims[cid]["not_run"].startswith(f"not run here: needs {n} GPUs (found 0)")
        assert '"skipped: DataParallel needs CUDA; no GPU visible"' in claims[cid]["not_run"]
    for cid in ("C2", "C5", "C7"):
        assert claims[cid]["verdict"] == NOT_RUN and "needs 2 GPUs (found 0)" in claims[cid]["not_run"]
    assert claims["C6"]["verdict"] == CONFIRMED  # the arithmetic and the CPU emulation stand alone
    assert any(e.startswith("training runs on an uneven split: not run here: needs 2 GPUs (found 0)")
               for e in claims["C6"]["evidence"])
    assert any("not run here: needs 2 GPUs (found 0)" in e for e in claims["C7"]["evidence"])
    assert "**Not run here:** needs 2 GPUs (found 0)" in md


def test_claim_figures_are_written_even_where_a_claim_did_not_run(tmp_path):
    tag = FakeTag()   # no runs at all: every claim figure says why instead
    md, claims = ledger(tmp_path, tag, {})
    for cid in ("C1", "C6", "C7", "C8"):
        assert (results.tag_dir(tmp_path, "t") / f"figures/claim_{cid.lower()}.png").exists()
    assert claims["C1"]["verdict"] == NOT_RUN


def test_c1_estimate_itemises_device0_from_sizes():
    e = from_runs.device0_excess_estimate(2048, 2)
    weights = from_runs.PARAMS * 4 / 2 ** 20
    assert e["summed_grads"] == e["momentum"] == pytest.approx(weights)
    assert e["input_batch"] == pytest.approx(1024 * (3 * 32 * 32 * 4 + 8) / 2 ** 20)   # the other half
    assert e["gathered_logits"] == pytest.approx(2048 * 10 * 4 / 2 ** 20)
    uneven = from_runs.device0_excess_estimate(128, 3)   # chunks 43/43/42: the others hold 42.5 on average
    assert uneven["input_batch"] == pytest.approx((128 - 42.5) * (3 * 32 * 32 * 4 + 8) / 2 ** 20)
    assert from_runs.device0_excess_estimate(512, 2, momentum=False)["momentum"] == 0.0
