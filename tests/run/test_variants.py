"""DDP's knobs, torch.compile and the timed steps, on the CPU (gloo).

The Variant-level tests use a tiny model under a one-rank gloo group, so that they check what
DistributedDataParallel was really given; the engine-level tests go through the real CLI.
"""
import csv
import functools
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import run_engine

from dpbench import results
from dpbench.plan.config import RunConfig
from dpbench.plan.variants.settings import DDPSettings
from dpbench.run import engine as train
from dpbench.run.variants import Variant, ddp_kwargs

CPU = [torch.device("cpu")]


def ddp_settings(**knobs) -> DDPSettings:
    """DDP's settings as a ddp run with these knobs reads them."""
    return RunConfig(variant="ddp", **knobs).variant_settings(DDPSettings)


class Tiny(nn.Module):
    """Conv, BatchNorm (buffers to broadcast) and a linear head: DDP's whole surface, in
    milliseconds."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))

    def forward(self, x):
        return self.body(x)


def tiny(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Tiny()


# -- the knobs reach DDP ---------------------------------------------------------------------------

def test_run_config_knobs_reach_ddp(one_rank_group):
    cfg = RunConfig(variant="ddp", bucket_cap_mb=1.5, gradient_as_bucket_view=True,
                    static_graph=True, broadcast_buffers=False)
    ddp = Variant("ddp", tiny(), CPU, 1, cfg.variant_settings(DDPSettings)).module
    assert ddp.bucket_bytes_cap == int(1.5 * 1024 * 1024)
    assert ddp.gradient_as_bucket_view is True
    assert ddp.static_graph is True
    assert ddp.broadcast_buffers is False


def test_default_knobs_are_pytorchs_and_warn_nothing(one_rank_group):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ddp = Variant("ddp", tiny(), CPU, 1, ddp_settings()).module
    assert [str(w.message) for w in caught] == []   # e.g. no deprecation of broadcast_buffers
    assert ddp.bucket_bytes_cap == 25 * 1024 * 1024
    assert (ddp.gradient_as_bucket_view, ddp.static_graph, ddp.broadcast_buffers) == (False, False, True)


def test_only_buffer_syncing_off_and_the_knobs_asked_for_are_passed_on():
    assert ddp_kwargs(None) == {}
    assert ddp_kwargs(ddp_settings(static_graph=True)) == {"gradient_as_bucket_view": False, "static_graph": True}
    off = {k: v for k, v in ddp_kwargs(ddp_settings(broadcast_buffers=False)).items()
           if k not in ("gradient_as_bucket_view", "static_graph")}
    assert list(off.values()) == [False] and set(off) <= {"broadcast_buffers", "forward_sync_buffers"}
    asked = ddp_kwargs(ddp_settings(bucket_cap_mb=2.0, find_unused_parameters=True))
    assert (asked["bucket_cap_mb"], asked["find_unused_parameters"]) == (2.0, True)


@pytest.mark.parametrize("knobs", [{}, {"gradient_as_bucket_view": True, "static_graph": True,
                                        "bucket_cap_mb": 0.001}])
def test_ddp_step_with_knobs_matches_single(one_rank_group, knobs):
    """Whatever the knobs, one DDP rank takes the same step as the bare model (bucket size 1 KB:
    one bucket per parameter tensor)."""
    x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 10, (6,))
    grads = []
    for name, opts in (("single", None), ("ddp", ddp_settings(**knobs))):
        model = tiny()
        v = Variant(name, model, CPU, 1, opts)
        for _ in range(2):   # static_graph records the graph in the first step
            for p in model.parameters():
                p.grad = None
            v.losses(x, y, len(y)).optimised.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


# -- torch.compile ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["single", "ddp"])
def test_compiled_variant_computes_what_eager_does(one_rank_group, name):
    """Inductor on the CPU (C++ kernels through the system compiler; a minute without its cache),
    the full batch then a short one: both shapes give eager's loss and gradients."""
    opts = ddp_settings(gradient_as_bucket_view=True, static_graph=True) if name == "ddp" else None
    eager_model, compiled_model = tiny(), tiny()
    eager = Variant(name, eager_model, CPU, 1, opts)
    compiled = Variant(name, compiled_model, CPU, 1, opts)
    compiled.compile("default")
    torch.manual_seed(1)
    for n in (8, 3, 8):
        x, y = torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,))
        for model, v in ((eager_model, eager), (compiled_model, compiled)):
            for p in model.parameters():
                p.grad = None
            loss = v.losses(x, y, n)
            loss.optimised.backward()
            model.last = (loss.reported.item(), [p.grad.clone() for p in model.parameters()])
        assert math.isclose(eager_model.last[0], compiled_model.last[0], rel_tol=1e-4, abs_tol=1e-5)
        for a, b in zip(eager_model.last[1], compiled_model.last[1]):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["dp", "dp_mean", "dp_sum"])
