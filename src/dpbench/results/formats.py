"""The run record's format: its version, what its fields hold, and the one upgrade() of older records.

Every reader of metrics.json goes through `upgrade`, so none of them knows which field came
when. The committed references under results/reference/ are never rewritten: they are read
through it.

    format 1  records without a `format` key: may lack seed,
              deterministic, scaling, per_gpu_batch, launch (or its exclusive), start_s,
              startup, throughput.compile_s and the memory rows' data_mib
    format 2  every field that record_fields writes, and `format`; those written before
              workloads (issue 25) lack workload, parameters, param_bytes, flops_per_sample,
              sample_unit and throughput's samples_per_s and tokens_per_s (upgrade fills them);
              those from before issue 36 lack a `train` workload in their options (upgrade
              adds it: it names the run's cell); those from before issue 37 lack the
              identities the plan decides, cell_id, setup_id and group (upgrade derives
              them: identity.identity_of, the values the readers computed before)
"""
from __future__ import annotations

from typing import Any

from dpbench.results.identity import IDENTITY_FIELDS, identity_of

FORMAT = 2

# A run's start-up, in the order it happens: each phase's end in seconds since the launch
# (runlog.mark_launch), in the record's "startup"; its first step begins at "start_s".
#   imports: the launcher, torchrun and its ranks where ddp, Python's and torch's imports (with
#            torch._dynamo, which the optimizer imports anyway: engine.preload)
#   devices: CUDA and the process group; workload: the numeric switches, the factory building
#            the model and drawing its initial weights, its sizes (records before issue 35 count
#            this in data); data: the dataset read;
#   model: to the device, wrapper, optimizer; feed: the batches' source (the gpu feed's upload)
STARTUP_PHASES = ("imports", "devices", "workload", "data", "model", "feed")
# Phases later records time that older ones counted in the phase before: (phase, the one before).
LATER_PHASES = {"workload": "devices"}

# A run that measured nothing (skipped, or failed before its first timed step): the keys of
# dpbench.run.measure.throughput with no steps, and no compile time.
NO_THROUGHPUT = {"images_per_s": None, "samples_per_s": None, "tokens_per_s": None, "timed_steps": 0,
                 "step_ms_p50": None, "step_ms_p95": None, "step_ms_mean": None, "compile_s": None,
                 "host_step_ms": None, "bound": None}

# A step is host-bound when the host's time to issue it from an idle device (throughput's
# host_step_ms) reaches this share of the device's step time: the device then waits for the
# host at least part of the time, and a wrapper's host work (and the host's own drift) shows in
# the step time; device-bound otherwise (it hides). 0.75, not 1: on the one-H200 parity bench
# (results/reference/h200-parity-37110a0) the host's speed wandered by about 25% between runs,
# and every cell issued in under 0.75 of its step repeated within 0.4%, while cells from 0.8 up
# spread by 5-50% between repeats.
HOST_BOUND_SHARE = 0.75


def step_bound(host_ms: float | None, step_ms: float | None) -> str | None:
    """"host" or "device" (None when either time is unknown)."""
    if host_ms is None or not step_ms:
        return None
    return "host" if host_ms >= HOST_BOUND_SHARE * step_ms else "device"

# What a record says of its workload (issue 25): `workload` (name or factory, args, the digest
# of the factory's source file: dpbench.workloads.registry.describe) and its sizes, None where
# the run never built it. Records from before workloads trained the default.
DEFAULT_WORKLOAD = "resnet18-cifar10"
WORKLOAD_SIZES = ("parameters", "param_bytes", "flops_per_sample", "sample_unit")


def plain_workload(workload: Any) -> dict[str, Any]:
    """registry.describe's layout without its digest (the factory's file is not read): what a
    record names when the run never built its workload (a launcher's skipped record, an old record)."""
    if workload is None:
        workload = DEFAULT_WORKLOAD
    if isinstance(workload, str):
        workload = {"factory": workload} if ":" in workload else {"name": workload}
    key = "factory" if "factory" in workload else "name"
    return {key: workload.get(key), "args": dict(workload.get("args") or {}), "source_sha256": None}


def is_default_workload(workload: Any) -> bool:
    """Whether a config's workload is the default one, ResNet18 on CIFAR-10, however spelled."""
    if not isinstance(workload, (str, dict)):
        return True   # none given (or no workload at all: nothing to name)
    return plain_workload(workload) == plain_workload(DEFAULT_WORKLOAD)


def workload_name(record: dict[str, Any]) -> str:
    """A record's workload in one word: its name or factory (the summary's workload column)."""
    w = record.get("workload") or {}
    return str(w.get("name") or w.get("factory") or DEFAULT_WORKLOAD)


class RecordFormatError(ValueError):
    """A record from a newer format than this dpbench reads."""


