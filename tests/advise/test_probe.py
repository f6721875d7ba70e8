"""The advise probe sets the numerics a run sets (TF32, cuDNN switches) before it times a step:
on an H200 an fp32 probe without TF32 timed 3-4x slower kernels than the run it predicted."""
from __future__ import annotations

import pytest
import torch

from dpbench.advise.probe import probe

TINY_LM = {"name": "transformer-lm", "args": {"width": 32, "layers": 2, "heads": 2, "seq_len": 16, "vocab": 64}}


@pytest.fixture
def tf32_off():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_the_probe_times_with_the_runs_tf32_setting(tf32_off):
    facts = probe(TINY_LM, batches=(2, 4), device=torch.device("cpu"))
    assert facts.step_s is not None and all(s > 0 for s in facts.step_s)
    # RunConfig's default (tf32: true) is what the runs it predicts train with
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cudnn.allow_tf32 is True
