"""The sharded variants' closed forms (memory per device, traffic per collective) against numbers
worked by hand, and collect's two tables from records with and without the sharded keys."""
from __future__ import annotations

import pytest
from fakes import fake_result_set, sharded_run

from dpbench.analysis import memory_model as M
from dpbench.analysis import traffic_model as T

RESNET18 = 11_173_962
MIB = 2 ** 20


def state_bytes(**kw) -> dict:
    return M.predicted_bytes(M.Setting(**{"parameters": RESNET18, **kw}))


# -- memory ---------------------------------------------------------------------------------

def test_ddp_fp32_sgd_momentum_holds_twelve_bytes_per_parameter_plus_its_buckets():
    b = state_bytes(variant="ddp", ranks=2)
    assert b["parameters"] + b["gradients"] + b["optimizer"] == 12 * RESNET18 == 134_087_544
    assert b["buckets"] == 4 * RESNET18
    assert b["state"] == 16 * RESNET18
    assert state_bytes(variant="ddp", ranks=2, gradient_as_bucket_view=True)["state"] == 12 * RESNET18
    assert state_bytes(variant="single")["state"] == 12 * RESNET18


@pytest.mark.parametrize("variant,ranks,kw,per_parameter", [
    ("ddp", 4, dict(optimizer_slots=0), 8),                   # plain SGD: no optimizer state
    ("ddp", 4, dict(optimizer_slots=2), 16),                  # Adam: two slots
    ("zero1", 2, {}, 4 + 4 + 2),                              # the optimizer term / N
    ("zero1", 4, dict(optimizer_slots=2), 4 + 4 + 2),
    ("fsdp", 2, {}, 6),                                       # all three / N
    ("fsdp", 4, dict(optimizer_slots=2), 4),
    ("hsdp", 4, dict(hsdp_shard_size=2), 6),                  # / the shard group
    ("hsdp", 4, {}, 3),                                       # shard size null: the world
])
def test_each_variant_divides_the_terms_it_shards(variant, ranks, kw, per_parameter):
    b = state_bytes(variant=variant, ranks=ranks, gradient_as_bucket_view=True, **kw)
    assert b["parameters"] + b["gradients"] + b["optimizer"] == pytest.approx(per_parameter * RESNET18)


def test_fsdp_adds_the_largest_unit_or_every_unit_without_resharding():
    unit = 9.0 * MIB
    assert state_bytes(variant="fsdp", ranks=2, largest_unit_bytes=unit)["unsharded"] == unit
    assert state_bytes(variant="fsdp", ranks=2)["unsharded"] is None          # unit unknown
    # reshard_after_forward false keeps every unit gathered: P in the compute dtype (bf16: 2 bytes)
    assert state_bytes(variant="fsdp", ranks=2, reshard_after_forward=False)["unsharded"] == 4 * RESNET18
    assert state_bytes(variant="fsdp", ranks=2, reshard_after_forward=False,
                       precision="bf16")["unsharded"] == 2 * RESNET18
    assert state_bytes(variant="ddp", ranks=2)["unsharded"] == 0


def test_a_record_gives_the_closed_forms_their_inputs():
    rec = {"variant": "hsdp", "gpus": 8, "parameters": RESNET18, "param_bytes": 4 * RESNET18,
           "config": {"momentum": 0.9, "precision": "bf16"}, "launch": {"nodes": 2}}
    s = M.setting_of(rec)
    assert (s.shard_size, s.compute_bytes, s.optimizer_slots) == (4, 2, 1)    # a node's 4 ranks
    assert M.setting_of({**rec, "config": {"hsdp_shard_size": 2}}).shard_size == 2
    assert M.setting_of({**rec, "parameters": None}) is None                    # an older record


def test_optimizer_slots_follow_the_config():
    assert M.optimizer_slots({"momentum": 0.9}) == 1
    assert M.optimizer_slots({"momentum": 0.0}) == 0
    assert M.optimizer_slots({"optimizer": "adamw"}) == 2


def test_the_comparison_flags_a_component_beyond_five_percent():
    row = {"run_id": "r", "variant": "zero1", "gpus": 2, "options": "", "device": 0,
           "parameters_mib": 100.0, "predicted_parameters_mib": 100.0,
           "optimizer_mib": 56.0, "predicted_optimizer_mib": 50.0,        # an uneven partition
           "gradients_mib": 104.9, "predicted_gradients_mib": 100.0,
           "state_mib": None, "predicted_state_mib": 300.0}
    out = {r["component"]: r for r in M.comparison([row])}
    assert set(out) == {"parameters", "gradients", "optimizer"}          # no measured state
    assert out["optimizer"]["relative_difference"] == pytest.approx(0.12)
    assert out["optimizer"]["beyond_tolerance"] and not out["gradients"]["beyond_tolerance"]


