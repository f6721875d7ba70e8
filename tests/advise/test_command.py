"""`dpbench advise` on the CPU: for a built-in workload and a user's factory it probes, prints a
table and a recommendation whose numbers are the memory model's plus the probe's; bad input is
one line and exit status 2; with --check the setups' gloo ranks hold the tensors the memory
model predicts."""
from __future__ import annotations

import json

import pytest

from dpbench.advise import check as C
from dpbench.advise.predict import ProbeFacts, Setup, setting
from dpbench.analysis.memory_model import MIB, predicted_bytes
from dpbench.cli import main as cli_main

TINY_LM = '{name: transformer-lm, args: {width: 32, layers: 2, heads: 2, seq_len: 16, vocab: 64}}'
USER = '''
import torch
import torch.nn as nn
from dpbench.workloads.spec import WorkloadSpec


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x)) + x


def build(width: int = 16, classes: int = 4):
    model = nn.Sequential(nn.Linear(8, width), Block(width), Block(width), nn.Linear(width, classes))

    def batch(generator, n):
        return torch.randn(n, 8, generator=generator), torch.randint(0, classes, (n,), generator=generator)
    return WorkloadSpec(model=model, loss=lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"),
                        batch=batch, shard_modules=(Block,))
'''


def advice_json(capsys, *args) -> dict:
    assert cli_main(["advise", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def facts_of(doc: dict) -> ProbeFacts:
    probe = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["probe"].items()}
    return ProbeFacts(**probe)


def check_rows(doc: dict, gpus: int) -> None:
    """Every row's numbers are the memory model's state plus the probe's terms."""
    f = facts_of(doc)
    names = [r["setup"] for r in doc["rows"]]
    assert len(names) == len(set(names))
    assert doc["chosen"] == doc["rows"][0]["setup"] and doc["rows"][0]["fits"]
    assert [r["rank"] for r in doc["rows"]] == list(range(1, len(names) + 1))
    for r in doc["rows"]:
        o = r["options"]
        setup = Setup(o["variant"], o.get("reshard_after_forward", True), o.get("accumulate", 1),
                      o.get("checkpoint") == "units", bool(o.get("offload")))
        assert setup.name == r["setup"]
        if setup.offload or setup.accumulate > 1:
            continue
        state = float(predicted_bytes(setting(f, setup, gpus))["state"]) / MIB
        a0, a1 = f.line(setup.checkpoint)
        acts = max(0.0, a0 + a1 * r["batch"])
        allocated = r["allocated_gib"] * 1024
        assert allocated >= state + f.fixed_mib + acts - 1e-6
        assert r["nvml_gib"] * 1024 == pytest.approx(allocated + f.reserved_extra_mib + f.context_mib)


def test_advise_a_builtin_workload_on_the_cpu(capsys):
    doc = advice_json(capsys, TINY_LM, "--gpus", "2", "--gpu-memory", "1")
    assert {"ddp", "zero1", "fsdp", "fsdp-keep", "hsdp", "ddp+checkpoint", "fsdp+offload"} <= \
        {r["setup"] for r in doc["rows"]}
    assert doc["probe"]["parameters"] == 28032 and doc["probe"]["device"] == "cpu"
    check_rows(doc, 2)


def test_advise_a_users_factory_prints_a_table_and_a_recommendation(tmp_path, capsys):
    (tmp_path / "models.py").write_text(USER)
    ref = f"{tmp_path / 'models.py'}:build"
    assert cli_main(["advise", ref, "--gpus", "4", "--gpu-memory", "2", "--batch", "16"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert len(table) >= 2 + 5                              # header, rule, a row per setup at least
    doc = advice_json(capsys, ref, "--gpus", "4", "--gpu-memory", "2", "--batch", "16")
    check_rows(doc, 4)
    assert all(r["batch"] == 16 for r in doc["rows"])
    assert doc["chosen"] in out


@pytest.mark.parametrize("args", [
    ["no_such_workload_xyz", "--gpus", "2", "--gpu-memory", "8"],
    ["no_such_package_xyz.models:build", "--gpus", "2", "--gpu-memory", "8"],
    [TINY_LM, "--gpus", "0", "--gpu-memory", "8"],
    [TINY_LM, "--gpus", "2", "--gpu-memory", "-1"],
    [TINY_LM, "--gpus", "2", "--gpu-memory", "8", "--batch", "0"],
    [TINY_LM, "--gpus", "4", "--gpu-memory", "8", "--gpus-per-node", "3"],
    [TINY_LM, "--gpus", "2", "--gpu-memory", "8", "--probe-batches", "4", "2"],
    [TINY_LM, "--gpus", "two", "--gpu-memory", "8"],
    [TINY_LM, "--gpu-memory", "8"],
    [TINY_LM, "--gpus", "2", "--gpu-memory", "inf"],
    ["{name: [unclosed", "--gpus", "2", "--gpu-memory", "8"],
])
def test_bad_input_is_one_line_and_exit_status_2(args, capsys):
    assert cli_main(["advise", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dpbench advise: error:")


@pytest.mark.slow   # three launches of two gloo ranks: ~40 s
def test_check_compares_gloo_ranks_counted_tensors_with_the_memory_model(capsys):
    """--check on the CPU: the recommended setup and two runners-up as 2 gloo ranks each; the
    parameters, gradients and optimizer state every rank holds are the memory model's."""
    doc = advice_json(capsys, TINY_LM, "--gpus", "2", "--gpu-memory", "1", "--check")
    rows = doc["check"]
    assert {r["setup"] for r in rows} == {r["setup"] for r in doc["rows"][:3]}
    counted = [r for r in rows if r["what"] in C.COMPONENTS]
    assert len(counted) == 3 * len(C.COMPONENTS)
    assert {r["what"] for r in rows} - set(C.COMPONENTS) <= {"samples_per_s"}   # no allocator on the CPU
    for r in counted:
        assert r["status"] == "ok" and r["measured"] > 0
        assert r["error"] == pytest.approx(0, abs=1e-9), r
