"""The step benchmarks' cases (tests/benchmarks/test_step.py): each variant under each recipe,
its variant, optimizer and memory format built as the engine builds a run's."""
from __future__ import annotations

import torch

from dpbench import VARIANTS
from dpbench.plan.config import RunConfig
from dpbench.plan.variants.settings import DDPSettings
from dpbench.run.variants import Variant
from dpbench.workloads.resnet import resnet18

BATCH = 512
RECIPES = {
    "fp32": {"bf16": False, "channels_last": False, "ddp": {}},
    "bf16_cl": {"bf16": True, "channels_last": True, "ddp": {}},
    "bf16_cl_views": {"bf16": True, "channels_last": True,
                      "ddp": {"gradient_as_bucket_view": True, "static_graph": True}},
}
CASES = [(v, r) for v in VARIANTS for r in RECIPES if r != "bf16_cl_views" or v == "ddp"]


def build(name: str, recipe: str, devices: list[torch.device]):
    """A case's variant, optimizer and memory format, wrapped as the engine wraps them: dp's
    replica threads are told the autocast dtype (on two GPUs or more they would compute in
    float16 otherwise)."""
    spec = RECIPES[recipe]
    torch.manual_seed(0)
    memory_format = torch.channels_last if spec["channels_last"] else torch.contiguous_format
    model = resnet18().to(devices[0]).to(memory_format=memory_format)
    ddp = RunConfig(variant="ddp", **spec["ddp"]).variant_settings(DDPSettings) if name == "ddp" else None
    variant = Variant(name, model, devices, 1, ddp,
                      autocast_dtype=torch.bfloat16 if spec["bf16"] else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    return variant, opt, memory_format
