"""An option set in words, the way the summary's and the figures' labels say it."""
from __future__ import annotations

import pytest

from dpbench.report.option_words import describe


@pytest.mark.parametrize("options, kwargs, words", [
    ({"channels_last": True, "global_batch": 1024, "precision": "bf16"}, {}, "bf16 + channels_last, batch 1024"),
    ("channels_last=True,global_batch=1024,precision=bf16", {}, "bf16 + channels_last, batch 1024"),
    ({}, dict(precision="fp32", global_batch=512), "fp32, batch 512"),
    ({"per_gpu_batch": 256}, dict(precision="fp32", global_batch=1024, per_gpu_batch=256, scaling="weak"),
     "fp32, 256 per GPU"),
    ({"global_batch": 128, "batchnorm": "eval", "max_steps": 30}, {}, "BatchNorm eval, 30 steps, batch 128"),
    ({"cudnn_benchmark": True, "compile": "max-autotune"}, {}, "compile max-autotune, cudnn.benchmark on"),
    ({"static_graph": True}, {}, "static graph on"),
])
def test_option_sets_in_words(options, kwargs, words):
    assert describe(options, **kwargs) == words
