"""C1's verdict over planted runs: device 0's excess, its noise, the output size where the
gathered outputs dominate, the largest-batch search's verdict."""
import re

import pytest
import torch

from dpbench import results
from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.c1 import probe as c1_probe
from dpbench.claims.c1 import text as c1_text
from dpbench.claims.c1 import verdict as c1_verdict
from dpbench.claims.ledger import Evidence
from dpbench.claims.records import obs

from claims.planted import PLANNED, _probe, fake_gpu_probes, FakeTag, gpu_tag, evidence


def _dp_cell(f, classes):
    return next(c for c in f.data["cells"] if c["variant"] == "dp" and c["num_classes"] == classes)


def max_batch_probe(per_width):
    """A C1 probe record: per_width = {classes: {variant: global batch}}."""
    return _probe("C1", c1_verdict.verdict_from(
        {v: {str(c): b for c, row in per_width.items() for vv, b in row.items() if vv == v}
         for v in c1_probe.VARIANTS}), [
        obs(f"c1.max_batch.{v}.out{c}", f"largest batch {v} trains within 8 GiB per GPU, {c:,} outputs (2 GPUs)",
            global_batch=b, smallest_failing=b + 64, cap_gib=8.0, peak_mib_per_device=[8000, 7000], trials=11)
        for c, row in per_width.items() for v, b in row.items()])


def test_param_count_follows_the_output_width():
    from dpbench.workloads.resnet import FEATURES, resnet18
    assert FEATURES == c1_verdict.FEATURES
    with torch.device("meta"):
        for classes in (10, 1000, 32768):
            model = resnet18(num_classes=classes)
            assert model.linear.out_features == classes
            assert sum(p.numel() for p in model.parameters()) == c1_verdict.param_count(classes)
    assert c1_verdict.param_count(10) == 11_173_962


def test_c1_article_right_from_the_output_size_where_gathered_outputs_dominate(tmp_path):
    f = c1_text.finding(evidence(tmp_path, gpu_tag()))
    assert f.verdict == CONFIRMED   # with its condition: from 32,768 outputs, not below
    assert f.data["conditions"] == [{"batch": 2048, "gpus": 2, "precision": "fp32", "outputs": [10, 1000, 32768],
                                     "from_outputs": 32768, "clean": True}]
    dp = {c["num_classes"]: c for c in f.data["cells"] if c["variant"] == "dp"}
    assert [k for k, c in sorted(dp.items()) if c["outputs_dominate"]] == [32768]
    assert dp[32768]["gathered_share"] == pytest.approx((900 - 160) / 900, abs=1e-3)
    assert dp[32768]["share_basis"] == "measured against dp_sum"
    # the estimate sizes the outputs from the run's own config: 2048 x 32768 fp32, and its head
    est = dp[32768]["estimate_mib"]
    assert est["gathered_logits"] == pytest.approx(2048 * 32768 * 4 / 2 ** 20)
    assert est["summed_grads"] == pytest.approx(c1_verdict.param_count(32768) * 4 / 2 ** 20)
    assert dp[10]["above_noise"] and not dp[10]["outputs_dominate"] and dp[10]["excess_mib"] == pytest.approx(100.0, abs=0.5)


def test_c1_excess_appearing_at_a_smaller_output_size_moves_the_condition(tmp_path):
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": {10: 100.0, 1000: 400.0, 32768: 900.0}})))
    assert f.verdict == CONFIRMED
    assert f.data["conditions"][0]["from_outputs"] == 1000


@pytest.mark.parametrize("excess_dp, verdict", [({10: 500.0, 1000: 600.0, 32768: 900.0}, CONFIRMED),
                                                ({10: 0.5, 1000: -0.3, 32768: 0.2}, REFUTED)])
def test_c1_verdict_at_the_extremes(tmp_path, excess_dp, verdict):
    sums = {10: 50.0, 1000: 55.0, 32768: 60.0} if verdict == CONFIRMED else {10: 0.1, 1000: 0.2, 32768: 0.1}
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": excess_dp, "excess_sum": sums})))
    assert f.verdict == verdict


def test_c1_noise_is_the_spread_over_repeats_and_ddp_ranks(tmp_path):
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"ddp_spread": 150.0})))
    dp10 = next(c for c in f.data["cells"] if c["variant"] == "dp" and c["num_classes"] == 10)
    assert dp10["noise_mib"] == pytest.approx(150.0) and not dp10["above_noise"]


