"""Workloads (dpbench.workloads): the built-ins build at tiny sizes and train a step, their batches
are deterministic, the transformer's sizes match their closed forms, a user's factory file and an
entry-point plugin are found, the registry stays torch-free, and check-workload names each broken
factory in one line with exit status 2."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpbench.workloads import registry
from dpbench.run.check_workload import main as check_main
from dpbench.workloads.registry import WorkloadError
from dpbench.workloads.spec import build as spec_build

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

TINY_LM = {"width": 32, "layers": 2, "heads": 4, "seq_len": 16, "vocab": 50}
BUILTINS = [
    "resnet18-cifar10",
    {"name": "transformer-lm", "args": TINY_LM},
    {"name": "torchvision", "args": {"model": "resnet18", "resolution": 32, "num_classes": 10}},
]

# A user's model with knobs that break it one way at a time.
USER = """
import torch
import torch.nn as nn
import torch.nn.functional as F

from dpbench.workloads.spec import WorkloadSpec


def build(hidden=8, loss="per-sample", features=4, returns="spec", seeded=True):
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def batch(generator, n):
        return (torch.randn(n, features, generator=generator if seeded else None),
                torch.randint(0, 3, (n,), generator=generator))

    def per_sample(outputs, targets):
        return F.cross_entropy(outputs, targets, reduction="none" if loss == "per-sample" else "mean")

    if returns != "spec":
        return {"model": model}
    return WorkloadSpec(model=model, loss=per_sample, batch=batch)
