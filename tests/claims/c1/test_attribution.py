"""C1's attribution: each device's peak by what allocated it, from the allocator's trace.

The trace replay and the rules run here on planted traces in the layout of
torch.cuda.memory._snapshot()["device_traces"]; the CUDA path runs on the GPU machine (the
C1 probe), and here says what it needs.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from dpbench.claims.c1 import attribution as att
from dpbench.claims.c1.text import c1_attribution_text, c1_max_batch
from dpbench.claims.records import ProbeRecord, obs

MIB = 2 ** 20
TORCH = "/usr/lib/python3/site-packages/torch"


def frames(*where: tuple[str, str]) -> list[dict]:
    """Innermost first, as the snapshot lists them."""
    return [{"filename": f, "name": n, "line": 1} for f, n in where]


MODEL_TO = frames((f"{TORCH}/nn/modules/module.py", "convert"), (f"{TORCH}/nn/modules/module.py", "_apply"),
                  ("/src/dpbench/claims/c1/attribution.py", "attribute"))
FORWARD = frames((f"{TORCH}/nn/modules/conv.py", "_conv_forward"), ("/src/dpbench/workloads/resnet.py", "forward"),
                 (f"{TORCH}/nn/parallel/parallel_apply.py", "_worker"))
GATHER = frames((f"{TORCH}/nn/parallel/comm.py", "gather"), (f"{TORCH}/nn/parallel/_functions.py", "forward"),
                (f"{TORCH}/nn/modules/module.py", "_call_impl"))
LOSS = frames((f"{TORCH}/nn/functional.py", "cross_entropy"), ("/src/dpbench/variants.py", "losses"))
SUMMED = frames((f"{TORCH}/nn/parallel/comm.py", "reduce_add_coalesced"),
                (f"{TORCH}/nn/parallel/_functions.py", "forward"), (f"{TORCH}/nn/parallel/_functions.py", "backward"),
                (f"{TORCH}/autograd/function.py", "apply"))
SCATTER_BACK = frames((f"{TORCH}/nn/parallel/comm.py", "scatter"), (f"{TORCH}/nn/parallel/_functions.py", "forward"),
                      (f"{TORCH}/nn/parallel/_functions.py", "backward"))
SCATTER = frames((f"{TORCH}/nn/parallel/comm.py", "scatter"), (f"{TORCH}/nn/parallel/scatter_gather.py", "scatter_map"))
DDP_INIT = frames((f"{TORCH}/nn/parallel/distributed.py", "_ddp_init_helper"),
                 (f"{TORCH}/nn/parallel/distributed.py", "__init__"))
DDP_FORWARD = frames((f"{TORCH}/nn/modules/conv.py", "_conv_forward"), ("/src/dpbench/workloads/resnet.py", "forward"),
                     (f"{TORCH}/nn/parallel/distributed.py", "_run_ddp_forward"),
                     (f"{TORCH}/nn/parallel/distributed.py", "forward"))
MOMENTUM = frames((f"{TORCH}/optim/sgd.py", "_multi_tensor_sgd"), (f"{TORCH}/optim/optimizer.py", "wrapper"))


@pytest.mark.parametrize("stack, category", [
    (MODEL_TO, "parameters"),
    (FORWARD, "forward activations"),
    (GATHER, "gathered outputs"),            # inside a module's call: the collective wins
    (LOSS, "loss"),
    (SUMMED, "summed gradients"),            # inside autograd's apply: the collective wins
    (SCATTER_BACK, "output gradients, scattered back"),
    (SCATTER, "scattered inputs"),
    (MOMENTUM, "optimizer state"),
    (DDP_INIT, "DDP's gradient buckets"),
    (DDP_FORWARD, "forward activations"),    # DDP's forward is not its buckets (seen on the H200)
    ([], att.NO_STACK),                      # autograd's device threads have no Python frames
    (frames(("/somewhere/else.py", "f")), att.OTHER),
])
def test_an_allocation_is_named_by_the_stack_that_made_it(stack, category):
    assert att.classify(stack) == category


def alloc(addr, mib, stack):
    return {"action": "alloc", "addr": addr, "size": int(mib * MIB), "frames": stack}


def free(addr, action="free_requested"):
    return {"action": action, "addr": addr, "size": 0, "frames": []}


def test_the_peak_is_replayed_and_split_by_what_allocated_it():
    trace = [alloc(1, 100, MODEL_TO), alloc(2, 50, FORWARD), free(2), alloc(3, 300, GATHER), alloc(4, 300, LOSS),
             {"action": "segment_alloc", "addr": 9, "size": 10 ** 9, "frames": []},   # cached, not allocated
             alloc(5, 10, []), alloc(7, 0.01, frames(("/x.py", "f"))),   # total 710: the peak
             free(3), free(3, "free_completed"),    # a request, then its completion: freed once
             free(4, "free_completed"),             # a completion without a recorded request
             alloc(6, 200, MOMENTUM)]               # 310 afterwards: below the peak
    b = att.peak_breakdown(trace)
    assert b["peak_mib"] == 710.0
    # the 0.01 MiB block rounds away
    assert b["by_category"] == {"gathered outputs": 300.0, "loss": 300.0, "parameters": 100.0, att.NO_STACK: 10.0}
    assert list(b["by_category"])[:2] == ["gathered outputs", "loss"]   # biggest first
    assert att.peak_breakdown([]) == {"peak_mib": 0.0, "by_category": {}}


def attribution_probe(dev0: dict, dev1: dict) -> ProbeRecord:
    """A C1 probe record with one DataParallel attribution line per device at two widths."""
    lines = att.observations({"variant": "dp", "gpus": 2, "batch": 2048, "per_gpu_batch": 2048, "per_classes": {
        "10": {"0": {"peak_mib": 900.0, "by_category": {"forward activations": 700.0}},
               "1": {"peak_mib": 800.0, "by_category": {"forward activations": 650.0}}},
        "32768": {"0": {"peak_mib": sum(dev0.values()), "by_category": dev0},
                  "1": {"peak_mib": sum(dev1.values()), "by_category": dev1}}}})
    return ProbeRecord("C1", "C1", {"device_type": "cuda", "gpus_visible": 2}, lines, "confirmed", "")


def test_the_summary_names_device_0s_biggest_holders_at_the_widest_output():
    p = attribution_probe({"gathered outputs": 256.0, "loss": 512.0, "forward activations": 700.0, "parameters": 43.0},
                          {"forward activations": 650.0, "replicated parameters": 43.0})
    text = c1_attribution_text(p)
    assert text == ("each device's peak by what allocated it (memory snapshot, biggest first): dp, 32,768 outputs: "
                    "device 0 1,511 MiB (forward activations 700, loss 512, gathered outputs 256) vs "
                    "device 1 693 MiB (forward activations 650, replicated parameters 43)")
    assert c1_max_batch(p) == text   # no batch search in this record: the attribution alone
    ids = [o.id for o in p.observations]
    assert "c1.attribution.dp.out32768.dev0" in ids and len(ids) == 4
    assert c1_attribution_text(ProbeRecord("C1", "C1", {}, [obs("c1.max_batch.dp.out10", "x", global_batch=1)],
                                           "confirmed", "")) == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU path")
def test_without_cuda_the_attribution_says_what_it_needs(capsys):
    assert att.main(["--variant", "dp", "--batch", "2048", "--classes", "10", "32768"]) == 0
    assert re.findall(r"\d+", json.loads(capsys.readouterr().out)["skipped"]) == ["2", "0"]   # needed, found
    assert att.main(["--variant", "single", "--batch", "2048", "--classes", "10"]) == 0
    assert re.findall(r"\d+", json.loads(capsys.readouterr().out)["skipped"]) == ["1", "0"]