@pytest.mark.parametrize("excess, above", [(40.0, False), (400.0, True)])
def test_c1_noise_is_at_least_one_gradient_set_of_the_runs_model(tmp_path, excess, above):
    # the repeats agree within 0.3 MiB and the DDP ranks within 0.4, but identical runs swing by
    # one fp32 gradient set (gradients allocated or not at the peak): 40 MiB is within it
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": {10: excess, 1000: 115.0, 32768: 900.0},
                                                     "excess_sum": {10: 38.0, 1000: 100.0, 32768: 160.0}})))
    dp10 = _dp_cell(f, 10)
    assert dp10["noise_mib"] == pytest.approx(c1_verdict.param_count(10) * 4 / 2 ** 20)   # 42.6 MiB
    assert dp10["noise_basis"] == "one gradient set" and dp10["above_noise"] is above
    assert _dp_cell(f, 32768)["noise_mib"] == pytest.approx(c1_verdict.param_count(32768) * 4 / 2 ** 20)
    assert dp10["params"] == 11_173_962 and dp10["excess_mib"] == pytest.approx(excess, abs=0.5)


def test_c1_gradient_set_keeps_fp32_parameters_under_bf16_autocast():
    assert c1_verdict.grad_set_mib(10, "bf16") == c1_verdict.grad_set_mib(10, "fp32") == pytest.approx(42.63, abs=0.01)
    assert c1_verdict.grad_set_mib(10, "fp8") is None   # no parameter dtype known: no floor from sizes


@pytest.mark.parametrize("swing, above", [(0.0, True), (80.0, False)])
def test_c1_ddp_noise_pools_ranks_over_repeats(tmp_path, swing, above):
    # every DDP run's ranks agree to 0.4 MiB, but one repeat sits `swing` MiB above the other:
    # that is noise the cells of the same model must clear
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": {10: 60.0, 1000: 115.0, 32768: 900.0},
                                                     "excess_sum": {10: 58.0, 1000: 100.0, 32768: 160.0},
                                                     "ddp_swing": swing})))
    ddp10 = next(c for c in f.data["cells"] if c["variant"] == "ddp" and c["num_classes"] == 10)
    assert ddp10["alike_spread_mib"] == pytest.approx(swing + 0.4)
    assert _dp_cell(f, 10)["above_noise"] is above
    assert _dp_cell(f, 1000)["noise_terms"]["DDP ranks x repeats"] == 0.0   # another model: not pooled


def test_c1_reserved_and_nvml_leave_out_the_resident_dataset(tmp_path):
    plain = c1_text.finding(evidence(tmp_path / "a", gpu_tag()))
    fed = c1_text.finding(evidence(tmp_path / "b", gpu_tag(c1={"data_mib": 259.0})))
    for a, b in zip(plain.data["cells"], fed.data["cells"]):
        for k in ("dev0_allocated_mib", "dev0_reserved_mib", "dev0_nvml_mib"):
            assert b[k] == pytest.approx(a[k])
    dp = _dp_cell(fed, 10)
    assert dp["dev0_reserved_mib"] - dp["others_reserved_mib"] == pytest.approx(dp["excess_mib"])
    assert dp["dev0_nvml_mib"] - dp["others_nvml_mib"] == pytest.approx(dp["excess_mib"])
    ratio = re.search(r"device 0 / others ([\d.]+-[\d.]+x)", fed.summary).group(1)
    assert ratio == re.search(r"device 0 / others ([\d.]+-[\d.]+x)", plain.summary).group(1) == "1.02-1.18x"


def test_c1_outputs_that_dominate_at_one_size_only_state_no_condition(tmp_path):
    # the gathered outputs dominate at 1,000 but not at 32,768: no "from N outputs" holds
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": {10: 100.0, 1000: 400.0, 32768: 170.0}})))
    assert f.verdict == NUANCE and f.data["conditions"][0]["from_outputs"] is None
    assert not f.data["conditions"][0]["clean"] and f.advice is None   # the standing advice


def test_c1_heavier_device0_without_the_outputs_dominating_is_a_clean_condition_up_to_the_widest(tmp_path):
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": {10: 100.0, 1000: 115.0, 32768: 170.0}})))
    assert f.verdict == NUANCE and f.data["conditions"][0] == {
        "batch": 2048, "gpus": 2, "precision": "fp32", "outputs": [10, 1000, 32768], "from_outputs": None,
        "clean": True}


