import json
import pickle
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dpbench import results
from dpbench.run.launch import main as train_main

# Small enough for 2 CPU cores: a few steps of ResNet18 on a handful of 32x32 images.
TINY = {"dataset": "synthetic", "synthetic_size": 48, "synthetic_test_size": 16,
        "global_batch": 12, "epochs": 1, "warmup_steps": 1, "log_every": 1000}


@pytest.fixture(autouse=True)
def _no_injected_fault(monkeypatch):
    monkeypatch.delenv("DPBENCH_FAULT", raising=False)


@pytest.fixture(scope="module")
def process_group_backend() -> str:
    """one_rank_group's backend: gloo, for CPU tensors. A module whose DDP runs on CUDA
    overrides this fixture with nccl."""
    return "gloo"


@pytest.fixture(scope="module")
def one_rank_group(process_group_backend):
    """A one-rank process group, for a module: enough to construct DDP and run its reducer
    (bucketing, all-reduce hooks)."""
    import torch.distributed as dist
    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group(process_group_backend, init_method=f"file://{store.name}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    Path(store.name).unlink(missing_ok=True)   # the FileStore may have removed it already


def run_engine(out: Path, **overrides) -> dict:
    """One run through the real CLI; returns its metrics.json."""
    cfg = dict(TINY, **overrides)
    assert train_main(["--config", json.dumps(cfg), "--out", str(out)]) == 0
    return results.read_json(out / results.METRICS)


def write_official_cifar(root: Path, per_batch: int = 6, seed: int = 0) -> Path:
    """A tiny CIFAR-10 copy in the official pickle layout (cifar-10-batches-py)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {"batch_label": name,
                 "labels": rng.integers(0, 10, per_batch).tolist(),
                 "data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "filenames": [f"{name}_{i}.png" for i in range(per_batch)]}
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
    return folder
