"""The claims experiment's groups and the probe settings taken from them."""

import pytest

from dpbench import results
from dpbench.claims import probe, settings
from dpbench.plan.matrix import Plan, read_plan
from dpbench.plan.pipeline import load_experiment

from claims.planted import ROOT, PLANNED


def _groups(**changes):
    """The claims experiment's groups as planned for 2 GPUs, with some groups' options changed
    (name -> options; None drops the group)."""
    config = load_experiment({"experiment": "claims"}, ROOT)
    matrix = []
    for g in config["matrix"]:
        if g["name"] in changes and changes[g["name"]] is None:
            continue
        matrix.append({**g, "options": {**g.get("options", {}), **changes.get(g["name"], {})}})
    return read_plan(Plan({**config, "matrix": matrix}, 2).document())


def test_probes_take_their_batches_and_widths_from_the_experiments_groups():
    groups = read_plan(PLANNED)
    assert settings.probe_settings("C1", groups) == {"batch": 2048, "classes": [10, 32768]}
    assert settings.probe_settings("C7", groups) == {"batches": [512, 8192]}
    assert settings.probe_settings("C3", groups) == {}
    c8_8192 = {g: None for g in groups if g.startswith("c8_") and groups[g]["options"].get("global_batch") == 8192}
    groups = _groups(c1_out32768={"global_batch": 1024}, c7_benchmark_on={"global_batch": 256}, **c8_8192)
    assert settings.probe_settings("C1", groups) == {"batch": 1024, "classes": [10, 32768]}
    assert settings.probe_settings("C7", groups) == {"batches": [256, 2048]}
    with pytest.raises(ValueError, match="C7.*cudnn_benchmark"):   # the claim and the key
        settings.probe_settings("C7", _groups(c7_benchmark_on={"cudnn_benchmark": False}))
    with pytest.raises(ValueError, match=r"C1.*c1_.*`probes`"):   # the claim, its groups' prefix, the key
        settings.probe_settings("C1", {g: v for g, v in groups.items() if not g.startswith("c1_")})


def test_a_probe_setting_the_groups_leave_to_the_plan_comes_from_it():
    """A width or batch set in the experiment's train block, or a batch that weak scaling sets,
    is what the runs train with, so the probe measures at it too (not at RunConfig's default)."""
    spec = {"experiment": "c1_check", "variants": ["dp"], "gpus": [2],
            "train": {"num_classes": 100, "global_batch": 1024},
            "matrix": [{"name": "c1_narrow"}, {"name": "c1_wide", "options": {"num_classes": 32768}}]}
    plan = lambda spec: read_plan(Plan(load_experiment(spec, ROOT), 2).document())
    assert settings.probe_settings("C1", plan(spec)) == {"batch": 1024, "classes": [100, 32768]}
    spec["train"] = {"per_gpu_batch": 300}   # weak scaling: 600 on the 2 GPUs of the dp runs
    assert settings.probe_settings("C1", plan(spec)) == {"batch": 600, "classes": [10, 32768]}


def test_experiment_groups_are_labelled_per_claim_and_valid():
    pytest.importorskip("snakemake", reason="the schema check goes through snakemake's validator")
    from dpbench.plan.matrix import Plan
    from dpbench.plan.pipeline import load_experiment

    groups = read_plan(PLANNED)
    labels = {name: g["label"] for name, g in groups.items()}
    assert {name.split("_")[0].upper() for name in labels} == {"C1", "C6", "C7", "C8"}
    # a label is shared only by groups whose runs are the same runs (same options)
    for name, label in labels.items():
        for other, same in labels.items():
            if label == same:
                assert groups[name]["options"] == groups[other]["options"]
    assert labels["c1_out10"] == labels["c8_fp32_b2048"]
    config = load_experiment({"experiment": "claims"}, ROOT)
    assert config["probes"] == sorted(probe.MODULES)
    assert config["seeds"] == "distinct"
    runs = Plan(config, 2).runs
    assert {results.options_label(rc.options) for rc in runs.values()} == set(labels.values())
    c6 = [rc for rc in runs.values() if rc.options.get("global_batch") == 127]
    assert len(c6) >= 9 and all(rc.deterministic for rc in c6)
    assert {rc.seed for rc in c6 if rc.variant == "single"} == {rc.seed for rc in c6 if rc.variant == "dp_mean"}
    assert len({rc.seed for rc in c6 if rc.variant == "single"}) >= 3
    assert {rc.num_classes for rc in runs.values()} == {10, 1000, 32768}
    c8 = {rc.global_batch for rc in runs.values() if rc.options.get("max_steps") and rc.variant == "dp"
          and rc.precision == "fp32" and rc.feed == "gpu"}
    assert {128, 512, 2048, 8192} <= c8
    sweep = lambda variant, precision: {rc.global_batch for rc in runs.values() if rc.variant == variant
                                        and rc.precision == precision and rc.feed == "gpu" and rc.max_steps}
    assert sweep("ddp", "bf16") == sweep("dp", "bf16") == {512, 2048, 8192}   # DDP at bf16 too
    assert all(rc.repeat in (0, 1, 2) for rc in runs.values())
