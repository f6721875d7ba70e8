"""One training step per variant and recipe on CUDA, timed by pytest-benchmark (skipped unless
asked for, and skipped without CUDA: a CPU step says nothing about the GPU code paths).

Saved with the perf experiment's result set, per torch version (tools/device/perf.sh does this),
and compared with a committed reference's steps (nothing is written there without --benchmark-save):

    V=$(python -c 'import torch; print(torch.__version__)')
    python -m pytest tests/benchmarks --benchmark-enable --benchmark-only \\
        --benchmark-storage=results/perf-torch-$V/benchmarks --benchmark-save="torch-$V"
    python -m pytest tests/benchmarks --benchmark-enable --benchmark-only \\
        --benchmark-storage=results/reference/h200-perf-torch-2.11.0+cu130/benchmarks \\
        --benchmark-compare --benchmark-compare-fail=median:10%

The dp variants use every visible GPU; ddp runs one rank (its reducer, buckets and all-reduce
hooks are in the step). Recipes: fp32 (TF32 convolutions, contiguous), bf16 autocast +
channels_last, and for ddp the latter with gradient_as_bucket_view + static_graph.
"""
from contextlib import nullcontext

import pytest
import torch

from dpbench import DP_VARIANTS
from dpbench.bench.step_cases import BATCH, CASES, RECIPES, build
from dpbench.run.step import train_step

CUDA = torch.cuda.is_available()

pytestmark = pytest.mark.skipif(not CUDA, reason="the step benchmarks time the CUDA code paths; "
                                                  "no CUDA device is visible")


@pytest.fixture(scope="module")
def process_group_backend() -> str:
    """one_rank_group (tests/conftest.py) on NCCL: the all-reduce DDP runs on CUDA is in the
    timing."""
    return "nccl"


@pytest.mark.parametrize("name,recipe", CASES, ids=[f"{v}-{r}" for v, r in CASES])
def test_one_training_step(benchmark, name, recipe, request):
    spec = RECIPES[recipe]
    if name == "ddp":
        request.getfixturevalue("one_rank_group")
    n = torch.cuda.device_count() if name in DP_VARIANTS else 1
    devices = [torch.device("cuda", i) for i in range(n)]
    torch.backends.cudnn.benchmark = False   # the engine's default; the engine's runs say what it buys
    variant, opt, memory_format = build(name, recipe, devices)
    x = torch.randn(BATCH, 3, 32, 32, device=devices[0]).contiguous(memory_format=memory_format)
    y = torch.randint(0, 10, (BATCH,), device=devices[0])
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if spec["bf16"] else nullcontext

    def step():
        train_step(variant, opt, x, y, BATCH, autocast)
        torch.cuda.synchronize()

    for _ in range(3):   # warm-up: allocator, cuDNN plans, DDP's bucket rebuild and static graph
        step()
    benchmark.extra_info.update(variant=name, recipe=recipe, devices=n, batch=BATCH,
                                torch=torch.__version__, gpu=torch.cuda.get_device_name(0))
    benchmark.pedantic(step, rounds=20, warmup_rounds=2)
