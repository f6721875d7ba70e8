"""The one writer of a run's metrics.json (torch-free): its fields, their assembly, the write.

The engine fills a `Record` as it trains and writes it at the end (or as far as it got); the
launcher writes skipped runs, and the failed record of a DDP launch whose ranks wrote none,
without importing torch. Either way the layout is `record_fields`'s, in format FORMAT.
"""
from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpbench.results import METRICS, STEPS
from dpbench.results.files import write_csv, write_json
from dpbench.results.formats import FORMAT, NO_THROUGHPUT, WORKLOAD_SIZES, plain_workload
from dpbench.results.identity import Identity, identity_of, run_id
from dpbench.results.schema import STEP_COLUMNS

if TYPE_CHECKING:
    from dpbench.plan.config import RunConfig


def planned_identity(cfg: "RunConfig", out: Path | str) -> Identity:
    """The run's identity as its plan decided it (the launcher's copy in the run folder); a run
    launched without a plan (a test, a user's `dpbench.run.launch --config`) gets the one its
    settings would have in a plan (identity.identity_of)."""
    copied = Identity.read(out)
    if copied is not None:
        return copied
    return identity_of(run_id(cfg.variant, cfg.gpus, cfg.repeat, cfg.options), cfg.to_dict())


def record_fields(cfg: "RunConfig", identity: Identity, status: str, reason: str, *, device_type: str,
                  launch: dict[str, Any],
                  provenance: dict[str, Any], throughput: dict[str, Any] | None = None,
                  memory: list[dict[str, Any]] | None = None, warnings: list[dict[str, Any]] | None = None,
                  accuracy: list[dict[str, Any]] | None = None, final_loss: float | None = None,
                  steps: int = 0, wall_s: float = 0.0, start_s: float | None = None,
                  startup: dict[str, float] | None = None, workload: dict[str, Any] | None = None,
                  sizes: dict[str, Any] | None = None, memory_components: list[dict[str, Any]] | None = None,
                  collectives: list[dict[str, Any]] | None = None,
                  mechanisms: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A run's metrics.json: the one layout, for the engine's records (measurements given) and
    the launcher's skipped ones (none), with the `identity` the plan gave the run. workload: registry.describe() of the run's workload
    (without it, its name and args from the config); sizes: WORKLOAD_SIZES of the built one.
    memory_components (a row per rank) and collectives (rank 0's, one profiled step): empty
    where the run measured none (docs/records.md); upgrade() gives older records empty ones.
    mechanisms: rank 0's verdict on each knob the run turned (run.mechanisms), [] where none."""
    return {
        "format": FORMAT,
        **identity.to_dict(),   # the plan's run_id, cell_id, setup_id and group, copied
        "status": status, "reason": reason,
        "variant": cfg.variant, "gpus": cfg.gpus, "repeat": cfg.repeat, "options": cfg.options,
        "seed": cfg.seed, "deterministic": cfg.deterministic, "scaling": cfg.scaling,
        "per_gpu_batch": cfg.global_batch / cfg.gpus,
        "config": cfg.to_dict(), "device_type": device_type, "launch": launch,
        "throughput": dict(throughput or NO_THROUGHPUT),
        "memory": memory or [], "warnings": warnings or [], "accuracy": accuracy or [],
        "final_loss": final_loss, "steps": steps, "wall_s": wall_s, "start_s": start_s,
        "startup": dict(startup or {}), "provenance": provenance,
        "workload": workload or plain_workload(cfg.workload),
        **{key: (sizes or {}).get(key) for key in WORKLOAD_SIZES},
        "memory_components": memory_components or [], "collectives": collectives or [],
        "mechanisms": mechanisms or [],
    }


def write_record(out: Path | str, fields: dict[str, Any], steps: list[dict[str, Any]] | None = None) -> None:
    """The run's steps.csv (when it took steps), then its metrics.json, atomically and last: a
    run folder with a metrics.json is a finished run."""
    out = Path(out)
    if steps:
        write_csv(out / STEPS, STEP_COLUMNS, steps)
    write_json(out / METRICS, fields)


class Record:
    """Everything measured so far; written whole at the end, or as far as it got on failure.
    `started`: the perf_counter the run's wall time counts from (now, unless given)."""

    def __init__(self, cfg: "RunConfig", out: Path | str, device_type: str, started: float | None = None):
        self.cfg, self.out, self.device_type = cfg, Path(out), device_type
        self.started = time.perf_counter() if started is None else started
        self.steps: list[dict[str, Any]] = []
        self.accuracy: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.warnings: list[dict[str, Any]] = []
        self.hosts: list[str] = [socket.gethostname()]
        self.start_s: float | None = None            # from the launch to the first training step
        self.startup: dict[str, float] = {}          # phase -> seconds since the launch when it ended
        self.workload: dict[str, Any] | None = None  # registry.describe() of the run's workload
        self.sizes: dict[str, Any] = {}              # WORKLOAD_SIZES, once the workload is built
        self.memory_components: list[dict[str, Any]] | None = None   # a row per rank, from the profiled step
        self.collectives: list[dict[str, Any]] | None = None         # rank 0's, in the profiled step
        self.mechanisms: list[dict[str, Any]] | None = None          # rank 0's knob verdicts, from it

    def write(self, status: str, reason: str = "", *, launch: dict[str, Any], provenance: dict[str, Any],
              throughput: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the record with the facts only its writer knows (how the run was launched, where
        it ran, its throughput); the final loss is the global loss's mean over the last 20 steps."""
        losses = [r["loss_global"] for r in self.steps[-20:]]
        rec = record_fields(
            self.cfg, planned_identity(self.cfg, self.out), status, reason, device_type=self.device_type, launch=launch, provenance=provenance,
            throughput=throughput, memory=self.memory, warnings=self.warnings, accuracy=self.accuracy,
            final_loss=sum(losses) / len(losses) if losses else None, steps=len(self.steps),
            wall_s=time.perf_counter() - self.started, start_s=self.start_s, startup=self.startup,
            workload=self.workload, sizes=self.sizes, memory_components=self.memory_components,
            collectives=self.collectives, mechanisms=self.mechanisms)
        write_record(self.out, rec, self.steps)
        return rec
