"""The record as the engine fills it: results.record.Record with what only the engine measures
(the timed steps, the start-up phases, the dataset's facts, what torch knows about the devices)."""
from __future__ import annotations

from pathlib import Path

from dpbench.plan.config import RunConfig
from dpbench.results.record import Record
from dpbench.run import device_facts, measure, provenance
from dpbench.run.context import uses_cuda
from dpbench.run.runlog import since_launch
from dpbench.workloads import registry


class Measured(Record):
    """The record as the engine fills it (results.record.Record), with what only the engine
    measures: the timed steps, the dataset's facts and what torch knows about the devices."""

    def __init__(self, cfg: RunConfig, out: Path):
        super().__init__(cfg, out, "cuda" if uses_cuda(cfg) else "cpu")
        self.timed_ms: list[float] = []
        self.timed_batches: list[int] = []
        self.host_ms: list[float] = []   # warm-up steps issued from an idle device: the host's own time
        self.dataset: dict | None = None
        self.compile_s: float | None = None
        self.unit, self.units_per_sample = "images", 1   # the workload's, once it is built
        self.workload = registry.describe(cfg.workload)

    def workload_sizes(self, spec) -> None:
        """The built workload's sizes (a forward of one sample counts its FLOPs if the factory
        did not give them) and the unit its throughput counts."""
        sizes = spec.sizes()
        self.unit, self.units_per_sample = spec.sample_unit, spec.units_per_sample
        self.sizes = {"parameters": sizes["parameters"], "param_bytes": sizes["parameter_bytes"],
                      "flops_per_sample": sizes["flops_per_sample"], "sample_unit": spec.sample_unit}

    def phase_done(self, phase: str) -> None:
        """Mark the end of a start-up phase (results.STARTUP_PHASES), in seconds since the launch."""
        if (t := since_launch()) is not None:
            self.startup[phase] = round(t, 3)

    def write(self, status: str, reason: str = "") -> dict:   # type: ignore[override]
        return super().write(
            status, reason, launch=provenance.launch_facts(self.hosts),
            provenance=device_facts.collect(self.dataset, self.cfg),
            throughput=dict(measure.throughput(self.timed_ms, self.timed_batches, self.unit,
                                                self.units_per_sample, self.host_ms), compile_s=self.compile_s))