def test_c1_within_noise_everywhere_is_refuted_with_the_standing_advice(tmp_path):
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"excess_dp": {10: 30.0, 1000: 20.0, 32768: 90.0},
                                                     "excess_sum": {10: 29.0, 1000: 20.0, 32768: 80.0}})))
    assert f.verdict == REFUTED and f.advice is None
    assert not any(c["above_noise"] for c in f.data["cells"] if c["variant"] == "dp")


@pytest.mark.parametrize("rank, at10, at32k", [(4900.0, "within noise", "lower"), (5200.0, "higher", "lower"),
                                               (6000.0, "higher", "higher")])
def test_c1_compares_each_ddp_rank_with_dps_device0_beyond_noise(tmp_path, rank, at10, at32k):
    # DP's device 0 holds 4,900 MiB at 10 outputs and 5,700 at 32,768; each cell's noise is at
    # least one gradient set (43 and 107 MiB), and the comparison carries both cells' (85 and 213)
    f = c1_text.finding(evidence(tmp_path, gpu_tag(c1={"ddp_rank": rank})))
    got = {r["num_classes"]: r for r in f.data["ddp_vs_dp"]}
    assert set(got) == {10, 32768} and (got[10]["call"], got[32768]["call"]) == (at10, at32k)
    assert got[10]["noise_mib"] == pytest.approx(2 * c1_verdict.param_count(10) * 4 / 2 ** 20)
    assert got[10]["diff_mib"] == pytest.approx(rank + 0.2 - 4900.15, abs=0.01)


def test_c1_momentum_comes_from_the_run_config(tmp_path):
    f = c1_text.finding(evidence(tmp_path / "none", gpu_tag(c1={"momentum": 0.0})))
    assert all(c["estimate_mib"]["momentum"] == 0.0 for c in f.data["cells"] if "estimate_mib" in c)
    t = gpu_tag()
    for cfg in t.configs.values():   # a record without the key trained with RunConfig's default (0.9)
        del cfg["momentum"]
    f = c1_text.finding(evidence(tmp_path / "default", t))
    assert all(c["estimate_mib"]["momentum"] == c["estimate_mib"]["summed_grads"] > 0
               for c in f.data["cells"] if "estimate_mib" in c)


def test_c1_says_which_precision_it_cannot_size(tmp_path):
    with pytest.raises(ValueError, match=r"'fp8'.*bf16.*fp32"):   # the precision asked, those known
        c1_verdict.device0_excess_estimate(2048, 2, precision="fp8")
    t = gpu_tag()
    for cfg in t.configs.values():
        cfg["precision"] = "fp8"
    f = c1_text.finding(evidence(tmp_path, t))   # the ledger still renders, without estimates from sizes
    dp = [c for c in f.data["cells"] if c["variant"] == "dp"]
    assert dp and not any("estimate_mib" in c for c in dp)
    assert all(c["unsized"] == "no sizes known for precision 'fp8'" for c in dp)


def test_max_batch_verdict_needs_a_batch_that_fits():
    assert c1_verdict.verdict_from({"dp": {"10": 0}, "dp_sum": {"10": 0}, "single": {"10": 0}}) == NOT_RUN
    assert c1_verdict.verdict_from({"single": {"10": 3000}}) == NOT_RUN


@pytest.mark.parametrize("per_width, verdict", [
    # the gathered outputs cost batch at every width: the article's reason holds
    ({10: {"single": 3000, "dp": 4000, "dp_sum": 5000}, 32768: {"single": 2000, "dp": 1000, "dp_sum": 3600}},
     CONFIRMED),
    # the gathered outputs cost batch from 32,768 outputs, not at 10: confirmed with that condition
    ({10: {"single": 3000, "dp": 5000, "dp_sum": 5050}, 32768: {"single": 2000, "dp": 1000, "dp_sum": 3600}},
     CONFIRMED),
    # device 0 limits dp (below two GPUs' worth), but the outputs cost batch at no width: nuance
    ({10: {"single": 3000, "dp": 5000, "dp_sum": 5050}, 32768: {"single": 2000, "dp": 3500, "dp_sum": 3600}},
     NUANCE),
    # the outputs cost batch at 10 but not at 32,768: an effect that comes and goes states no condition
    ({10: {"single": 3000, "dp": 4000, "dp_sum": 5050}, 32768: {"single": 2000, "dp": 3500, "dp_sum": 3600}},
     NUANCE),
    # dp trains as much as two GPUs at every width: device 0 costs nothing
    ({10: {"single": 3000, "dp": 6000, "dp_sum": 6000}, 32768: {"single": 2000, "dp": 3950, "dp_sum": 4000}},
     REFUTED),
])
def test_max_batch_verdict_flips_with_the_planted_batches(per_width, verdict):
    assert max_batch_probe(per_width).verdict == verdict


