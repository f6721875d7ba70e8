"""The expected throughput ranking of the setups, from the probe's step time at one rank and the
traffic model's bytes per step. Torch-free.

The rule, per setup at its per-GPU batch b on N GPUs (k micro-batches):

    compute  = k * t0 + t1 * b            the probe's step time at one rank, t0 + t1 * batch,
                                          fitted through its two batches (checkpointing: t1 * 4/3,
                                          the forward recomputed)
    traffic  = wire bytes per step / link bandwidth   (analysis.traffic_model; nothing overlaps)
    offload  + 2 * parameter bytes / host bandwidth   (the shard to the device and the gradient back)
    samples/s = N * b / (compute + traffic [+ offload])

Nothing overlapping makes the traffic term an upper bound on what it costs; the ranking sorts
by samples/s, a setup that does not fit last.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dpbench.advise.predict import ProbeFacts, Setup, setting
from dpbench.analysis.memory_model import BF16_BYTES
from dpbench.analysis.traffic_model import predicted_traffic

LINK_GBS = 100.0     # GPU-to-GPU bus bandwidth per GPU, GB/s (NVLink-class; PCIe 4.0 x16: ~20)
HOST_GBS = 20.0      # host-device bandwidth, GB/s (PCIe 4.0 x16)
RECOMPUTE = 4 / 3    # a checkpointed step computes the forward twice: ~4/3 of forward + backward
# Below this share of the probe's larger step growing with the batch, the step is mostly fixed cost
# (the host's): on one H200 ResNet18 probed at 32 and 128 grew 7.2 -> 8.7 ms (23%), and its
# samples/s came out 2.6x the measured; the 1.07B LM (86%) within 5%.
SCALING_SHARE = 0.5


@dataclass(frozen=True)
class Speed:
    setup: Setup
    batch: int
    compute_s: float
    traffic_s: float
    offload_s: float
    wire_bytes: float

    @property
    def step_s(self) -> float:
        return self.compute_s + self.traffic_s + self.offload_s

    def samples_per_s(self, gpus: int) -> float:
        return gpus * self.batch / self.step_s if self.step_s > 0 else 0.0


def step_line(facts: ProbeFacts) -> tuple[float, float] | None:
    """(t0, t1): the probe's step time in seconds as t0 + t1 * batch; None without timings."""
    if not facts.step_s:
        return None
    (b1, b2), (s1, s2) = facts.batches, facts.step_s
    t1 = max(0.0, (s2 - s1) / (b2 - b1)) if b2 != b1 else s2 / b2
    return max(0.0, s2 - t1 * b2), t1


def scaling_share(facts: ProbeFacts) -> float | None:
    """The share of the probe's step at its larger batch that grows with the batch (t1 * b2 / s2);
    None without timings."""
    line = step_line(facts)
    if line is None or not facts.step_s[1]:
        return None
    return line[1] * facts.batches[1] / facts.step_s[1]


def speed(facts: ProbeFacts, setup: Setup, gpus: int, batch: int, gpus_per_node: int | None = None,
          link_gbs: float = LINK_GBS, host_gbs: float = HOST_GBS) -> Speed | None:
    """The rule above for one setup; None without the probe's timings or a batch."""
    line = step_line(facts)
    if line is None or batch < 1:
        return None
    t0, t1 = line
    compute = setup.accumulate * t0 + t1 * batch * (RECOMPUTE if setup.checkpoint else 1.0)
    s = setting(facts, setup, gpus, gpus_per_node)
    gather = BF16_BYTES if s.compute_bytes == BF16_BYTES else s.param_bytes
    traffic = predicted_traffic(setup.variant, s.parameters, gpus, reduce_bytes=s.param_bytes, gather_bytes=gather,
                                reshard_after_forward=setup.reshard_after_forward,
                                shard_size=s.shard_size if setup.variant == "hsdp" else None,
                                accumulate=setup.accumulate)
    wire = sum(t["wire"] for t in traffic.values())
    offload = 2 * s.param_bytes * s.parameters / s.shard_size / (host_gbs * 1e9) if setup.offload else 0.0
    return Speed(setup, batch, compute, wire / (link_gbs * 1e9), offload, wire)


def ranking(speeds: dict[str, Speed | None], fits: dict[str, bool], gpus: int) -> list[str]:
    """Setup names, fastest first, setups within 1% of each other's speed in the given order
    (the simpler first); those that do not fit, or have no speed, last."""
    rate = {n: (sp.samples_per_s(gpus) if sp else 0.0) for n, sp in speeds.items()}
    best = max((r for n, r in rate.items() if fits.get(n)), default=0.0) or 1.0
    return sorted(speeds, key=lambda n: (0 if fits.get(n) else 1, math.floor(100 * (1 - rate[n] / best))))
