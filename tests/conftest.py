import difflib
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from dpbench import results
from dpbench.analysis import collect
from dpbench.run.launch import main as train_main

# Small frozen result sets (tests/fixtures/README.md says where each came from).
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SNAPSHOTS = FIXTURES / "snapshots"

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


@pytest.fixture(scope="session")
def fixture_results(tmp_path_factory):
    """name -> a results folder holding a copy of tests/fixtures/<name>, every tag collected
    (its tables and provenance.json made from its runs' records by today's code). Made once per
    session; a test must not change it."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            root = tmp_path_factory.mktemp(name) / "results"
            shutil.copytree(FIXTURES / name, root)
            for tag in sorted(p.name for p in root.iterdir() if (p / "runs").is_dir()):
                collect.collect(root, tag)
            made[name] = root
        return made[name]
    return make


@pytest.fixture
def snapshot():
    """check(name, text): text must equal tests/fixtures/snapshots/<name>. Rewrite the
    snapshots after a deliberate change of wording with
    DPBENCH_UPDATE_SNAPSHOTS=1 python -m pytest tests/workflow/test_fixture_sets.py (and commit them)."""
    def check(name: str, text: str) -> None:
        path = SNAPSHOTS / name
        if os.environ.get("DPBENCH_UPDATE_SNAPSHOTS") == "1":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.is_file(), f"no snapshot {path.name}: make it with DPBENCH_UPDATE_SNAPSHOTS=1"
        kept = path.read_text()
        diff = difflib.unified_diff(kept.splitlines(), text.splitlines(), f"snapshot {name}", "made now",
                                    lineterm="", n=0)
        assert text == kept, "\n".join(list(diff)[:30]) + "\n(DPBENCH_UPDATE_SNAPSHOTS=1 rewrites it)"
    return check
