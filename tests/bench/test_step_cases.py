"""The step benchmarks (tests/benchmarks/test_step.py, dpbench.bench.step_cases) on the CPU:
every case is collected and skipped with its reason (a machine without CUDA says why it timed
nothing instead of collecting nothing), and a case is wrapped the way the engine wraps its runs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpbench import DP_VARIANTS, VARIANTS
from dpbench.bench import step_cases
from dpbench.run.variants import Autocast

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "tests" / "benchmarks" / "test_step.py"


def test_every_case_is_collected_and_skipped_with_the_reason_without_cuda():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(MODULE.relative_to(ROOT)), "-p", "no:cacheprovider", "-q", "-rs",
         "--benchmark-enable", "--benchmark-only"],
        cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    n = len(step_cases.CASES)
    assert n and {v for v, _ in step_cases.CASES} == set(VARIANTS)
    assert re.search(rf"^{n} skipped in ", proc.stdout, re.M), proc.stdout[-2000:]
    assert re.search(rf"^SKIPPED \[{n}\] tests/benchmarks/test_step.py:\d+: the step benchmarks time the CUDA "
                     r"code paths; no CUDA device is visible$", proc.stdout, re.M), proc.stdout[-2000:]


@pytest.mark.parametrize("name", DP_VARIANTS)
def test_dp_replicas_of_a_bf16_case_are_told_the_autocast_dtype(name):
    variant, _, fmt = step_cases.build(name, "bf16_cl", [torch.device("cpu")])
    assert fmt == torch.channels_last
    assert [m.dtype for m in variant.module.modules() if isinstance(m, Autocast)] == [torch.bfloat16]
    fp32, _, _ = step_cases.build(name, "fp32", [torch.device("cpu")])
    assert not any(isinstance(m, Autocast) for m in fp32.module.modules())