def planned_scaling(config: dict[str, Any]) -> str:
    """Weak when the config fixes the per-GPU batch, else strong (every run before weak scaling
    existed)."""
    return "weak" if config.get("per_gpu_batch") is not None else "strong"


def planned_per_gpu_batch(config: dict[str, Any], gpus: Any) -> float | None:
    """The config's per-GPU batch for a weak run, else global batch / gpus (a float: an uneven
    split stays fractional); None when the global batch or the GPU count is unknown."""
    global_batch = config.get("global_batch")
    if global_batch is None or not gpus:
        return None
    planned: float | None = config.get("per_gpu_batch")
    return planned if planned is not None else global_batch / gpus


def record_format(record: dict[str, Any]) -> int:
    """The format a record was written in (1 without the key)."""
    version = record.get("format", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"its format {version!r} is no format version (an integer from 1)")
    return version


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """The record in the current format: a new dict, the input left as it was. A record of the
    current format comes back as it is; one from a newer format is a RecordFormatError that says
    the way out (the caller adds the file's name), a format that is no version a ValueError."""
    version = record_format(record)
    if version > FORMAT:
        raise RecordFormatError(
            f"written in record format {version}, newer than this dpbench reads ({FORMAT}): "
            "read it with the dpbench that wrote it (its provenance.git_sha), or update this one")
    rec = dict(record)
    if version == 1:
        rec = _from_1(rec)
    return _identity_fields(_workload_fields(rec))


def _identity_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """Records from before the plan decided the identities: derived from the run id and config."""
    if isinstance(rec.get("run_id"), str) and any(key not in rec for key in IDENTITY_FIELDS):
        config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
        for key, value in identity_of(rec["run_id"], config).to_dict().items():
            rec.setdefault(key, value)
    return rec


def _workload_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """Records from before workloads (format 2 without them, and format 1): the workload their
    config names (the default: ResNet18 on CIFAR-10), sizes unknown, samples/s = images/s."""
    if "workload" not in rec:
        rec["workload"] = plain_workload((rec.get("config") or {}).get("workload"))
    # A workload set in `train` names the run as a swept one does (plans since issue 36 put it
    # in the options): an older record gets it there, so that two models are never one cell.
    given = (rec.get("config") or {}).get("workload")
    options = rec.get("options")
    if isinstance(options, dict) and "workload" not in options and not is_default_workload(given):
        rec["options"] = {**options, "workload": given}
    for key in WORKLOAD_SIZES:
        rec.setdefault(key, None)
    if isinstance(rec.get("throughput"), dict) and "samples_per_s" not in rec["throughput"]:
        tp = rec["throughput"]
        rec["throughput"] = {**tp, "samples_per_s": tp.get("images_per_s"), "tokens_per_s": None}
    if isinstance(rec.get("throughput"), dict):   # before issue 35 no run probed its regime
        rec["throughput"] = {"host_step_ms": None, "bound": None, **rec["throughput"]}
    # Records from before the sharded variants measured nothing by component or collective.
    rec.setdefault("memory_components", [])
    rec.setdefault("collectives", [])
    # Records from before the knobs' mechanism checks judged none.
    rec.setdefault("mechanisms", [])
    return rec


def _from_1(rec: dict[str, Any]) -> dict[str, Any]:
    """Format 1's missing fields, by the rules the readers used before there was a version: the
    planning fields from the config (strong scaling, the config's seed or 0, not deterministic,
    global batch / gpus), no start-up measured, no compile time, no dataset on a device, and a
    launch that held no GPU exclusively."""
    cfg = rec.get("config") or {}
    for key, default in (("variant", ""), ("gpus", 0), ("repeat", 0), ("seed", 0),
                         ("deterministic", False)):
        if key not in rec:
            rec[key] = cfg.get(key, default)
    rec["deterministic"] = bool(rec["deterministic"])
    rec["options"] = dict(rec.get("options") or cfg.get("options") or {})
    rec["reason"] = rec.get("reason") or ""
    rec["scaling"] = rec.get("scaling") or planned_scaling(cfg)
    if rec.get("per_gpu_batch") is None:
        rec["per_gpu_batch"] = planned_per_gpu_batch(cfg, rec["gpus"])
    rec["launch"] = {"exclusive": False, **(rec.get("launch") or {})}
    rec.setdefault("start_s", None)
    rec["startup"] = dict(rec.get("startup") or {})
    if isinstance(rec.get("throughput"), dict):
        rec["throughput"] = {"compile_s": None, **rec["throughput"]}
    if isinstance(rec.get("memory"), list):
        rec["memory"] = [{"data_mib": None, **row} if isinstance(row, dict) else row
                         for row in rec["memory"]]
    rec["format"] = FORMAT
    return rec
