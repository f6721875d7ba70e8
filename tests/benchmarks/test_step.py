"""One training step per variant, timed by pytest-benchmark (skipped unless asked for).

    python -m pytest tests/benchmarks --benchmark-enable --benchmark-only \
        --benchmark-save="torch-$(python -c 'import torch; print(torch.__version__)')"
    python -m pytest tests/benchmarks --benchmark-enable --benchmark-only \
        --benchmark-compare --benchmark-compare-fail=median:10%

On a GPU machine the dp variants use every visible GPU; without CUDA they are skipped, and
single and ddp (one gloo rank) run on the CPU with a small batch.
"""
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dpbench import DP_VARIANTS, VARIANTS
from dpbench.model import resnet18
from dpbench.variants import Variant

CUDA = torch.cuda.is_available()
BATCH = 512 if CUDA else 16


@pytest.fixture(scope="module")
def process_group():
    """A one-rank group, so that DDP's step (bucketing, all-reduce hooks) is in the timing."""
    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("nccl" if CUDA else "gloo", init_method=f"file://{store.name}",
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    Path(store.name).unlink(missing_ok=True)   # the FileStore may have removed it already


@pytest.mark.parametrize("name", VARIANTS)
def test_one_training_step(benchmark, name, request):
    if name in DP_VARIANTS and not CUDA:
        pytest.skip("nn.DataParallel needs CUDA devices")
    if name == "ddp":
        request.getfixturevalue("process_group")
    n = torch.cuda.device_count() if CUDA and name in DP_VARIANTS else 1
    devices = [torch.device("cuda", i) for i in range(n)] if CUDA else [torch.device("cpu")]
    torch.manual_seed(0)
    model = resnet18().to(devices[0])
    variant = Variant(name, model, devices)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(BATCH, 3, 32, 32, device=devices[0])
    y = torch.randint(0, 10, (BATCH,), device=devices[0])

    def step():
        opt.zero_grad(set_to_none=True)
        variant.losses(x, y, BATCH).optimised.backward()
        opt.step()
        if CUDA:
            torch.cuda.synchronize()

    step()   # warm-up: allocator, cuDNN plans
    benchmark.extra_info.update(variant=name, devices=n, batch=BATCH, torch=torch.__version__)
    benchmark.pedantic(step, rounds=10 if CUDA else 3, warmup_rounds=2 if CUDA else 0)