def test_the_measured_state_is_the_peak_less_the_activations_and_the_data():
    row = {"forward_peak_mib": 900.0, "backward_peak_mib": 1000.0, "activation_peak_mib": 600.0,
           "data_mib": 50.0}
    assert M.measured_state(row) == 350.0
    assert M.measured_state({"forward_peak_mib": None, "activation_peak_mib": None}) is None


def test_units_held_at_the_peak_are_every_unit_without_resharding_at_any_n():
    # FSDP2 copies units out at one rank too: every unit is held at N = 1 as at N = 4
    for ranks in (1, 4):
        assert state_bytes(variant="fsdp", ranks=ranks, reshard_after_forward=False)["held_at_peak"] == 4 * RESNET18
    assert state_bytes(variant="hsdp", ranks=4, reshard_after_forward=False, precision="bf16")["held_at_peak"] \
        == 2 * RESNET18
    assert state_bytes(variant="fsdp", ranks=4, largest_unit_bytes=9.0 * MIB)["held_at_peak"] == 0
    assert state_bytes(variant="ddp", ranks=4)["held_at_peak"] == 0


def peak_row(variant, gpus, forward, backward, start, grads, held=0.0, **kw):
    """A memory_components row: phase peaks (MiB) and the closed forms' gradients and held units."""
    return {"run_id": f"{variant}-{gpus}", "variant": variant, "gpus": gpus, "options": "b8", "device": 0,
            "forward_peak_mib": forward, "backward_peak_mib": backward,
            "activation_peak_mib": max(forward, backward) - start, "predicted_gradients_mib": grads,
            "predicted_held_at_peak_mib": held, **kw}


def test_a_backward_peak_past_zero_grad_rises_by_the_gradients_a_sharded_rank_frees_less():
    # one rank: state 300 (gradients 100 of it), forward peak 900, backward peak 1000 (past the forward)
    one = peak_row("fsdp", 1, 900.0, 1000.0, 300.0, 100.0)
    four = peak_row("fsdp", 4, 700.0, 800.0, 75.0, 25.0)
    keep = peak_row("fsdp", 4, 700.0, 800.0, 75.0, 25.0, held=40.0, run_id="keep")
    out = {r["run_id"]: r for r in M.with_references([one, four, keep])}
    assert out["fsdp-1"]["predicted_activation_peak_mib"] == 700.0                  # itself
    assert out["fsdp-4"]["predicted_activation_peak_mib"] == 700.0 + (100.0 - 25.0)  # frees 25, not 100
    assert out["keep"]["predicted_activation_peak_mib"] == 775.0 + 40.0              # every unit held
    # the forward's peak higher: nothing freed there, the gradients' term drops out of the max
    fwd_one, fwd_four = peak_row("fsdp", 1, 1000.0, 950.0, 300.0, 100.0), peak_row("fsdp", 4, 0, 0, 0, 25.0)
    assert M.predicted_peaks(fwd_four, fwd_one)["activation_peak_mib"] == 700.0
    # a backward peak below the forward's but past the level the forward ended at: after zero_grad
    ended = dict(fwd_one, forward_end_mib=900.0)
    assert M.predicted_peaks(fwd_four, ended)["activation_peak_mib"] == max(700.0, 650.0 + 75.0)
    assert M.predicted_peaks(fwd_four, {"forward_peak_mib": None}) is None


