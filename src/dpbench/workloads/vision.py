"""The `torchvision` workload: a torchvision classification model by name (`model: resnet50`),
untrained (weights=None: nothing is ever downloaded), on synthetic images at `resolution`."""
from __future__ import annotations

import torch
import torchvision.models as tvm

from dpbench.workloads.resnet_cifar import per_sample_cross_entropy
from dpbench.workloads.spec import WorkloadSpec

# The residual or transformer blocks of torchvision's families: what a sharded variant wraps.
BLOCKS = (tvm.resnet.BasicBlock, tvm.resnet.Bottleneck, tvm.vision_transformer.EncoderBlock,
          tvm.convnext.CNBlock, tvm.swin_transformer.SwinTransformerBlock,
          tvm.efficientnet.MBConv, tvm.efficientnet.FusedMBConv)
AUX_LOGITS = ("googlenet", "inception_v3")


def build(model: str = "resnet50", resolution: int = 224, num_classes: int = 1000) -> WorkloadSpec:
    # googlenet and inception_v3 return their auxiliary heads' logits too while training
    extra = {"aux_logits": False} if model in AUX_LOGITS else {}
    net = tvm.get_model(model, weights=None, num_classes=num_classes, **extra)
    present = {type(m) for m in net.modules()}

    def batch(generator: torch.Generator, n: int):
        return (torch.randn(n, 3, resolution, resolution, generator=generator),
                torch.randint(0, num_classes, (n,), generator=generator))

    return WorkloadSpec(model=net, loss=per_sample_cross_entropy, batch=batch,
                        shard_modules=tuple(b for b in BLOCKS if b in present))
