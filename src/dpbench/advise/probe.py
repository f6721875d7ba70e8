"""The short measured probe of a workload on the machine at hand: one rank (`single`, no
process group), dpbench's own pieces (engine.build_workload, Variant, make_optimizer,
components.profiled_step, step.train_step), at two per-rank batches: the activation peak at
each (CUDA: the allocator's peak less the forward's start; CPU: the bytes saved for the
backward, counted), the same with checkpointed shard units where the workload names them, the
optimizer step's temporaries, the allocator's and the CUDA context's share, and the step time;
and, in a child process meanwhile (advise.process_group_probe), NCCL's own memory at one rank.
"""
from __future__ import annotations

import gc
import time
from contextlib import nullcontext
from typing import Any

import torch

from dpbench.advise import process_group_probe
from dpbench.advise.predict import ProbeFacts
from dpbench.analysis.memory_model import (CONTEXT_BYTES, MIB, Setting, measured_state, optimizer_slots,
                                           predicted_bytes)
from dpbench.host.nvml import nvml_process_mib
from dpbench.plan.config import RunConfig
from dpbench.run import components, engine, sharded
from dpbench.run.knobs import unit_modules
from dpbench.run.step import train_step
from dpbench.run.variants import Variant
from dpbench.workloads.calls import map_tensors

TIMED_STEPS = 3


def _config(workload: Any, precision: str, device: torch.device) -> RunConfig:
    return RunConfig.from_dict({"variant": "single", "workload": workload, "precision": precision,
                                "device": device.type, "dataset": "synthetic"})


class _Rank:
    """One rank's model, variant and optimizer, built as a run builds them."""

    def __init__(self, cfg: RunConfig, device: torch.device, checkpoint: bool):
        self.spec = engine.build_workload(cfg, device)
        model = self.spec.model.to(device).train()
        self.sizes = self.spec.sizes()
        self.units = unit_modules(model, self.spec.shard_modules)
        self.largest_unit = components.largest_unit_bytes([*self.units, model]) if self.units else None
        self.variant = Variant("single", model, [device], 1, loss=self.spec.loss, output=self.spec.output,
                               shard=sharded.ShardOptions(self.spec.shard_modules, checkpoint=checkpoint))
        self.opt = sharded.make_optimizer("single", model.parameters(), cfg.lr, cfg.momentum, cfg.weight_decay, False)
        bf16 = cfg.precision == "bf16"
        self.autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else nullcontext
        self.gen, self.device = torch.Generator().manual_seed(cfg.seed), device

    def batch(self, n: int):
        x, y = self.spec.batch(self.gen, n)
        return map_tensors(x, lambda t: t.to(self.device)), y.to(self.device)

    def profiled(self, n: int) -> dict[str, Any]:
        """A warm step, then the profiled step at batch n: its memory row, with the bytes saved
        for the backward counted (the CPU's activations)."""
        x, y = self.batch(n)
        train_step(self.variant, self.opt, x, y, n, self.autocast)      # the momentum exists from here
        step_probe = components.StepProbe()
        with components.SavedActivations([]) as saved:
            _, row, _ = components.profiled_step(self.variant, self.opt, x, y, n, self.autocast, False,
                                                 probe=step_probe)
        # with checkpointed units the profiled step counts with hooks of its own, inside ours
        row["saved_mib"] = (step_probe.saved or saved).total / MIB
        if self.device.type == "cuda":
            row["nvml_process_mib"] = nvml_process_mib()
        return row

    def step_s(self, n: int) -> float:
        x, y = self.batch(n)
        cuda = self.device.type == "cuda"
        train_step(self.variant, self.opt, x, y, n, self.autocast)
        if cuda:
            torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        for _ in range(TIMED_STEPS):
            train_step(self.variant, self.opt, x, y, n, self.autocast)
        if cuda:
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - started) / TIMED_STEPS


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def activations(row: dict[str, Any]) -> float:
    """The activation peak the allocator saw (CUDA), else the bytes saved for the backward (CPU)."""
    return row["activation_peak_mib"] if row.get("activation_peak_mib") is not None else row["saved_mib"]


def probe(workload: Any, precision: str = "fp32", batches: tuple[int, int] = (2, 8),
          device: torch.device | None = None, timed: bool = True) -> ProbeFacts:
    """ProbeFacts of `workload` at one rank on `device` (CUDA where visible, else the CPU)."""
    if device is None:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # NCCL's memory, measured in a child while this process probes; waited for before the timed steps
    with process_group_probe.start(device.type, device.index or 0) as group:
        cfg = _config(workload, precision, device)
        engine.set_numerics(cfg)   # TF32 as a run sets it: without it an fp32 probe times other kernels
        rank = _Rank(cfg, device, checkpoint=False)
        rows = [rank.profiled(b) for b in batches]
        nccl = group.result()
    b1, b2 = batches
    times = (rank.step_s(b1), rank.step_s(b2)) if timed else None
    sizes, units, largest = rank.sizes, bool(rank.units), rank.largest_unit
    del rank
    _release(device)
    ck_rows = None
    if units:
        ck = _Rank(cfg, device, checkpoint=True)
        ck_rows = [ck.profiled(b) for b in batches]
        del ck
        _release(device)
    P = int(sizes["parameters"])
    slots = optimizer_slots(cfg.to_dict())
    modelled = float(predicted_bytes(Setting("single", P, sizes["parameter_bytes"] / P, slots))["state"] or 0) / MIB
    last = rows[-1]
    cuda = device.type == "cuda"
    start = measured_state(last) if cuda else None
    nvml = last.get("nvml_process_mib")
    allocated_peak = max(last[f"{p}_peak_mib"] for p in ("forward", "backward", "step")) if cuda else None
    return ProbeFacts(
        workload=str(workload), parameters=P, param_bytes=sizes["parameter_bytes"] / P, largest_unit_bytes=largest,
        batches=(b1, b2), activation_mib=(activations(rows[0]), activations(rows[1])),
        checkpoint_activation_mib=(activations(ck_rows[0]), activations(ck_rows[1])) if ck_rows else None,
        fixed_mib=max(0.0, start - modelled) if start is not None else 0.0,
        step_extra_mib=max(0.0, last["step_peak_mib"] - start) if start is not None else 0.0,
        reserved_extra_mib=last["reserved_peak_mib"] - allocated_peak if cuda else 0.0,
        context_mib=nvml - last["reserved_peak_mib"] if cuda and nvml else CONTEXT_BYTES / MIB,
        step_s=times, device=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else "cpu",
        precision=precision, optimizer_slots=slots,
        process_group_mib=float(nccl["process_group_mib"]), process_group=nccl,
        measured={"rows": rows, "checkpoint_rows": ck_rows, "modelled_state_mib": modelled})
