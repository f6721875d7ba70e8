"""Any model a user has (issue 36, rows 1-3 and 16): a forward that returns a dict, a tuple or a
ModelOutput, inputs that are a tuple or a dict of tensors, a parameter forward leaves unused, a
workload's args given on the command line, and check-workload training the engine's own step.
On the CPU: single in-process, ddp on 1 and 2 gloo ranks; DataParallel without CUDA runs its
replica in-process (its scatter needs GPUs: tools/device/models_io.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import launched_run
import torch

from dpbench.run.check_workload import main as check_main
from dpbench.workloads.calls import OutputError, output_tensor

ROOT = Path(__file__).resolve().parents[2]

# One model, its inputs and outputs in every form: the same numbers whichever form is asked for.
FACTORY = '''
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F
from dpbench.workloads.spec import WorkloadSpec


class Output(OrderedDict):
    """What a Hugging Face ModelOutput is to dpbench: a dict whose keys are attributes too."""
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class Net(nn.Module):
    def __init__(self, returns, unused):
        super().__init__()
        self.embed, self.head = nn.Linear(6, 16), nn.Linear(16, 3)
        self.spare = nn.Linear(16, 3) if unused else None   # never used in forward
        self.returns = returns

    def forward(self, x, mask=None):
        h = torch.tanh(self.embed(x if mask is None else x * mask))
        logits = self.head(h)
        if self.returns == "dict":
            return {"hidden": h, "logits": logits}
        if self.returns == "tuple":
            return logits, h
        if self.returns == "modeloutput":
            return Output(logits=logits, hidden_states=h)
        if self.returns == "named":   # no 'logits', two tensors: WorkloadSpec.output names one
            return {"scores": logits, "hidden": h}
        return logits


def build(returns="tensor", inputs="tensor", unused=False, output=None, width=None):
    if width is not None and not isinstance(width, int):
        raise TypeError(f"width must be an int, got {width!r}")
    model = Net(returns, unused)

    def batch(generator, n):
        x = torch.randn(n, 6, generator=generator)
        mask = (torch.rand(n, 6, generator=generator) > 0.3).float()
        y = torch.randint(0, 3, (n,), generator=generator)
        if inputs == "tuple":
            return (x, mask), y
        if inputs == "dict":
            return {"x": x, "mask": mask}, y
        return x * mask, y   # the same numbers as one tensor

    def loss(outputs, targets):
        return F.cross_entropy(outputs, targets, reduction="none")
    return WorkloadSpec(model=model, loss=loss, batch=batch, output=output)


def broken(**kw):
    raise ValueError("the user's model cannot be built")
'''

TINY = {"synthetic_size": 14, "synthetic_test_size": 8, "global_batch": 7, "epochs": 1, "max_steps": 3,
        "warmup_steps": 1, "log_every": 1000, "eval_each_epoch": False, "lr": 0.1}


@pytest.fixture(scope="module")
def factory(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("factory") / "anymodel.py"
    path.write_text(FACTORY)
    return f"{path}:build"


def run(out: Path, **overrides) -> tuple[dict, list[float]]:
    """One run through the real command line: its record and its global losses."""
    return launched_run(out, dict(TINY, **overrides))


def workload(factory: str, **args) -> dict:
    return {"factory": factory, "args": args}


@pytest.fixture(scope="module")
def ddp_of_dict_inputs_and_modeloutput(factory, tmp_path_factory) -> tuple[dict, list[float]]:
    """ddp on 2 gloo ranks of the model that takes a dict and returns a ModelOutput: one
    torchrun launch (seconds of start-up) that the outputs check and the inputs check share."""
    return run(tmp_path_factory.mktemp("ddp"), variant="ddp", gpus=2,
               workload=workload(factory, returns="modeloutput", inputs="dict"))


# -- outputs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("returns", ["dict", "tuple", "modeloutput"])
def test_a_model_returning_a_dict_tuple_or_modeloutput_trains_as_the_tensor_model(returns, factory, tmp_path):
    plain, p_curve = run(tmp_path / "plain", variant="single", workload=workload(factory))
    rec, curve = run(tmp_path / returns, variant="single", workload=workload(factory, returns=returns))
    assert plain["status"] == rec["status"] == "ok", rec["reason"]
    assert len(curve) == 3 and curve == p_curve


def test_outputs_through_ddp_on_2_gloo_ranks_follow_the_tensor_models_curve(factory, tmp_path,
                                                                          ddp_of_dict_inputs_and_modeloutput):
    _, p_curve = run(tmp_path / "plain", variant="single", workload=workload(factory))
    rec, curve = ddp_of_dict_inputs_and_modeloutput   # a ModelOutput (of dict inputs) through DDP
    assert rec["status"] == "ok", rec["reason"]
    assert curve == pytest.approx(p_curve, rel=1e-5, abs=1e-6)


def _variant_losses(name: str, spec, steps: int = 2, **kwargs) -> list[float]:
    """`steps` engine steps of one Variant on the CPU, global batch 7 from the run's feed."""
    from dpbench.run import sharded
    from dpbench.run.data import WorkloadFeed
    from dpbench.run.step import train_step
    from dpbench.run.variants import Variant
    cpu = torch.device("cpu")
    v = Variant(name, spec.model, [cpu], 1, kwargs.pop("ddp", None), loss=spec.loss, output=spec.output)
    opt = sharded.make_optimizer(name, spec.model.parameters(), 0.1, 0.9, 0.0, False)
    feed = WorkloadFeed(spec.batch, 7 * steps, 7, 0, cpu, total=steps)
    return [train_step(v, opt, x, y, n).global_sum.item() for x, y, n in feed.epoch(0)]


