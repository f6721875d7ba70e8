"""The default workload, `resnet18-cifar10`: dpbench.run.model's ResNet18 on 32x32 images, real
CIFAR-10 (the engine's loader) or synthetic images here."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dpbench.run.model import BasicBlock, resnet18
from dpbench.workloads.spec import WorkloadSpec

LABELS = 10   # CIFAR-10's labels are 0..9 however wide the output layer is


def per_sample_cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def build(num_classes: int = 10) -> WorkloadSpec:
    def batch(generator: torch.Generator, n: int):
        return (torch.randn(n, 3, 32, 32, generator=generator),
                torch.randint(0, min(LABELS, num_classes), (n,), generator=generator))

    return WorkloadSpec(model=resnet18(num_classes), loss=per_sample_cross_entropy, batch=batch,
                        dataset="cifar10", shard_modules=(BasicBlock,))
