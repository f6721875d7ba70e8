"""C5: a module that returns a scalar loss under DataParallel: warning text, count, shape."""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE
from dpbench.claims.common import gpus_visible, needs, record, run_python
from dpbench.claims.records import ProbeRecord
from dpbench.claims.records import obs as observation

ARTICLE_TEXT = ("Was asked to gather along dimension 0, but all input tensors were scalars; "
                "will instead unsqueeze and return a vector.")
STEPS = 5


class LossNet(nn.Module):
    """Returns the mean cross-entropy of its chunk: a 0-dim tensor per replica."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


# Counts the warnings Python actually shows over STEPS training steps under a given filter.
_COUNT = """
import json, sys, warnings, torch, torch.nn as nn
from dpbench.claims.c5.probe import LossNet, STEPS
{filter}
shown = []
warnings.showwarning = lambda msg, cat, fn, ln, *a: "gather" in str(msg) and shown.append(f"{{fn}}:{{ln}}")
net = nn.DataParallel(LossNet().cuda())
for _ in range(STEPS):
    net(torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))).mean().backward()
print(json.dumps({{"shown": len(shown), "locations": sorted(set(shown))}}))
"""


def call(ids: list[int] | None, batch: int) -> dict:
    """One forward: returned shape and the warnings raised (all recorded)."""
    model = LossNet().to("cuda:0" if ids else "cpu")
    net = nn.DataParallel(model, device_ids=ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = net(torch.randn(batch, 3, 8, 8), torch.randint(0, 10, (batch,)))
    texts = [str(w.message) for w in caught]
    return {"device_ids": net.device_ids, "batch": batch, "shape": list(out.shape),
            "chunks_by_torch_chunk": len(torch.empty(batch).chunk(max(len(net.device_ids), 1))),
            "warnings": texts, "exact_article_text": ARTICLE_TEXT in texts}


def run() -> ProbeRecord:
    n = gpus_visible()
    obs = []
    if n == 0:
        obs.append(observation("c5.cpu_path", "CPU path (no CUDA): DataParallel calls the module directly",
                               **call(None, 8)))
        return record("C5", obs, NOT_RUN, not_run=needs(2, n))
    one = observation("c5.one_gpu", "device_ids=[0] (the path taken with one visible GPU)", **call([0], 8))
    obs.append(one)
    if n < 2:
        return record("C5", obs, NOT_RUN, not_run=needs(2, n))
    everyone = observation("c5.all_gpus", f"all {n} GPUs, batch 8 * n", **call(list(range(n)), 8 * n))
    obs.append(everyone)
    for batch in sorted({1, n - 1, n + 1} - {0}):  # fewer samples than GPUs, or an odd remainder
        obs.append(observation(f"c5.all_gpus.batch{batch}", f"all {n} GPUs, batch {batch}",
                               **call(list(range(n)), batch)))
    for key, name, flt in [("default_filters", "default filters", ""),
                           ("always", "simplefilter('always')", "warnings.simplefilter('always')")]:
        counted = run_python(_COUNT.format(filter=flt))
        obs.append(observation(f"c5.shown.{key}", f"warnings shown over {STEPS} steps, {name}", **counted,
                               steps=STEPS, per_step=counted.get("shown", 0) / STEPS))

    text_ok = everyone.get("exact_article_text") and not one.get("warnings")
    shapes_ok = everyone.get("shape") == [n] and one.get("shape") == []
    verdict = CONFIRMED if text_ok and shapes_ok else NUANCE
    return record("C5", obs, verdict)