def test_a_backward_peak_that_holds_regrown_gradients_rises_only_by_the_share_not_yet_written():
    # one rank: start 300 (gradients 100), backward peak 1000 below the forward's end (950 + 100
    # would be past it): nothing to tell without kinds, so no rise at all
    one = peak_row("fsdp", 1, 1100.0, 1000.0, 300.0, 100.0, gradients_mib=100.0, forward_end_mib=1050.0)
    four = peak_row("fsdp", 4, 0, 0, 0, 25.0)
    assert M.predicted_peaks(four, one)["activation_peak_mib"] == 800.0
    # the tracker counted 90 of the 100 written again at the peak (the backward's now the higher):
    # it rises by 10% of the 75 a rank of four frees less
    counted = peak_row("fsdp", 1, 900.0, 1000.0, 300.0, 100.0, gradients_mib=100.0, forward_end_mib=1050.0,
                       backward_peak_by_kind_mib={"Sharded Grad": 90.0, "Temp": 10.0})
    assert M.gradients_at_backward_peak(counted) == pytest.approx(0.9)
    assert M.predicted_peaks(four, counted)["activation_peak_mib"] == pytest.approx(700.0 + 7.5)
    # none written yet: the whole 75
    none = dict(counted, backward_peak_by_kind_mib={"Temp": 10.0})
    assert M.predicted_peaks(four, none)["activation_peak_mib"] == pytest.approx(700.0 + 75.0)


def test_a_marked_backward_start_rises_by_every_freed_gradient_and_holds_the_unit_gathered_first():
    # one rank (a GPU row, no kinds): start 300 (gradients 100), the backward's start peaks at 500
    # (nothing written), its later part at 1000 (past the forward's 900, how much written unknown)
    one = peak_row("fsdp", 1, 900.0, 1000.0, 300.0, 100.0, backward_start_peak_mib=500.0,
                   backward_late_peak_mib=1000.0)
    four = peak_row("fsdp", 4, 0, 0, 0, 25.0, predicted_gather_kept_mib=30.0)
    got = M.predicted_peaks(four, one)
    assert got["backward_start_above_start_mib"] == 200.0 + 75.0 + 30.0   # freed 75 more, the unit kept
    assert got["backward_late_above_start_mib"] == 700.0                   # a GPU cannot tell: as it is
    assert got["activation_peak_mib"] == 700.0
    # the start overtakes where the gradients a rank frees are large beside the later peak's lead
    low = dict(one, backward_late_peak_mib=550.0, backward_peak_mib=550.0, forward_peak_mib=520.0,
               activation_peak_mib=250.0)
    assert M.predicted_peaks(four, low)["activation_peak_mib"] == 305.0
    # on the CPU the kinds tell the later peak's share: 40 of 100 written again, it rises by 60% of 75
    counted = dict(one, gradients_mib=100.0, backward_late_peak_by_kind_mib={"Sharded Grad": 40.0})
    assert M.predicted_peaks(four, counted)["backward_late_above_start_mib"] == pytest.approx(700.0 + 45.0)
    # an unmarked row of the same peaks keeps the older rule (past the forward's end: none written)
    older = {k: v for k, v in one.items() if not k.startswith("backward_") or k == "backward_peak_mib"}
    assert M.predicted_peaks(four, older)["activation_peak_mib"] == 700.0 + 75.0
    assert "backward_start_above_start_mib" not in M.predicted_peaks(four, older)


def test_marked_unit_parts_rise_by_the_gradients_not_yet_written_and_hold_the_next_units_gather():
    # one rank: units 0..2 of 20 MiB each and the root (last) of 40, gradients 100; start 300. The
    # backward runs unit 2, 1, 0, then the root: unit 1's part has unit 2's gradients written
    # (20 of 100), the root's part every unit's but the root's (60)
    one = peak_row("fsdp", 1, 900.0, 985.0, 300.0, 100.0, backward_start_peak_mib=500.0,
                   backward_late_peak_mib=985.0, unit_mib=[20.0, 20.0, 20.0, 40.0],
                   backward_unit_peaks_mib={"0": 800.0, "1": 950.0, "2": 600.0},
                   backward_end_part_peak_mib=985.0)
    # four ranks free 75 more; the forward's last gather (unit 2, in bf16) is 10
    parts = M.unit_parts_above_start(one, 300.0, 75.0, 10.0)
    assert parts == pytest.approx({"2": 300.0 + 75.0 + 10.0,           # none written; unit 1 prefetched
                                   "1": 650.0 + 0.8 * 75.0 + 10.0,     # unit 2's written; unit 0 prefetched
                                   "0": 500.0 + 0.6 * 75.0,            # nothing after it to prefetch
                                   "end": 685.0 + 0.4 * 75.0})         # every unit's but the root's
    # two ranks: the root's part is the higher; four: unit 1's, inside the units, overtakes it
    two = M.predicted_peaks(peak_row("fsdp", 2, 0, 0, 0, 50.0, predicted_gather_kept_mib=10.0), one)
    assert (two["backward_units_above_start_mib"], two["backward_late_above_start_mib"]) == pytest.approx((700.0, 705.0))
    four = M.predicted_peaks(peak_row("fsdp", 4, 0, 0, 0, 25.0, predicted_gather_kept_mib=10.0), one)
    assert (four["backward_units_above_start_mib"], four["backward_late_above_start_mib"]) == pytest.approx((720.0, 720.0))
    assert four["activation_peak_mib"] == pytest.approx(720.0)
    assert M.unit_parts_above_start({k: v for k, v in one.items() if k != "unit_mib"}, 300.0, 75.0, 10.0) == {}


