"""dpbench.results.identity: run ids read back, cell and setup ids, the identity the plan decides
and what older records and plans read as."""
from __future__ import annotations

import json

import pytest

from dpbench import results
from dpbench.plan.config import RunConfig
from dpbench.plan.matrix import read_identities
from dpbench.results import identity


@pytest.mark.parametrize("variant, gpus, repeat, options", [
    ("single", 1, 0, None),
    ("ddp", 2, 3, {}),
    ("dp_sum", 8, 12, {"global_batch": 1024}),
    ("ddp", 2, 1, {"precision": "bf16", "channels_last": True, "lr": 0.1, "bucket_cap_mb": None}),
])
def test_a_run_id_reads_back_into_its_parts(variant, gpus, repeat, options):
    rid = results.run_id(variant, gpus, repeat, options)
    parts = results.parse_run_id(rid)
    assert parts is not None
    assert (parts.variant, parts.gpus, parts.repeat) == (variant, gpus, repeat)
    assert results.cell_id(variant, gpus, options) == identity.cell_of_run_id(rid)
    assert f"{identity.cell_of_run_id(rid)}-r{parts.repeat}" == rid
    assert (parts.options == "") == (not options)


@pytest.mark.parametrize("rid", ["", "ddp", "ddp-g2", "ddp-2-r0", "ddp-g2-rx"])
def test_what_is_no_run_id_parses_to_none(rid):
    assert results.parse_run_id(rid) is None


def test_an_identity_travels_through_its_run_folder(tmp_path):
    ident = results.Identity("ddp-g2-r1", "ddp-g2", "0123456789", "scaling")
    assert results.Identity.read(tmp_path) is None
    ident.write(tmp_path)
    assert results.Identity.read(tmp_path) == ident
    assert results.Identity.from_dict(json.loads(json.dumps(ident.to_dict()))) == ident


def test_the_setup_id_leaves_out_identity_batch_and_the_ddp_knobs():
    base = RunConfig.from_dict({"variant": "single"}).to_dict()
    other = RunConfig.from_dict({"variant": "ddp", "gpus": 2, "repeat": 1, "seed": 9, "global_batch": 1024,
                                 "bucket_cap_mb": 50}).to_dict()
    assert results.setup_id(base) == results.setup_id(other) != ""
    assert results.setup_id({**base, "precision": "bf16"}) != results.setup_id(base)
    assert results.setup_id({}) == ""


def test_an_older_record_gets_the_ids_the_readers_computed_before():
    config = RunConfig.from_dict({"variant": "ddp", "gpus": 2, "global_batch": 256}).to_dict()
    old = {"format": 2, "run_id": "ddp-g2-global_batch256-r0", "status": "ok", "config": config}
    rec = results.upgrade(old)
    assert (rec["cell_id"], rec["setup_id"], rec["group"]) == ("ddp-g2-global_batch256", results.setup_id(config), "")
    copied = results.upgrade({**old, "cell_id": "x", "setup_id": "y", "group": "g"})
    assert (copied["cell_id"], copied["setup_id"], copied["group"]) == ("x", "y", "g")


def test_an_older_plan_reads_with_derived_identities():
    config = RunConfig.from_dict({"variant": "single"}).to_dict()
    doc = {"groups": [{"name": "a", "runs": ["single-g1-r0"]}, {"name": "b", "runs": ["single-g1-r0"]}],
           "runs": {"single-g1-r0": config}}
    assert read_identities(doc) == {"single-g1-r0": results.Identity("single-g1-r0", "single-g1",
                                                                   results.setup_id(config), "a")}
