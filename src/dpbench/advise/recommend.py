"""The advice: one row per setup (predicted memory per GPU, largest per-GPU batch, expected
samples/s, rank), the recommended setup, and one sentence with its reasons; or, where no
setup fits one sample, what would. Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dpbench.advise.predict import GIB, ProbeFacts, Setup, largest_batch, predict, setups, what_would_fit
from dpbench.advise.rank import LINK_GBS, SCALING_SHARE, ranking, scaling_share, speed
from dpbench.analysis.memory_model import MIB

COLUMNS = ["rank", "setup", "fits", "batch", "allocated_gib", "reserved_gib", "nvml_gib", "largest_batch",
           "samples_per_s", "wire_gib_per_step"]
# The share of the card the advice leaves unplanned: what the prediction misses. On one H200
# (results/reference/h200-advise-032c2c6) every one-GPU check run at the edge batch (the
# prediction's last that fits) ran out of memory: ResNet18, ViT-S/16 and the 1.07B LM's ddp;
# where a run fitted, its reserved and NVML memory came out 1.6-5.7% above the prediction, and
# the published p90 of the reserved error is about 9%.
HEADROOM = 0.10


@dataclass
class Advice:
    workload: str
    gpus: int
    gpu_memory_gib: float
    batch: int | None
    rows: list[dict[str, Any]]
    chosen: str | None
    sentence: str
    misfit: dict[str, Any] | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    headroom: float = HEADROOM
    scaling_share: float | None = None   # of the probe's larger step, what grows with the batch (rank)


def accumulation(facts: ProbeFacts, gpus: int, batch: int, limit_mib: float, gpus_per_node: int | None) -> int:
    """The fewest micro-batches (dividing the batch) with which ddp fits `batch`; 1 where it
    fits whole or where no micro-batch fits."""
    micro = largest_batch(facts, Setup("ddp"), gpus, limit_mib, gpus_per_node=gpus_per_node)
    if micro >= batch or micro < 1:
        return 1
    k = math.ceil(batch / micro)
    while batch % k:
        k += 1
    return k


def advise(facts: ProbeFacts, gpus: int, gpu_memory_gib: float, batch: int | None = None,
           gpus_per_node: int | None = None, link_gbs: float = LINK_GBS, headroom: float = HEADROOM) -> Advice:
    """Every setup predicted at the asked per-GPU batch (else at the largest batch that leaves
    `headroom` of the card), ranked. largest_batch is the prediction's edge (the whole card)."""
    card = gpu_memory_gib * GIB / MIB
    limit = card * (1.0 - headroom)   # what the advice plans to fill
    k = accumulation(facts, gpus, batch, limit, gpus_per_node) if batch else 1
    candidates = setups(facts.checkpoint_activation_mib is not None, k)
    if gpus < 2:   # one GPU: nothing to shard, the sharded variants are ddp's twins at best
        candidates = [s for s in candidates if s.variant in ("ddp", "fsdp") and s.reshard_after_forward]
    rows, speeds, fits = {}, {}, {}
    for s in candidates:
        largest = largest_batch(facts, s, gpus, limit, gpus_per_node=gpus_per_node)
        edge = largest_batch(facts, s, gpus, card, gpus_per_node=gpus_per_node)
        at = batch or largest
        fits[s.name] = largest >= (batch or 1)
        p = predict(facts, s, gpus, max(at, s.accumulate), gpus_per_node)
        sp = speed(facts, s, gpus, at, gpus_per_node, link_gbs) if at else None
        speeds[s.name] = sp
        rows[s.name] = {"setup": s.name, "fits": fits[s.name], "batch": at, "allocated_gib": p.allocated_mib * MIB / GIB,
                        "reserved_gib": p.reserved_mib * MIB / GIB, "nvml_gib": p.nvml_mib * MIB / GIB,
                        "largest_batch": edge,
                        "samples_per_s": sp.samples_per_s(gpus) if sp else None,
                        "wire_gib_per_step": (sp.wire_bytes / GIB) if sp else None, "options": s.run_options()}
    order = ranking(speeds, fits, gpus)
    table = [dict(rows[name], rank=i + 1) for i, name in enumerate(order)]
    chosen = order[0] if fits[order[0]] else None
    advice = Advice(str(facts.workload), gpus, gpu_memory_gib, batch, table, chosen, "", facts=facts.__dict__,
                    headroom=headroom, scaling_share=scaling_share(facts))
    if chosen is None:
        advice.misfit = what_would_fit(facts, gpus, limit, gpus_per_node)
    advice.sentence = sentence(advice)
    return advice


def sentence(a: Advice) -> str:
    """The recommendation in one sentence, with its reasons (or why nothing fits, and what would)."""
    if a.chosen is None:
        m = a.misfit or {}
        ways = []
        if m.get("bf16_fits"):
            ways.append(f"2 bytes per parameter (bf16 weights: {m['bf16_need_mib'] / 1024:.1f} GiB)")
        if m.get("gpus_needed"):
            ways.append(f"{m['gpus_needed']} GPUs fully sharded")
        if m.get("offload_fits"):
            ways.append(f"fsdp with offload ({m['offload_need_mib'] / 1024:.1f} GiB)")
        what = "; would fit with " + ", or ".join(ways) if ways else "; nothing advise knows would fit"
        at = f" at per-GPU batch {a.batch}" if a.batch else ""
        return (f"No setup fits{at} on {a.gpus} GPU(s) of {a.gpu_memory_gib:g} GiB: the leanest ({m.get('setup')}) "
                f"needs {m.get('need_mib', 0) / 1024:.1f} GiB per GPU at batch 1{what}.")
    top = next(r for r in a.rows if r["setup"] == a.chosen)
    runner = next((r for r in a.rows if r["setup"] != a.chosen and r["fits"]), None)
    left = f", {a.headroom:.0%} of the card left for what the prediction misses" if a.headroom else ""
    why = [f"it fits ({top['nvml_gib']:.1f} of {a.gpu_memory_gib:g} GiB per GPU at batch {top['batch']}{left}; "
           f"largest batch {top['largest_batch']})"]
    if top["samples_per_s"] and runner and runner["samples_per_s"]:
        why.append(f"is predicted fastest ({top['samples_per_s']:.0f} samples/s, "
                   f"{top['samples_per_s'] / runner['samples_per_s']:.2f}x the runner-up {runner['setup']})")
    elif runner:
        why.append(f"the runner-up is {runner['setup']}")
    text = f"Use {a.chosen} on {a.gpus} GPU(s): " + " and ".join(why) + "."
    share = a.scaling_share
    if share is not None and share < SCALING_SHARE and top["samples_per_s"]:
        b = a.facts.get("batches") or ("?", "?")
        text += (f" The probe's step barely grew with its batch ({share:.0%} of it at batch {b[1]} scales with the "
                 f"batch): the host set it, so the samples/s are upper bounds; --probe-batches where the GPU sets "
                 f"the step would rank more truly.")
    return text


def table_rows(a: Advice) -> list[list[Any]]:
    """The table's cells in COLUMNS order, rounded for reading."""
    def r(v: Any, nd: int = 2) -> Any:
        return round(v, nd) if isinstance(v, float) else v
    return [[r(row[c], 0 if c == "samples_per_s" else 3 if c == "wire_gib_per_step" else 2) for c in COLUMNS]
            for row in a.rows]