def test_c1_max_batch_joins_the_runs_evidence_and_decides_only_without_runs(tmp_path):
    per_width = {10: {"single": 3000, "dp": 5000, "dp_sum": 5050, "ddp": 5900},
                 32768: {"single": 2000, "dp": 1000, "dp_sum": 3600, "ddp": 3900}}
    probes = {**fake_gpu_probes(), "C1": max_batch_probe(per_width)}
    f = c1_text.finding(evidence(tmp_path / "runs", gpu_tag(), probes))
    assert f.verdict == CONFIRMED and f.data["conditions"][0]["from_outputs"] == 32768   # the runs decide
    found = {v: {w: per_width[int(w)][v] for w in ("10", "32768")} for v in ("single", "dp", "dp_sum", "ddp")}
    assert c1_verdict.gathered_cost_onset(found) == ("32768", True)
    assert f.data["probe"]["observations"]["c1.max_batch.dp.out32768"]["global_batch"] == 1000
    assert any("global_batch 1000" in e for e in f.evidence) and len(f.measured_on) == 2
    # without memory runs the probe's verdict stands, and the runs' absence is said
    per_width[10]["dp"] = 3900
    probes["C1"] = max_batch_probe(per_width)
    f = c1_text.finding(evidence(tmp_path / "probe_only", FakeTag(), probes))
    assert f.verdict == CONFIRMED and "cells" not in f.data   # the probe's verdict, no runs' cells
    assert f.evidence[0].startswith("not measured here") and f.not_run is None


def test_c1_estimate_itemises_device0_from_sizes():
    e = c1_verdict.device0_excess_estimate(2048, 2)
    weights = c1_verdict.param_count(10) * 4 / 2 ** 20
    assert e["summed_grads"] == e["momentum"] == pytest.approx(weights)
    assert e["input_batch"] == pytest.approx(1024 * (3 * 32 * 32 * 4 + 8) / 2 ** 20)   # the other half
    assert e["gathered_logits"] == pytest.approx(2048 * 10 * 4 / 2 ** 20)
    assert e["loss_log_softmax"] == pytest.approx(2048 * 10 * 4 / 2 ** 20)
    bf16 = c1_verdict.device0_excess_estimate(2048, 2, 1000, "bf16")
    assert bf16["gathered_logits"] == pytest.approx(2048 * 1000 * 2 / 2 ** 20)
    inside = c1_verdict.device0_excess_estimate(2048, 2, 32768, loss_on_gathered=False)
    assert inside["gathered_logits"] == inside["loss_log_softmax"] == 0.0
    uneven = c1_verdict.device0_excess_estimate(128, 3)   # chunks 43/43/42: the others hold 42.5 on average
    assert uneven["input_batch"] == pytest.approx((128 - 42.5) * (3 * 32 * 32 * 4 + 8) / 2 ** 20)


def test_c1_without_run_configs_places_no_cell_on_the_sweep(tmp_path):
    # The memory tables alone (metrics.json lost): no output size is known, so nothing is
    # "confirmed from N outputs", and the ledger still renders.
    tag = gpu_tag()
    tag.write(tmp_path, "t", fake_gpu_probes())
    rs = results.ResultSet(tmp_path, "t")
    for rid in list(tag.configs):
        if rid.startswith("dp"):
            rs.metrics_path(rid).unlink()
    f = c1_text.finding(Evidence(tmp_path, "t", PLANNED))
    assert f.verdict == NUANCE and f.data["conditions"] == []
    assert not any("num_classes" in c for c in f.data["cells"] if c["variant"] == "dp")


def test_c1_sizes_the_model_from_its_records_where_they_count_it(tmp_path):
    t = gpu_tag()
    for rid in t.configs:   # a model of 1M parameters, as a record since workloads counts it
        t.records[rid] = {"parameters": 1_000_000, "param_bytes": 4_000_000}
    cells = c1_text.finding(evidence(tmp_path, t)).data["cells"]
    assert cells and all(c["params"] == 1_000_000 for c in cells)
    assert all(c["grad_set_mib"] == pytest.approx(4_000_000 / 2 ** 20) for c in cells)
    dp = next(c for c in cells if c["variant"] == "dp")
    assert dp["estimate_mib"]["summed_grads"] == pytest.approx(4_000_000 / 2 ** 20)

