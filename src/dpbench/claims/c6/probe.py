"""C6: mean of per-replica means vs per-replica sums / global batch, on uneven splits.

DataParallel splits the batch with torch.chunk. Three levels of evidence: the article's
arithmetic; a CPU emulation of the split on one model (runs in CI); first-step gradients
under real DataParallel when GPUs exist. BatchNorm is in eval mode wherever gradients are
compared, so that per-replica batch statistics do not mix into the reduction's effect.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpbench.claims import CONFIRMED, NUANCE, REFUTED
from dpbench.claims.common import gpus_visible, needs, record
from dpbench.claims.records import ProbeRecord
from dpbench.claims.records import obs as observation
from dpbench.workloads.resnet import resnet18
from dpbench.run.variants import Variant

ARTICLE_LOSSES = [0.3, 0.2, 0.8]
# (global batch, replicas): CIFAR-10's full and final (50000 % 128 = 80) batches, plus even splits
SPLITS = [(128, 3), (80, 3), (128, 2), (128, 4)]
# A reduction is called biased when its gradient differs from the full-batch mean's by more
# than this many times the float error of the unbiased one (and more than 1e-5 relative).
BIAS_FACTOR = 10


def chunk_sizes(batch: int, parts: int) -> list[int]:
    return [len(c) for c in torch.arange(batch).chunk(parts)]


def article_arithmetic() -> dict:
    """The article's example, plus the per-sample weight each reduction puts on the gradient."""
    losses = torch.tensor(ARTICLE_LOSSES, dtype=torch.float64, requires_grad=True)
    chunks = losses.chunk(2)
    reductions = {
        "one device mean": losses.mean(),
        "mean of per-device means": torch.stack([c.mean() for c in chunks]).mean(),
        "sum / N": sum(c.sum() for c in chunks) / len(losses),
    }
    out = {"losses": ARTICLE_LOSSES, "split": [len(c) for c in chunks]}
    for name, value in reductions.items():
        (weights,) = torch.autograd.grad(value, losses)
        out[name] = {"value": round(value.item(), 4),
                     "per_sample_weights": [round(w, 4) for w in weights.tolist()]}
    return out


def _flat_grad(model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def emulate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, parts: int) -> dict:
    """Forward each torch.chunk piece separately, as DataParallel's replicas do, on one model."""
    chunks = list(zip(x.chunk(parts), y.chunk(parts)))
    full_loss = F.cross_entropy(model(x), y)
    full = _flat_grad(model, full_loss)
    mom_loss = torch.stack([F.cross_entropy(model(cx), cy) for cx, cy in chunks]).mean()
    mom = _flat_grad(model, mom_loss)
    sum_loss = sum(F.cross_entropy(model(cx), cy, reduction="sum") for cx, cy in chunks) / len(x)
    sum_n = _flat_grad(model, sum_loss)
    return {"batch": len(x), "chunks": [len(c) for c, _ in chunks],
            "loss_full_mean": full_loss.item(), "loss_mean_of_means": mom_loss.item(),
            "loss_sum_over_n": sum_loss.item(),
            "grad_rel_diff_mean_of_means": _rel(mom, full), "grad_rel_diff_sum_over_n": _rel(sum_n, full)}


def _batch(n: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(n)
    return (torch.randn(n, 3, 32, 32, generator=g).to(device),
            torch.randint(0, 10, (n,), generator=g).to(device))


def dataparallel_first_step(model: nn.Module, batch: int, gpus: int) -> dict:
    """First-step gradients of dp_mean and dp_sum against one device, BatchNorm in eval mode,
    through the engine's own variants (dpbench.run.variants), so the probe checks what training runs."""
    x, y = _batch(batch, "cuda:0")
    single = _flat_grad(model, F.cross_entropy(model(x), y))
    out = {"batch": batch, "gpus": gpus, "chunks": chunk_sizes(batch, gpus)}
    devices = [torch.device("cuda", i) for i in range(gpus)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the gather warning is C5's subject, not this one's
        for name in ("dp_mean", "dp_sum"):
            loss = Variant(name, model, devices).losses(x, y, batch).optimised
            out[f"grad_rel_diff_{name}_vs_single"] = _rel(_flat_grad(model, loss), single)
    return out


def biased(rel_mean: float, rel_sum: float) -> bool:
    return rel_mean > max(BIAS_FACTOR * rel_sum, 1e-5)


def run() -> ProbeRecord:
    n = gpus_visible()
    arith = article_arithmetic()
    obs = [observation("c6.article_example", "article's example, split by torch.chunk on 2 devices", **arith),
           observation("c6.chunk_sizes", "torch.chunk sizes (DataParallel's split)",
                       result={f"{b} on {p}": chunk_sizes(b, p) for b, p in SPLITS})]

    torch.manual_seed(0)
    model = resnet18().eval()
    emulated = []
    for batch, parts in [(80, 3), (128, 3), (128, 2)]:
        emulated.append(observation(f"c6.cpu.bn_eval.batch{batch}_split{parts}",
                                    f"CPU emulation, BatchNorm eval: batch {batch} as {parts} chunks",
                                    **emulate(model, *_batch(batch), parts)))
    bn_train = emulate(model.train(), *_batch(80), 3)
    obs += emulated
    obs.append(observation("c6.cpu.bn_train.batch80_split3",
                           "CPU emulation, BatchNorm train (per-chunk statistics): batch 80 as 3 chunks", **bn_train))

    parts_not_run, gpu_obs = [], []
    if n >= 2:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False  # fp32 noise only
        gpu_model = resnet18().cuda().eval()
        # (3, 2) is the article's own split (2 + 1); (128, 2) the even control
        for batch, gpus in [(3, 2), (128, 2), (128, 3), (80, 3)]:
            if gpus <= n:
                gpu_obs.append(observation(f"c6.gpu.bn_eval.batch{batch}_on{gpus}",
                                           f"DataParallel first step, batch {batch} on {gpus} GPUs, BatchNorm eval",
                                           **dataparallel_first_step(gpu_model, batch, gpus)))
            else:
                parts_not_run.append(f"DataParallel gradients, batch {batch} on {gpus} GPUs: {needs(gpus, n)}")
    else:
        parts_not_run.append(f"DataParallel gradients vs single: {needs(3, n)} (2 for the even control)")
    obs += gpu_obs

    arithmetic_ok = (arith["one device mean"]["value"] == 0.4333
                     and arith["mean of per-device means"]["value"] == 0.525
                     and arith["sum / N"]["value"] == 0.4333)
    uneven = [e for e in emulated if len(set(e.get("chunks"))) > 1]
    bias_shown = all(biased(e.get("grad_rel_diff_mean_of_means"), e.get("grad_rel_diff_sum_over_n")) for e in uneven)
    uneven_gpu = [g for g in gpu_obs if len(set(g.get("chunks"))) > 1]
    bias_shown &= all(biased(g.get("grad_rel_diff_dp_mean_vs_single"), g.get("grad_rel_diff_dp_sum_vs_single"))
                      for g in uneven_gpu)
    verdict = CONFIRMED if arithmetic_ok and bias_shown else (NUANCE if arithmetic_ok or bias_shown else REFUTED)
    return record("C6", obs, verdict, parts_not_run=parts_not_run)