"""


@pytest.fixture
def user_file(tmp_path) -> Path:
    path = tmp_path / "my_model.py"
    path.write_text(USER)
    return path


@pytest.mark.parametrize("spec", BUILTINS, ids=["resnet18-cifar10", "transformer-lm", "torchvision"])
def test_a_builtin_builds_draws_the_same_batch_for_a_seed_and_trains_a_step(spec):
    import torch
    w = spec_build(spec)
    x, y = w.batch(torch.Generator().manual_seed(3), 4)
    x2, y2 = w.batch(torch.Generator().manual_seed(3), 4)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, w.batch(torch.Generator().manual_seed(4), 4)[0])
    opt = torch.optim.SGD(w.model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(2):
        per_sample = w.loss(w.model(x), y)
        assert per_sample.shape == (4,)
        opt.zero_grad()
        per_sample.mean().backward()
        opt.step()
        losses.append(per_sample.mean().item())
    assert all(torch.isfinite(torch.tensor(losses)))
    sizes = w.sizes()
    assert sizes["parameters"] == sum(p.numel() for p in w.model.parameters())
    assert sizes["sgd_state_bytes"] == sizes["parameter_bytes"] == sizes["gradient_bytes"]
    assert sizes["adam_state_bytes"] == 2 * sizes["parameter_bytes"]
    assert sizes["flops_per_sample"] > 0 and w.shard_modules


def test_the_default_workload_is_todays_resnet18_on_cifar10():
    w = spec_build(None)
    assert w.parameters == 11_173_962 and w.dataset == "cifar10" and w.sample_unit == "images"
    assert w.flops() == pytest.approx(3 * 2 * 0.556e9, rel=0.01)   # 0.556 G multiply-adds forward


@pytest.mark.parametrize("tied", [True, False])
def test_the_transformers_sizes_match_their_closed_forms(tied):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from dpbench.workloads import transformer_lm
    from dpbench.workloads.spec import counted_flops
    w = transformer_lm.build(**TINY_LM, tied=tied)
    d, L, T, V = TINY_LM["width"], TINY_LM["layers"], TINY_LM["seq_len"], TINY_LM["vocab"]
    expected = L * (12 * d * d + 13 * d) + V * d + T * d + 2 * d + (0 if tied else V * d)
    assert transformer_lm.parameter_count(d, L, T, V, tied) == expected == w.parameters
    assert w.sample_unit == "tokens" and w.units_per_sample == T
    x, _ = w.batch(torch.Generator().manual_seed(0), 1)
    with sdpa_kernel(SDPBackend.MATH):
        assert counted_flops(w.model, x) == w.flops_per_sample   # the analytic count is exact


def test_a_billion_parameter_transformer_is_one_argument_away():
    from dpbench.workloads import transformer_lm
    assert transformer_lm.parameter_count(256, 4, 512, 32768, True) < 15e6
    assert transformer_lm.parameter_count(2048, 20, 1024, 32768, True) > 1e9


def test_a_users_file_factory_checks_and_its_digest_follows_the_file(user_file, capsys):
    ref = f"{user_file}:build"
    assert check_main([ref]) == 0
    out = capsys.readouterr().out
    assert f"workload {ref}: ok" in out and "parameters 67 " in out and "(2, 4) float32" in out
    before = registry.describe({"factory": ref, "args": {"hidden": 8}})
    assert before["factory"] == ref and before["args"] == {"hidden": 8}
    user_file.write_text(USER.replace("nn.ReLU()", "nn.Tanh()"))
    assert registry.describe(ref)["source_sha256"] != before["source_sha256"]


def test_the_docs_example_checks(tmp_path, capsys):
    text = (ROOT / "docs" / "your-model.md").read_text()
    (tmp_path / "models.py").write_text(text.split("```python\n")[1].split("```")[0])
    assert check_main([f"{tmp_path / 'models.py'}:build"]) == 0
    assert "shard_modules Block" in capsys.readouterr().out


def test_a_mapping_on_the_command_line_passes_its_args(user_file, capsys):
    assert check_main([f'{{factory: "{user_file}:build", args: {{hidden: 16}}}}']) == 0
    assert "parameters 131 " in capsys.readouterr().out   # 4*16+16 + 16*3+3


@pytest.mark.parametrize("case, words", [
    ("no_such_package_xyz.models:build", ["cannot import no_such_package_xyz",
                                          "ModuleNotFoundError: No module named 'no_such_package_xyz'"]),
    ("{broken}:build", ["cannot import", "SyntaxError"]),
    ("{file}:nope", ["has no function 'nope'"]),
    ('{{factory: "{file}:build", args: {{returns: dict}}}}', ["returned a dict, not a dpbench.workloads.spec.WorkloadSpec"]),
    ('{{factory: "{file}:build", args: {{loss: scalar}}}}', ["the loss has shape ()", "per-sample"]),
    ('{{factory: "{file}:build", args: {{features: 5}}}}', ["does the batch match the model?", "RuntimeError"]),
    ('{{factory: "{file}:build", args: {{seeded: false}}}}', ["the batch maker is not deterministic"]),
    ('{{factory: "{file}:build", args: {{widht: 3}}}}', ["its factory failed: TypeError", "widht"]),
    ("no-such-workload", ["no workload named 'no-such-workload'", "transformer-lm"]),
], ids=["not-importable", "syntax-error", "no-function", "wrong-return", "scalar-loss", "batch-mismatch",
        "unseeded-batch", "bad-arg", "unknown-name"])
def test_check_workload_names_a_broken_factory_in_one_line(case, words, user_file, tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def build(:\n")
    assert check_main([case.format(file=user_file, broken=broken)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("dpbench check-workload: ")
    for w in words:
        assert w in err


def test_the_command_line_exits_2_with_one_line():
    out = subprocess.run([sys.executable, "-m", "dpbench.cli", "check-workload", "no_such_package_xyz:build"],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "no_such_package_xyz" in out.stderr   # the module named


def test_the_registry_resolves_and_describes_without_torch():
    code = textwrap.dedent("""
        import sys
        from dpbench.workloads import registry
        for spec in ("resnet18-cifar10", {"name": "transformer-lm", "args": {"width": 64}}, None):
            d = registry.describe(spec)
            assert d["source_sha256"] and "name" in d, d
        assert registry.resolve("pkg.mod:build") == ("pkg.mod:build", "pkg.mod:build", {})
        assert "torch" not in sys.modules and "torchvision" not in sys.modules
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("spec, words", [
    ({"name": "transformer-lm", "factory": "a:b"}, "exactly one of name or factory"),
    ({"name": "transformer-lm", "arg": {}}, "unknown key(s) arg"),
    ({"name": "transformer-lm", "args": [1]}, "args must be a mapping"),
    ("mod:not-a-name", "write it as 'pkg.module:function'"),
])
def test_a_malformed_spec_is_refused_before_anything_is_imported(spec, words):
    with pytest.raises(WorkloadError) as e:
        registry.resolve(spec)
    assert words in str(e.value)


def test_an_entry_point_plugin_is_found_and_built(tmp_path, monkeypatch):
    (tmp_path / "tiny_plugin.py").write_text(USER)
    dist = tmp_path / "tiny_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dpbench.workloads]\ntiny-mlp = tiny_plugin:build\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registry.resolve({"name": "tiny-mlp", "args": {"hidden": 4}}) == ("tiny-mlp", "tiny_plugin:build", {"hidden": 4})
    assert spec_build("tiny-mlp", hidden=4).parameters == 4 * 4 + 4 + 4 * 3 + 3
    assert registry.describe("tiny-mlp")["name"] == "tiny-mlp"
    sys.modules.pop("tiny_plugin", None)