def test_without_resharding_the_model_adds_what_a_rank_keeps_at_each_moment():
    # one resharding rank: units 0..2 of 20 MiB and the root of 40 (fp32: 100 in all), start 300;
    # the model's forward peaks at 880, the loss at 900, the backward's start at 500, its parts as above
    one = peak_row("fsdp", 1, 900.0, 985.0, 300.0, 100.0, backward_start_peak_mib=500.0,
                   backward_late_peak_mib=985.0, unit_mib=[20.0, 20.0, 20.0, 40.0],
                   backward_unit_peaks_mib={"0": 800.0, "1": 950.0, "2": 600.0}, backward_end_part_peak_mib=985.0,
                   model_forward_peak_mib=880.0, loss_peak_mib=900.0, predicted_parameters_mib=100.0)
    # four ranks keeping every unit (100 held), each gathering the forward's last unit (20) once
    four = peak_row("fsdp", 4, 0, 0, 0, 25.0, held=100.0, predicted_parameters_mib=25.0)
    got = M.predicted_peaks(four, one)
    assert got["forward_above_start_mib"] == 600.0 + 100.0     # the loss: every unit and the root
    # the backward's start: every unit and the root but the root one rank held there (no kinds:
    # assumed), the unit a resharding rank gathers first no more; freed 75
    assert got["backward_start_above_start_mib"] == 200.0 + 75.0 + 60.0
    # a unit's part: the units before it, still whole, in place of the prefetched next one
    assert [got[f"backward_part_{k}_above_start_mib"] for k in ("2", "1", "0", "end")] == pytest.approx(
        [300.0 + 75.0 + 40.0, 650.0 + 60.0 + 20.0, 500.0 + 45.0, 685.0 + 30.0])
    assert got["activation_peak_mib"] == pytest.approx(730.0)
    # counted by kind: the model's forward held the root alone (its last unit already resharded),
    # the backward's start none of them
    counted = dict(one, loss_peak_mib=700.0, model_forward_peak_by_kind_mib={"Unsharded Param": 40.0},
                   backward_start_peak_by_kind_mib={"Temp": 5.0})
    got = M.predicted_peaks(four, counted)
    assert got["forward_above_start_mib"] == 580.0 + 20.0 + 60.0   # its units, the last one's gather kept
    assert got["backward_start_above_start_mib"] == 200.0 + 75.0 + 100.0
    # older rows (no unit sizes): every unit added to every peak, the root counted twice
    older = {k: v for k, v in one.items() if k != "unit_mib"}
    assert M.predicted_peaks(four, older)["activation_peak_mib"] == 685.0 + 100.0


def test_reserved_follows_the_predicted_peak_and_the_state_saved():
    one = peak_row("fsdp", 1, 900.0, 1000.0, 300.0, 100.0, reserved_peak_mib=1200.0, predicted_state_mib=300.0)
    four = peak_row("fsdp", 4, 0, 0, 0, 25.0, predicted_state_mib=75.0)
    # 1200 less the 225 of state saved, plus the 75 the activation peak rises by
    assert M.predicted_peaks(four, one)["reserved_peak_mib"] == 1200.0 - 225.0 + 75.0


