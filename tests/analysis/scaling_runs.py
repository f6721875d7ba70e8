"""A small result set of single and ddp runs at strong and weak scaling, for the cell table's tests."""
from __future__ import annotations

from dpbench import results

FP32 = {"global_batch": 512}
FP32_1K = {"global_batch": 1024}
BF16_1K = {"global_batch": 1024, "precision": "bf16", "channels_last": True}
BF16 = {"global_batch": 512, "precision": "bf16", "channels_last": True}

# single at 512: median 1000; single at 1024: median 1900; bf16 single at 512: median 3000.
SPEC = [
    dict(variant="single", options=FP32, images_per_s=[990.0, 1000.0, 1010.0]),
    dict(variant="single", options=FP32_1K, images_per_s=[1880.0, 1920.0]),
    dict(variant="ddp", gpus=2, options=FP32, images_per_s=[1700.0, 1800.0]),
    dict(variant="ddp", gpus=2, options=FP32_1K, images_per_s=[3500.0, 3700.0]),
    dict(variant="single", options=BF16, images_per_s=[3000.0]),
    dict(variant="ddp", gpus=2, options=BF16_1K, images_per_s=[5000.0, 5200.0]),
    dict(variant="single", per_gpu_batch=256, options={"per_gpu_batch": 256},
         images_per_s=[500.0, 520.0]),
    dict(variant="ddp", gpus=4, per_gpu_batch=256, options={"per_gpu_batch": 256},
         images_per_s=[1800.0, 1840.0]),
    dict(variant="ddp", gpus=4, options=FP32, repeat=0, status="skipped", images_per_s=None,
         reason="needs 4 GPUs, 2 visible"),
]


def cell(table, variant, gpus, options):
    """The one row of a cell table for (variant, gpus, options)."""
    rows = table[(table["variant"] == variant) & (table["gpus"] == gpus)
                 & (table["options"] == results.options_label(options))]
    assert len(rows) == 1, rows
    return rows.iloc[0]
