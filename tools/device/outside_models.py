"""Workload factories for models nobody here wrote, built from configs (no download): the
fidelity benchmark's outside-library cells. Used as `tools/device/outside_models.py:vit_small`."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dpbench.workloads.spec import WorkloadSpec


def vit_small(image: int = 224, num_classes: int = 1000):
    """timm's ViT-S/16 from its config, random weights."""
    import timm
    from timm.models.vision_transformer import Block

    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=num_classes, img_size=image)

    def batch(gen: torch.Generator, n: int):
        return (torch.randn(n, 3, image, image, generator=gen),
                torch.randint(0, num_classes, (n,), generator=gen))

    return WorkloadSpec(model=model, loss=lambda out, y: F.cross_entropy(out, y, reduction="none"),
                        batch=batch, shard_modules=(Block,), flops_per_sample=3 * 4.6e9)
