"""The variant registry (dpbench.plan.variants): every spec found, its options known to the schema,
and the lists, the schema's enum and the docs' table read off it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import dpbench
from dpbench.plan import config, variants
from dpbench.plan.config import RunConfig
from dpbench.plan.variants.settings import (DDPSettings, FSDPSettings, HSDPSettings, ProcessGroupSettings, knobs_of,
                                            read)
from dpbench.plan.variants.spec import Knob, VariantSpec

REPO = Path(__file__).resolve().parents[2]


def test_every_variant_module_declares_its_spec_in_order():
    found = sorted(p.stem for p in (REPO / "src/dpbench/plan/variants").glob("*.py")
                   if not p.stem.startswith("_") and p.stem not in ("spec", "settings"))
    assert sorted(variants.names()) == found
    assert list(variants.names()) == [s.name for s in sorted(variants.all_specs(), key=lambda s: s.order)]
    assert variants.names()[0] == "single"   # the baseline comes first in tables and figures


def test_the_schema_takes_its_variant_enum_from_the_registry():
    assert config.schema()["definitions"]["variant"]["enum"] == list(variants.names())
    with pytest.raises(ValueError, match="variant"):
        RunConfig.from_dict({"variant": "not_a_variant"})


def test_every_knob_is_a_schema_option():
    options = set(config.train_schema())
    for spec in variants.all_specs():
        assert set(spec.knob_keys) <= options, spec.name
        assert {r.key for r in spec.refuses} <= options, spec.name


def test_the_package_lists_are_the_specs_groups():
    assert dpbench.VARIANTS == variants.names()
    assert set(dpbench.DISTRIBUTED_VARIANTS) == {s.name for s in variants.all_specs() if s.processes(4) == 4}
    assert set(dpbench.DP_VARIANTS) == {s.name for s in variants.all_specs() if s.devices_per_process(4) == 4}
    assert set(dpbench.FSDP_VARIANTS) <= set(dpbench.SHARDED_VARIANTS) <= set(dpbench.DISTRIBUTED_VARIANTS)


def test_processes_and_devices_follow_the_layout():
    assert [variants.spec(v).processes(4) for v in ("single", "dp", "ddp", "hsdp")] == [1, 1, 4, 4]
    assert [variants.spec(v).devices_per_process(4) for v in ("single", "dp", "ddp", "hsdp")] == [1, 4, 1, 1]
    assert variants.spec("hsdp").mesh == ("replicate", "shard") and variants.spec("fsdp").mesh == ("shard",)
    assert variants.spec("zero1").optimizer == "ZeroRedundancyOptimizer"


def test_takers_of_a_wrappers_knob_and_of_an_option_every_variant_takes():
    assert variants.takers("hsdp_shard_size") == ("hsdp",)
    ddp_wrapped = tuple(s.name for s in variants.all_specs() if s.wrapper == "DistributedDataParallel")
    assert variants.takers("bucket_cap_mb") == ddp_wrapped and {"ddp", "zero1"} <= set(ddp_wrapped)
    assert variants.takers("lr") == variants.names()
    defaults = {"static_graph": False, "offload": False}
    assert variants.ignored("fsdp", {"static_graph": True, "offload": True}, defaults) == ["static_graph"]


def test_a_spec_refuses_an_option_set_away_from_its_default():
    defaults = {"compile": "none", "channels_last": False}
    assert variants.spec("dp").refusal({"compile": "default", "channels_last": False}, defaults)
    assert variants.spec("dp").refusal({"compile": "none", "channels_last": False}, defaults) is None
    assert variants.spec("fsdp").refusal({"compile": "default", "channels_last": True}, defaults)
    assert variants.spec("ddp").refusal({"compile": "default", "channels_last": True}, defaults) is None


def test_a_variants_settings_are_typed_and_read_from_a_run_config():
    cfg = RunConfig.from_dict({"variant": "hsdp", "gpus": 4, "hsdp_shard_size": 2, "offload": True,
                               "collective_timeout_s": 60})
    assert variants.spec("hsdp").settings(cfg) == (
        HSDPSettings(reshard_after_forward=True, offload=True, hsdp_shard_size=2),
        ProcessGroupSettings(collective_timeout_s=60, rehearse=False))
    assert variants.spec("hsdp").setting(FSDPSettings, cfg).shard_size == 2   # hsdp's is FSDP2's, and more
    assert variants.spec("fsdp").setting(FSDPSettings, cfg).shard_size is None
    assert variants.spec("fsdp").setting(DDPSettings, cfg) is None
    assert variants.spec("single").settings(cfg) == ()


def test_settings_round_trip_through_a_records_config():
    cfg = RunConfig.from_dict({"variant": "ddp", "gpus": 2, "bucket_cap_mb": 10, "static_graph": True,
                               "find_unused_parameters": True})
    record = cfg.to_dict()
    defaults = RunConfig().to_dict() | {k: config.train_schema()[k]["default"] for k in variants.quiet_keys()}
    for kind in (DDPSettings, ProcessGroupSettings):
        typed = variants.spec("ddp").setting(kind, cfg)
        assert variants.spec("ddp").setting(kind, record, defaults) == typed
        assert RunConfig.from_dict({**record, **dataclasses.asdict(typed)}).to_dict() == record
    assert variants.spec("ddp").setting(DDPSettings, cfg) == DDPSettings(10, False, True, True, True)
    with pytest.raises(KeyError, match="find_unused_parameters"):   # a quiet key left out, no default given
        read(DDPSettings, RunConfig(variant="ddp").to_dict())


def test_a_specs_knobs_are_its_settings_fields():
    for spec in variants.all_specs():
        assert spec.knob_keys == tuple(f.name for c in spec.config for f in dataclasses.fields(c)), spec.name
        assert set(spec.knob_keys) <= {f.name for f in dataclasses.fields(RunConfig)}   # the record keeps them flat
    assert knobs_of(HSDPSettings)[-1] == Knob("hsdp_shard_size", changes_setup=False, quiet_at_default=True)
    assert [k.key for k in knobs_of(HSDPSettings)[:2]] == [f.name for f in dataclasses.fields(FSDPSettings)]
    with pytest.raises(TypeError):
        knobs_of(dict)


def test_quiet_keys_stay_out_of_a_default_config_and_the_setup_neutral_ones_are_tuning():
    default = RunConfig().to_dict()
    assert not set(variants.quiet_keys()) & set(default)
    assert {"bucket_cap_mb", "reshard_after_forward", "hsdp_shard_size"} <= set(variants.setup_neutral_keys())
    assert "offload" not in variants.setup_neutral_keys()   # parameters on the host: another setup


def test_the_readmes_variant_table_is_the_registrys():
    assert variants.markdown_table() in (REPO / "README.md").read_text()


def _with_module(tmp_path, monkeypatch, name: str, text: str):
    """The registry as it loads with one more module under the package (tmp_path's)."""
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.setattr(variants, "__path__", [*variants.__path__, str(tmp_path)])
    monkeypatch.syspath_prepend(str(tmp_path))
    variants.all_specs.cache_clear()


def test_a_module_named_apart_from_its_variant_is_refused(tmp_path, monkeypatch):
    _with_module(tmp_path, monkeypatch, "oddly_named",
                 "from dpbench.plan.variants.spec import VariantSpec, ONE_DEVICE, GLOBAL_MEAN\n"
                 "SPEC = VariantSpec(name='other', order=99, summary='', layout=ONE_DEVICE, wrapper='', "
                 "runtime='plain', loss=GLOBAL_MEAN)\n")
    try:
        with pytest.raises(ValueError, match="oddly_named"):
            variants.all_specs()
    finally:
        monkeypatch.undo()
        variants.all_specs.cache_clear()


MADE_UP = """
from dataclasses import dataclass
from dpbench.plan.variants.settings import ProcessGroupSettings, knob
from dpbench.plan.variants.spec import PROCESS_PER_GPU, RANK_SUM_SCALED, VariantSpec

@dataclass(frozen=True)
class MadeUpSettings:
    seed: int = knob(changes_setup=False)
    tf32: bool = knob(quiet_at_default=True)

SPEC = VariantSpec(name="made_up", order=99, summary="", layout=PROCESS_PER_GPU, wrapper="",
                   runtime="plain", loss=RANK_SUM_SCALED, config=(MadeUpSettings, ProcessGroupSettings))
"""


def test_a_made_up_variant_declaring_its_own_settings_is_picked_up(tmp_path, monkeypatch):
    _with_module(tmp_path, monkeypatch, "made_up", MADE_UP)   # existing options stand in for its own
    try:
        made_up = variants.spec("made_up")
        assert made_up.knob_keys == ("seed", "tf32", "collective_timeout_s", "rehearse")
        assert variants.takers("tf32") == ("made_up",) and "tf32" in variants.quiet_keys()
        assert "seed" in variants.setup_neutral_keys() and "tf32" not in variants.setup_neutral_keys()
        own = made_up.settings(RunConfig(seed=7))[0]
        assert (type(own).__name__, own.seed, own.tf32) == ("MadeUpSettings", 7, RunConfig().tf32)
    finally:
        monkeypatch.undo()
        variants.all_specs.cache_clear()


def test_a_key_two_settings_declare_differently_is_refused(tmp_path, monkeypatch):
    clash = MADE_UP.replace("seed: int = knob(changes_setup=False)", "rehearse: bool = knob()")
    _with_module(tmp_path, monkeypatch, "clash", clash.replace('name="made_up"', 'name="clash"'))
    try:
        with pytest.raises(ValueError, match="rehearse"):
            variants.quiet_keys()
    finally:
        monkeypatch.undo()
        variants.all_specs.cache_clear()


def test_knob_defaults_say_a_key_changes_the_setup():
    assert Knob("x").changes_setup and not Knob("x").quiet_at_default
    assert VariantSpec.__dataclass_params__.frozen   # a spec is a fact, not state