def test_compile_with_dataparallel_is_a_skipped_record(tmp_path, name):
    rec = run_engine(tmp_path / name, variant=name, compile="default")
    assert rec["status"] == "skipped"
    from dpbench.plan import variants
    assert rec["reason"] == next(r.reason for r in variants.spec(name).refuses if r.key == "compile")
    assert rec["config"]["compile"] == "default"


@pytest.mark.slow
def test_compiled_run_keeps_compilation_out_of_the_timed_steps(tmp_path, monkeypatch):
    """The engine's compile path, with a cheap backend (the real one is the slow test below):
    the first step is recorded as compile_s and never timed, even with no warm-up."""
    import dpbench.run.variants
    monkeypatch.setattr(dpbench.run.variants.torch, "compile",
                        functools.partial(torch.compile, backend="aot_eager"))
    rec = run_engine(tmp_path / "run", variant="single", compile="default", warmup_steps=0,
                     max_steps=3, eval_each_epoch=False, eval_samples=4)
    assert rec["status"] == "ok", rec["reason"]
    tp = rec["throughput"]
    assert tp["compile_s"] is not None and tp["compile_s"] > 0
    assert tp["timed_steps"] == 2                         # steps 1 and 2; step 0 compiled
    assert rec["provenance"]["compile"] == "default"



@pytest.mark.slow
def test_a_cuda_graph_mode_keeps_the_graph_recording_out_of_the_timed_steps(tmp_path, monkeypatch):
    """reduce-overhead (and max-autotune) run a warm-up and record their CUDA graphs in steps 1
    and 2: those are part of compile_s and never timed."""
    import dpbench.run.variants
    monkeypatch.setattr(dpbench.run.variants.torch, "compile",
                        functools.partial(torch.compile, backend="aot_eager"))
    rec = run_engine(tmp_path / "run", variant="single", compile="reduce-overhead", warmup_steps=0,
                     max_steps=4, eval_each_epoch=False, eval_samples=4)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["throughput"]["timed_steps"] == 1                       # step 3 only
    with open(tmp_path / "run" / results.STEPS, newline="") as f:
        first_three = [float(r["step_ms"]) for r in csv.DictReader(f)][:3]
    assert rec["throughput"]["compile_s"] == pytest.approx(sum(first_three) / 1e3, rel=1e-3)


def test_every_compile_mode_of_the_schema_has_its_untimed_steps():
    import yaml
    schema = yaml.safe_load((Path(__file__).resolve().parents[2] / "experiments" / "schema.yaml").read_text())
    modes = schema["definitions"]["train"]["properties"]["compile"]["enum"]
    assert set(modes) == set(train.COMPILE_STEPS)

@pytest.mark.slow
@pytest.mark.parametrize("variant,gpus", [("single", 1), ("ddp", 2)])
def test_compile_default_through_the_engine(tmp_path, variant, gpus):
    """ResNet18 compiled by inductor on the CPU, single and ddp on 2 gloo ranks (minutes on a
    small machine)."""
    rec = run_engine(tmp_path / variant, variant=variant, gpus=gpus, compile="default",
                     global_batch=8, max_steps=3, warmup_steps=1, eval_each_epoch=False,
                     eval_samples=4, gradient_as_bucket_view=True, static_graph=True)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["throughput"]["compile_s"] > 0 and rec["throughput"]["timed_steps"] == 2
    assert rec["provenance"]["compile"] == "default"


# -- the engine records the knobs ------------------------------------------------------------------