def _build(factory: str, **args):
    from dpbench.workloads.spec import build
    torch.manual_seed(0)
    return build(workload(factory, **args))


@pytest.mark.parametrize("name", ["single", "dp", "dp_mean", "dp_sum", "ddp", "zero1"])
@pytest.mark.parametrize("returns, inputs", [("dict", "tensor"), ("tuple", "tuple"), ("modeloutput", "dict")])
def test_every_variant_takes_the_same_steps_whatever_forward_takes_and_returns(name, returns, inputs, factory,
                                                                               one_rank_group):
    """ddp and zero1 on one gloo rank; DataParallel without CUDA runs its replica in-process."""
    expected = _variant_losses("single", _build(factory))
    assert _variant_losses(name, _build(factory, returns=returns, inputs=inputs)) == pytest.approx(expected, rel=1e-6)


def test_the_output_rule_and_the_output_option():
    t, h = torch.ones(2, 3), torch.zeros(2, 4)
    assert output_tensor(t) is t
    assert output_tensor({"hidden": h, "logits": t}) is t              # "logits" first
    assert output_tensor({"only": t, "note": "text"}) is t             # else the only tensor
    assert output_tensor((t, h)) is t                                  # a tuple's first element
    assert output_tensor({"scores": t, "hidden": h}, "scores") is t    # a key
    assert output_tensor((h, t), 1) is t                               # an index
    assert output_tensor({"a": (t, h)}, lambda out: out["a"][0]) is t  # a function
    for out, given in (({"scores": t, "hidden": h}, None), ((h.tolist(), t), None), ({"a": t}, "b")):
        with pytest.raises(OutputError):
            output_tensor(out, given)


