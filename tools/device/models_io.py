"""Any model's inputs and outputs through the GPU variants (issue 36): on one GPU, DataParallel
really scatters (a tuple's and a dict's tensors to its device) and gathers, which the CPU never
does. For inputs as a tensor, a tuple and a dict, and outputs as a tensor, a tuple, a dict and a
ModelOutput-like dict, each of single, dp, dp_mean and dp_sum (fp32 and bf16) takes three engine
steps (run.step.train_step through run.variants.Variant, the run's WorkloadFeed), and fsdp on a
one-rank NCCL group too; every loss must equal the plain model's (tensor in, tensor out) of the
same variant and precision. Writes $OUT/models_io.json, prints a table, exits 1 on a mismatch.

    python tools/device/models_io.py            (about a minute on one H200)

Without CUDA it runs on the CPU over gloo (a rehearsal: DataParallel then runs its replica
in-process, without a scatter).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpbench.run import sharded
from dpbench.run.data import WorkloadFeed
from dpbench.run.step import train_step
from dpbench.run.variants import Variant
from dpbench.workloads.spec import WorkloadSpec

FORMS = [("tensor", "tensor"), ("tuple", "tuple"), ("dict", "dict"), ("dict", "modeloutput")]
VARIANTS = ["single", "dp", "dp_mean", "dp_sum", "fsdp"]
STEPS, BATCH = 3, 64


class Output(OrderedDict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


class Net(nn.Module):
    def __init__(self, returns: str):
        super().__init__()
        self.embed, self.head, self.returns = nn.Linear(32, 256), nn.Linear(256, 10), returns

    def forward(self, x, mask=None):
        h = torch.tanh(self.embed(x if mask is None else x * mask))
        logits = self.head(h)
        return {"tensor": logits, "tuple": (logits, h), "dict": {"hidden": h, "logits": logits},
                "modeloutput": Output(logits=logits, hidden_states=h)}[self.returns]


def workload(inputs: str, returns: str) -> WorkloadSpec:
    torch.manual_seed(0)

    def batch(g, n):
        x, mask = torch.randn(n, 32, generator=g), (torch.rand(n, 32, generator=g) > 0.3).float()
        y = torch.randint(0, 10, (n,), generator=g)
        return {"tensor": x * mask, "tuple": (x, mask), "dict": {"x": x, "mask": mask}}[inputs], y
    return WorkloadSpec(model=Net(returns), batch=batch,
                        loss=lambda out, y: F.cross_entropy(out, y, reduction="none"))


DEV = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def losses(name: str, precision: str, inputs: str, returns: str) -> list[float]:
    dev = DEV
    spec = workload(inputs, returns)
    model = spec.model.to(dev)
    bf16 = torch.bfloat16 if precision == "bf16" else None
    v = Variant(name, model, [dev], 1, autocast_dtype=bf16, loss=spec.loss, output=spec.output)
    opt = sharded.make_optimizer(name, model.parameters(), 0.1, 0.9, 0.0, False)
    feed = WorkloadFeed(spec.batch, STEPS * BATCH, BATCH, 0, dev, total=STEPS)
    autocast = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if bf16 is not None and name != "fsdp" \
        else (lambda: torch.autocast(dev.type, enabled=False))
    return [train_step(v, opt, x, y, n, autocast).global_sum.item() / n for x, y, n in feed.epoch(0)]


def main() -> int:
    import torch.distributed as dist
    out = Path(os.environ.get("OUT", "."))
    store = Path(tempfile.mkdtemp()) / "store"
    cuda = DEV.type == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=0, world_size=1,
                            **({"device_id": DEV} if cuda else {}))
    rows, bad = [], 0
    warnings.simplefilter("ignore")   # DataParallel's gather warning on one device
    for precision in ("fp32", "bf16"):
        for name in VARIANTS:
            base = losses(name, precision, "tensor", "tensor")
            for inputs, returns in FORMS:
                try:
                    got = losses(name, precision, inputs, returns)
                    same = max(abs(a - b) for a, b in zip(got, base)) <= 1e-6 * max(map(abs, base))
                    row = {"variant": name, "precision": precision, "inputs": inputs, "returns": returns,
                           "losses": got, "same_as_plain": same}
                except Exception as exc:
                    row = {"variant": name, "precision": precision, "inputs": inputs, "returns": returns,
                           "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                           "same_as_plain": False}
                bad += not row["same_as_plain"]
                rows.append(row)
    dist.destroy_process_group()
    (out / "models_io.json").write_text(json.dumps({"torch": torch.__version__,
                                                    "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                                                    "rows": rows}, indent=1))
    print(f"{'variant':8} {'prec':5} {'inputs':7} {'returns':12} result")
    for r in rows:
        result = "same" if r["same_as_plain"] else r.get("error") or f"DIFFERENT {r['losses']}"
        print(f"{r['variant']:8} {r['precision']:5} {r['inputs']:7} {r['returns']:12} {result}")
    print(f"{len(rows) - bad} of {len(rows)} cases take the plain model's steps")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