def test_ddp_knobs_on_two_gloo_ranks_are_recorded(tmp_path):
    knobs = dict(bucket_cap_mb=1, gradient_as_bucket_view=True, static_graph=True,
                 broadcast_buffers=False)
    rec = run_engine(tmp_path / "ddp", variant="ddp", gpus=2, max_steps=2, warmup_steps=0,
                     eval_each_epoch=False, eval_samples=4, **knobs)
    assert rec["status"] == "ok", rec["reason"]
    assert {k: rec["config"][k] for k in knobs} == knobs
    assert not [w for w in rec["warnings"] if "broadcast_buffers" in w["message"]]


# -- images/s and the step-time median agree -------------------------------------------------------

def test_short_last_batch_is_not_timed_and_images_per_s_agrees_with_p50(tmp_path):
    """14 images at global batch 4: each epoch is 4, 4, 4 and a short 2. Only the full
    batches after the warm-up are timed, so images/s is the batch over the timed steps' mean
    time, and that mean lies within the timed steps' spread around the p50."""
    rec = run_engine(tmp_path / "run", variant="single", synthetic_size=14, global_batch=4,
                     epochs=2, warmup_steps=1, eval_each_epoch=False, eval_samples=4)
    assert rec["status"] == "ok", rec["reason"]
    with open(tmp_path / "run" / results.STEPS) as f:
        steps = list(csv.DictReader(f))
    assert len(steps) == 8
    timed = [float(s["step_ms"]) for s in steps if int(s["step"]) >= 1 and int(s["step"]) % 4 != 3]
    tp = rec["throughput"]
    assert tp["timed_steps"] == len(timed) == 5
    mean_ms = 4 * 1e3 / tp["images_per_s"]
    assert math.isclose(mean_ms, sum(timed) / len(timed), rel_tol=1e-9)
    assert min(timed) <= tp["step_ms_p50"] <= max(timed)
    assert abs(mean_ms - tp["step_ms_p50"]) <= max(timed) - min(timed)


def test_replicas_compute_in_the_runs_autocast_dtype_in_a_fresh_thread():
    """DataParallel's replica threads re-enter autocast without the dtype: a fresh thread takes
    the device's default, not the run's. The Autocast wrapper restores the run's dtype."""
    import threading

    from dpbench.run.variants import Autocast
    lin = torch.nn.Linear(4, 4)
    seen = {}

    def replica_thread(module, key):   # what torch's parallel_apply does in each replica thread
        with torch.amp.autocast("cpu", enabled=True):
            seen[key] = module(torch.ones(2, 4)).dtype

    with torch.autocast("cpu", dtype=torch.float16):   # the run asks for one dtype...
        for module, key in ((lin, "bare"), (Autocast(lin, torch.float16), "wrapped")):
            t = threading.Thread(target=replica_thread, args=(module, key))
            t.start()
            t.join()
    assert seen["bare"] != torch.float16     # ...a bare replica thread computes in another
    assert seen["wrapped"] == torch.float16


@pytest.mark.parametrize("fused", [True, False])
def test_fused_sgd_builds_the_fused_optimizer_and_is_recorded(tmp_path, monkeypatch, fused):
    built = []
    real = torch.optim.SGD
    monkeypatch.setattr(train.torch.optim, "SGD", lambda *a, **kw: built.append(kw) or real(*a, **kw))
    rec = run_engine(tmp_path / "run", fused_sgd=fused, max_steps=2, eval_each_epoch=False, eval_samples=4)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["config"]["fused_sgd"] is fused and built[0].get("fused", False) is fused


def test_every_spec_names_a_runtime_that_wraps():
    import importlib

    from dpbench.plan import variants
    for spec in variants.all_specs():
        assert callable(importlib.import_module(f"dpbench.run.variants.{spec.runtime}").wrap), spec.name


def test_dp_and_single_take_the_same_loss_and_ddp_scales_a_ranks_sum(one_rank_group):
    """The spec's loss reduction, asked of Variant: single's global mean, and a rank's sum scaled
    by world / global batch (one rank of one: the same number)."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    single = Variant("single", tiny(), CPU).losses(x, y, 4)
    ddp = Variant("ddp", tiny(), CPU, 1).losses(x, y, 4)
    torch.testing.assert_close(single.optimised, ddp.optimised)
    torch.testing.assert_close(single.global_sum, ddp.global_sum)