def test_reserved_takes_its_slack_from_the_fewest_ranks_that_communicate():
    # one rank: state 300, peak 700 above it, reserved 1200 (slack 200); two ranks keep 150 more
    # (the streams' pools), so four are predicted with the two-rank slack, not the one-rank one
    one = peak_row("fsdp", 1, 900.0, 1000.0, 300.0, 100.0, reserved_peak_mib=1200.0, predicted_state_mib=300.0)
    two = peak_row("fsdp", 2, 700.0, 900.0, 150.0, 50.0, reserved_peak_mib=1300.0, predicted_state_mib=150.0)
    four = peak_row("fsdp", 4, 700.0, 850.0, 75.0, 25.0, reserved_peak_mib=1250.0, predicted_state_mib=75.0)
    slack_two = 1300.0 - 150.0 - 750.0
    assert M.reserved_slack(two) == slack_two == 400.0
    out = {r["gpus"]: r for r in M.with_references([four, two, one])}
    assert out[4]["predicted_reserved_peak_mib"] == 75.0 + (700.0 + 75.0) + slack_two
    assert out[4]["reference_gpus"] == {"activation_peak": 1, "reserved_peak": 2}
    assert out[2]["reference_gpus"]["reserved_peak"] == 2          # compares with itself
    assert out[1]["predicted_reserved_peak_mib"] == 1200.0           # one rank keeps its own
    # the reference's ranks' mean slack: a second rank at two with 100 more
    out = {r["run_id"]: r for r in M.with_references([one, two, dict(two, run_id="two-b", device=1,
                                                                        reserved_peak_mib=1400.0), four])}
    assert out["fsdp-4"]["predicted_reserved_peak_mib"] == 75.0 + 775.0 + slack_two + 50.0
    # fsdp without resharding keeps its own slack where rows name it, though it shares fsdp's one-rank row
    keep = dict(two, run_id="keep", variant_label="fsdp-keep", reserved_peak_mib=1500.0)
    keep4 = dict(four, run_id="keep4", variant_label="fsdp-keep")
    out = {r["run_id"]: r for r in M.with_references([one, two, keep, keep4])}
    assert out["keep4"]["predicted_reserved_peak_mib"] == 75.0 + 775.0 + (1500.0 - 150.0 - 750.0)
    # without a communicating row that measured reserved the one-rank slack stands
    alone = {r["gpus"]: r for r in M.with_references([one, dict(four, reserved_peak_mib=None)])}
    assert alone[4]["predicted_reserved_peak_mib"] == 1200.0 - 225.0 + 75.0
    assert alone[4]["reference_gpus"]["reserved_peak"] == 1
    cmp = {(c["gpus"], c["component"]): c for c in M.comparison([one, two, four])}
    assert cmp[(4, "reserved_peak")]["reference_gpus"] == 2
    assert cmp[(4, "reserved_peak")]["relative_difference"] == pytest.approx(1250.0 / (850.0 + 400.0) - 1.0)


# -- traffic --------------------------------------------------------------------------------

P = 1000


def wire(traffic: dict) -> float:
    return sum(r["wire"] for r in traffic.values())


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_ring_bytes_of_ddp_and_fsdp(ranks):
    ddp = T.predicted_traffic("ddp", P, ranks)
    assert ddp == {"all_reduce": {"payload": 4 * P, "wire": 2 * (ranks - 1) / ranks * 4 * P}}
    fsdp = T.predicted_traffic("fsdp", P, ranks)
    assert fsdp["all_gather"]["payload"] == 8 * P and fsdp["reduce_scatter"]["payload"] == 4 * P
    assert wire(fsdp) == pytest.approx(1.5 * wire(ddp))
    assert wire(T.predicted_traffic("fsdp", P, ranks, reshard_after_forward=False)) == pytest.approx(wire(ddp))


def test_zero1_adds_the_parameter_exchange_and_bf16_gathers_half():
    zero1 = T.predicted_traffic("zero1", P, 4)
    assert zero1["broadcast"] == {"payload": 4 * P, "wire": 3 * P}
    assert zero1["all_reduce"]["payload"] == 4 * P
    bf16 = T.predicted_traffic("fsdp", P, 2, gather_bytes=2)
    assert bf16["all_gather"]["payload"] == 4 * P and bf16["reduce_scatter"]["payload"] == 4 * P


def test_hsdp_shards_within_a_group_and_all_reduces_across_replicas():
    h = T.predicted_traffic("hsdp", P, 4, shard_size=2)
    assert h["all_gather"] == {"payload": 8 * P, "wire": 4 * P}
    assert h["reduce_scatter"] == {"payload": 4 * P, "wire": 2 * P}
    assert h["all_reduce"] == {"payload": 2 * P, "wire": 2 * P}
    # one replica (N = S): FSDP2 still calls the all-reduce on the one-rank group, which sends nothing
    assert T.predicted_traffic("hsdp", P, 2)["all_reduce"] == {"payload": 2 * P, "wire": 0.0}
    assert T.predicted_traffic("single", P, 1) == {} and T.predicted_traffic("dp", P, 2) == {}


