"""The step breakdown's kernel table holds kernels: the record_function ranges the profiler also
puts on the GPU's timeline (an optimizer's step, dpbench's phases) span kernels and would count
them twice (seen in the H200 bisect report: `Optimizer.step#SGD.step` listed as a kernel)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from dpbench.run.step_breakdown import summarise

CUDA, CPU = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU


def event(name, device, start, end, annotation=False):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end),
                           is_user_annotation=annotation)


def test_gpu_annotations_are_not_counted_as_kernels():
    events = [event("dpbench::forward", CPU, 0, 1000),
              event("gemm", CUDA, 100, 400), event("spin_kernel", CUDA, 500, 960),
              event("Optimizer.step#SGD.step", CUDA, 450, 990, annotation=True),
              event("dpbench::forward", CUDA, 0, 1000, annotation=True)]
    got = summarise(events, cuda=True, steps=1)
    assert got["kernels_ms"] == {"spin_kernel": 0.46, "gemm": 0.3}
    assert got["comm_ms"] == 0.0