def test_a_dict_without_logits_trains_with_its_output_named(factory, tmp_path, capsys):
    assert check_main([json.dumps(workload(factory, returns="named"))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OutputError" in err and "scores" in err
    assert check_main([json.dumps(workload(factory, returns="named", output="scores"))]) == 0


# -- inputs ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("inputs", ["tuple", "dict"])
def test_a_two_input_model_trains_single_and_ddp_on_2_ranks_alike(inputs, factory, tmp_path, request):
    spec = workload(factory, inputs=inputs)
    single, s_curve = run(tmp_path / "single", variant="single", workload=spec)
    assert single["status"] == "ok", single["reason"]
    assert len(s_curve) == 3 and s_curve[0] != s_curve[-1]
    _, p_curve = run(tmp_path / "plain", variant="single", workload=workload(factory))
    assert s_curve == p_curve   # the same numbers as one tensor
    dp, _ = run(tmp_path / "dp", variant="dp", gpus=2, workload=spec)
    assert dp["status"] == "skipped"   # as usual without CUDA
    if inputs == "dict":   # one torchrun launch is enough for the CPU loop (its model returns a ModelOutput)
        ddp, d_curve = request.getfixturevalue("ddp_of_dict_inputs_and_modeloutput")
        assert ddp["status"] == "ok", ddp["reason"]
        assert d_curve == pytest.approx(s_curve, rel=1e-5, abs=1e-6)


def test_the_feed_slices_every_input_tensor_alike():
    from dpbench.run.data import WorkloadFeed

    def make(g, n):
        x = torch.arange(n * 2.0).view(n, 2)
        return {"a": x, "b": x[:, 0].long()}, torch.arange(n)

    parts = [list(WorkloadFeed(make, 7, 7, 0, torch.device("cpu"), 2, r).epoch(0))[0] for r in range(2)]
    assert [len(x["a"]) for x, _, _ in parts] == [len(x["b"]) for x, _, _ in parts] == [4, 3]
    assert [n for _, _, n in parts] == [7, 7]
    assert torch.equal(torch.cat([x["b"] for x, _, _ in parts]), torch.arange(0, 14, 2))


# -- parameters forward leaves unused -------------------------------------------------------------

def test_an_unused_parameter_fails_ddp_in_one_whole_sentence_without_the_option(factory, capsys):
    spec = json.dumps(workload(factory, unused=True))
    assert check_main([spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dpbench check-workload: ddp")
    assert "find_unused_parameters" in err and "participate in calculating loss." in err   # the hint whole
    assert check_main([spec, "--find-unused-parameters"]) == 0


@pytest.mark.parametrize("name", ["ddp", "zero1"])
def test_an_unused_parameter_trains_with_find_unused_parameters(name, factory, one_rank_group):
    from dpbench.plan.config import RunConfig
    from dpbench.plan.variants.settings import DDPSettings
    expected = _variant_losses("single", _build(factory), steps=3)
    with pytest.raises(RuntimeError, match="find_unused_parameters"):
        _variant_losses(name, _build(factory, unused=True), steps=3)
    opts = RunConfig(variant=name, find_unused_parameters=True).variant_settings(DDPSettings)
    assert _variant_losses(name, _build(factory, unused=True), steps=3, ddp=opts) == pytest.approx(expected)


def test_find_unused_parameters_is_a_run_option_quiet_at_its_default():
    from dpbench.plan.config import RunConfig
    from dpbench.plan.variants.settings import DDPSettings
    from dpbench.run.variants import ddp_kwargs
    assert "find_unused_parameters" not in RunConfig(variant="ddp").to_dict()
    assert "find_unused_parameters" not in ddp_kwargs(RunConfig(variant="ddp").variant_settings(DDPSettings))
    cfg = RunConfig.from_dict({"variant": "zero1", "gpus": 2, "find_unused_parameters": True})
    assert ddp_kwargs(cfg.variant_settings(DDPSettings))["find_unused_parameters"] is True


# -- args from the command line, a factory that fails, check-workload -----------------------------

def test_args_given_with_config_keep_their_types(factory, capsys):
    from snakemake.cli import parse_config

    from dpbench.plan import pipeline
    from dpbench.workloads.registry import parse
    given = "{factory: '%s', args: {width: 64, inputs: dict}}" % factory
    config = parse_config([f"train={{workload: {given}}}", "experiment=smoke",
                           "cpu_plan={workload_args: {transformer-lm: {width: 32, tied: false}}}"])
    assert config["train"]["workload"]["args"]["width"] == "64"   # what Snakemake hands over
    merged = pipeline.load_experiment(config, ROOT)
    assert merged["train"]["workload"]["args"] == {"width": 64, "inputs": "dict"}
    assert merged["cpu_plan"]["workload_args"]["transformer-lm"] == {"width": 32, "tied": False}
    runs = pipeline.make_plan(merged).runs
    assert runs and all(cfg.workload["args"]["width"] == 64 for cfg in runs.values())
    assert parse(given) == merged["train"]["workload"]   # as check-workload reads it
    assert check_main([given]) == 0


def test_a_factory_that_fails_in_ddp_is_not_blamed_on_the_process_group(factory, tmp_path):
    rec, _ = run(tmp_path / "f", variant="ddp", gpus=2, workload=factory.replace(":build", ":broken"))
    assert rec["status"] == "failed"
    assert "at building the workload" in rec["reason"] and "process group" not in rec["reason"]
    assert "the user's model cannot be built" in rec["reason"]


def test_check_workload_trains_single_and_ddp_through_the_engines_step(factory, capsys, monkeypatch):
    from dpbench.run import step
    taken = []
    real = step.train_step
    monkeypatch.setattr(step, "train_step", lambda v, *a, **k: taken.append(v.name) or real(v, *a, **k))
    assert check_main([json.dumps(workload(factory, returns="modeloutput", inputs="dict"))]) == 0
    out = capsys.readouterr().out
    assert taken == ["single", "single", "ddp", "ddp"]
    assert "single: 2 steps" in out and "ddp: 2 steps" in out


def test_a_small_hugging_face_gpt2_trains(tmp_path, capsys):
    """The docs' Hugging Face example (GPT2 from a config, input ids and an attention mask)."""
    pytest.importorskip("transformers")
    text = (ROOT / "docs" / "your-model.md").read_text()
    source = next(b for b in (part.split("```")[0] for part in text.split("```python\n")[1:]) if "transformers" in b)
    (tmp_path / "hf_models.py").write_text(source)
    assert check_main([f"{tmp_path / 'hf_models.py'}:gpt2"]) == 0
    out = capsys.readouterr().out
    assert "ddp: 2 steps" in out and "input_ids" in out and "attention_mask" in out


@pytest.mark.parametrize("inputs", ["tuple", "dict"])
def test_accumulation_splits_tuple_and_dict_inputs_tensor_by_tensor(inputs, factory, tmp_path):
    spec = workload(factory, inputs=inputs)
    _, whole = run(tmp_path / "whole", variant="single", workload=spec, global_batch=8)
    rec, split = run(tmp_path / "split", variant="single", workload=spec, global_batch=8, accumulate=2)
    assert rec["status"] == "ok", rec["reason"]
    assert split == pytest.approx(whole, rel=1e-6, abs=1e-7)   # the same global batch, the same gradient