def test_hsdp_on_one_replica_agrees_with_what_the_record_counts():
    """hsdp on 2 gloo ranks with shard groups of 2, as recorded (torch 2.14, the CPU plan's small
    transformer): the all-reduce on the one-rank replicate group is counted with its payload and
    predicted so, not flagged as +inf% over a prediction of nothing."""
    rec = {"variant": "hsdp", "gpus": 2, "status": "ok", "parameters": 118528, "param_bytes": 474112,
           "config": {"precision": "bf16", "hsdp_shard_size": 2, "momentum": 0.9},
           "collectives": [{"bytes": 474112, "collective": "all_gather", "count": 6},
                           {"bytes": 237056, "collective": "all_reduce", "count": 3},
                           {"bytes": 474112, "collective": "reduce_scatter", "count": 3}]}
    rows = T.collective_rows(rec)
    assert {r["collective"]: r["predicted_wire_bytes"] for r in rows}["all_reduce"] == 0.0
    compared = T.comparison([{**r, "run_id": "hsdp-g2-r0"} for r in rows])
    assert [(c["collective"], c["relative_difference"], c["beyond_tolerance"]) for c in compared] == [
        ("all_reduce", 0.0, False), ("all_gather", 0.0, False), ("reduce_scatter", 0.0, False)]


# -- collect --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    return fake_result_set(tmp_path_factory.mktemp("sharded"), [
        dict(variant="single"),                                   # an old record: no new keys
        dict(variant="ddp", gpus=2),
        sharded_run("ddp", 2, options={"reshard_after_forward": True}),
        sharded_run("zero1", 2),
        sharded_run("fsdp", 2),
        sharded_run("fsdp", 2, options={"reshard_after_forward": False}),
        dict(variant="fsdp", gpus=4, status="skipped", reason="needs 4 GPUs", images_per_s=None),
    ])


def test_memory_components_has_a_row_per_device_of_the_runs_that_recorded_them(collected):
    mc = collected.table("memory_components")
    assert sorted(mc["run_id"].unique()) == ["ddp-g2-reshard_after_forwardtrue-r0",
                                             "fsdp-g2-r0", "fsdp-g2-reshard_after_forwardfalse-r0",
                                             "zero1-g2-r0"]
    assert len(mc) == 8 and set(mc["device"]) == {0, 1}
    assert (mc["parameters"] == RESNET18).all()
    ddp = mc[mc["variant"] == "ddp"].iloc[0]
    assert ddp["predicted_parameters_mib"] + ddp["predicted_gradients_mib"] + ddp["predicted_optimizer_mib"] \
        == pytest.approx(12 * RESNET18 / MIB)
    # the state measured as the forward began: the backward peak less activations and data
    assert ddp["state_mib"] == pytest.approx(ddp["predicted_state_mib"])
    nores = mc[mc["run_id"] == "fsdp-g2-reshard_after_forwardfalse-r0"].iloc[0]
    assert nores["predicted_unsharded_mib"] == pytest.approx(4 * RESNET18 / MIB)


def test_the_comparison_of_the_collected_table_flags_only_the_planted_difference(collected):
    rows = collected.table("memory_components").to_dict("records")
    flagged = [(r["run_id"], r["device"], r["component"]) for r in M.comparison(rows) if r["beyond_tolerance"]]
    assert sorted(flagged) == [(rid, 1, "optimizer") for rid in sorted(
        ["ddp-g2-reshard_after_forwardtrue-r0", "fsdp-g2-r0", "fsdp-g2-reshard_after_forwardfalse-r0",
         "zero1-g2-r0"])]


def test_collectives_hold_counts_bytes_and_the_formulas(collected):
    c = collected.table("collectives")
    assert set(c["run_id"]) == {"ddp-g2-reshard_after_forwardtrue-r0", "zero1-g2-r0", "fsdp-g2-r0",
                                "fsdp-g2-reshard_after_forwardfalse-r0"}
    z = c[c["run_id"] == "zero1-g2-r0"].set_index("collective")
    assert list(z.index) == ["all_reduce", "broadcast"]
    assert z.loc["broadcast", "predicted_bytes"] == 4 * RESNET18
    assert z.loc["all_reduce", "predicted_wire_bytes"] == 4 * RESNET18     # 2(N-1)/N with N=2
    f = c[c["run_id"] == "fsdp-g2-r0"].set_index("collective")
    assert f.loc["all_gather", "bytes"] / f.loc["all_gather", "predicted_bytes"] == pytest.approx(0.9, abs=1e-6)
    assert f.loc["reduce_scatter", "count"] == 3
    nores = c[c["run_id"] == "fsdp-g2-reshard_after_forwardfalse-r0"].set_index("collective")
    assert nores.loc["all_gather", "predicted_bytes"] == 4 * RESNET18


def test_old_records_give_no_rows_and_no_error(tmp_path):
    rs = fake_result_set(tmp_path, [dict(variant="single"), dict(variant="ddp", gpus=2)])
    assert rs.table("memory_components").empty and rs.table("collectives").empty
    assert len(rs.table("summary")) == 2


def test_a_record_without_sizes_has_no_prediction_but_keeps_its_measurements(tmp_path):
    run = sharded_run("fsdp", 2)
    run["extra"] = {k: v for k, v in run["extra"].items() if k not in ("parameters", "param_bytes")}
    rs = fake_result_set(tmp_path, [run])
    mc, c = rs.table("memory_components"), rs.table("collectives")
    assert len(mc) == 2 and mc["predicted_state_mib"].isna().all() and not mc["parameters_mib"].isna().any()
    assert c["predicted_bytes"].isna().all() and (c["bytes"] > 0).all()
    assert M.comparison(mc.to_dict("records")) == []


def test_the_traffic_comparison_flags_only_the_short_all_gathers(collected):
    rows = collected.table("collectives").to_dict("records")
    flagged = {(r["run_id"], r["collective"]) for r in T.comparison(rows) if r["beyond_tolerance"]}
    assert flagged == {("fsdp-g2-r0", "all_gather"), ("fsdp-g2-reshard_after_forwardfalse-r0", "all_gather")}
    assert len(T.comparison(rows)) == 1 + 2 + 2 + 2     # ddp, zero1, fsdp and fsdp without resharding


def test_sharding_md_lists_every_comparison_and_reads_an_old_set(collected, tmp_path):
    from dpbench.report.sharding_tables import sharding_md
    text = sharding_md(collected.root, collected.tag)
    assert text.count("%) !") + text.count("% !") == 4 + 2         # four devices' optimizers, two all-gathers
    zero1 = [line for line in text.splitlines() if line.startswith("| zero1-g2-r0 ")]
    assert len(zero1) == 2 + 2                       # two devices, two collectives
    assert "(+20.0%) !" in zero1[1] and "(+0.0%)" in zero1[0] and "-10.0% !" in text
    old = fake_result_set(tmp_path, [dict(variant="single")])
    assert sharding_md(old.root, old.tag).count("_none_") == 2
    (tmp_path / old.tag / "memory_components.csv").unlink()        # a set collected before them
    (tmp_path / old.tag / "collectives.csv").unlink()
    assert sharding_md(old.root, old.tag).count("_none_") == 2


def test_fsdp_with_and_without_resharding_get_a_cell_each(collected):
    med = collected.table("medians")
    fsdp = med[(med["variant"] == "fsdp") & (med["quantity"] == "images_per_s")]
    assert sorted(fsdp["options"]) == ["", "reshard_after_forward=False"]
    assert len(set(fsdp["setup"])) == 1          # the option is no other setup: single compares with both


def test_one_rank_fsdp_sends_nothing_and_ddp_buffer_broadcasts_have_no_formula():
    """What the CPU plan measured: FSDP2 on a mesh of one counts no collective, and DDP's
    per-forward buffer broadcasts (BatchNorm statistics) are outside the parameter formulas."""
    assert T.predicted_traffic("fsdp", 1000, ranks=1) == {}
    assert set(T.predicted_traffic("hsdp", 1000, ranks=2, shard_size=1)) == {"all_reduce"}
    rec = {"variant": "ddp", "gpus": 2, "status": "ok", "parameters": 1000, "param_bytes": 4000,
           "config": {"precision": "fp32", "momentum": 0.9},
           "collectives": [{"collective": "all_reduce", "count": 1, "bytes": 4000},
                           {"collective": "broadcast", "count": 4, "bytes": 96}]}
    rows = {r["collective"]: r for r in T.collective_rows(rec)}
    assert rows["all_reduce"]["predicted_bytes"] == 4000 and rows["broadcast"]["predicted_bytes"] is None
    assert [c["collective"] for c in T.comparison(list(rows.values()))] == ["all_reduce"]
