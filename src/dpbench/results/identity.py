"""A run's identities, spelled in one place: its run id, cell id, setup id and group.

The plan decides them (plan.matrix calls `identity_of` for every run and writes the result to
plan.json); the launcher and the record copy them. Records and plans written before the plan
decided them get theirs through `identity_of` too (formats.upgrade, matrix.read_identities),
with the values the readers computed before: that is the one place they are derived.

    run id    ddp-g2-r0, ddp-g2-global_batch1024-r0 (options swept), ddp-g2-envbase-r0 (paired)
    cell id   the run id less its repeat: ddp-g2, ddp-g2-global_batch1024 (repeats share it)
    setup id  10 hex digits of the run's config less its identity, batch and the knobs that
              single runs ignore: runs that differ only by those share it
    group     the experiment group that made the run first ('' where unknown: older records)
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from dpbench.results.files import write_json

# Config keys that do not make a different setup: the run's identity, its batch (what strong and
# weak scaling vary) and DistributedDataParallel's and the sharded variants' knobs, which single
# runs ignore. Written out, not asked of the variant registry (plan.variants' setup_neutral_keys,
# which sits above this layer): the setup ids of committed records hash with this set, so it is
# part of the record format and changes only with a format version.
NOT_SETUP = {"variant", "gpus", "repeat", "seed", "options", "global_batch", "per_gpu_batch",
             "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers", "find_unused_parameters",
             "reshard_after_forward", "hsdp_shard_size", "collective_timeout_s", "max_cpu_ranks"}


def run_id(variant: str, gpus: int, repeat: int, options: dict[str, Any] | None = None) -> str:
    """`ddp-g2-r0`, or `ddp-g2-global_batch1024-r0` when an experiment sweeps options
    (`ddp-g2-envbase-r0`: a paired launch's environment)."""
    return f"{cell_id(variant, gpus, options)}-r{repeat}"


def cell_id(variant: str, gpus: int, options: dict[str, Any] | None = None) -> str:
    """The run id of a cell's runs less the repeat: `ddp-g2`, `ddp-g2-global_batch1024`."""
    parts = [variant, f"g{gpus}"]
    short = {"workload": lambda v: f"w{_slug(workload_label(v))}", "environment": lambda v: f"env{_slug(v)}"}
    parts += [short[k](v) if k in short else f"{k}{_slug(v)}" for k, v in sorted((options or {}).items())]
    return "-".join(parts)


def setup_id(config: Mapping[str, Any]) -> str:
    """Runs that differ only in identity and batch share this id (a short hash of the rest);
    '' for a record without its config."""
    if not config:
        return ""
    rest = {k: v for k, v in config.items() if k not in NOT_SETUP}
    return hashlib.sha1(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:10]


class RunId(NamedTuple):
    """A run id taken apart: `options` is the slugged options part ('' when nothing is swept);
    slugs do not read back into values (the record's options hold those)."""
    variant: str
    gpus: int
    options: str
    repeat: int


_RUN_ID = re.compile(r"^(?P<variant>.+?)-g(?P<gpus>\d+)(?:-(?P<options>.*))?-r(?P<repeat>\d+)$")


def parse_run_id(rid: str) -> RunId | None:
    """run_id's parts back out of a run id, or None when it is not one (a damaged run's folder
    name is all collect has of it)."""
    m = _RUN_ID.match(rid)
    if m is None:
        return None
    return RunId(m["variant"], int(m["gpus"]), m["options"] or "", int(m["repeat"]))


def cell_of_run_id(rid: str) -> str:
    """The cell id in a run id (the id less its `-r<repeat>`); the id itself when it is none."""
    m = _RUN_ID.match(rid)
    return rid if m is None else rid[: m.start("repeat") - 2]


@dataclass(frozen=True)
class Identity:
    """What names a run everywhere: decided by the plan, copied by the launcher and the record."""
    run_id: str
    cell_id: str
    setup_id: str
    group: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Identity":
        return cls(str(data["run_id"]), str(data["cell_id"]), str(data["setup_id"]), str(data.get("group") or ""))

    def write(self, folder: Path | str) -> None:
        """The run folder's identity.json: the launcher's copy of the plan's, read by the record."""
        write_json(Path(folder) / IDENTITY, self.to_dict())

    @classmethod
    def read(cls, folder: Path | str) -> "Identity | None":
        """A run folder's identity.json, or None where the run was launched without a plan."""
        path = Path(folder) / IDENTITY
        return cls.from_dict(json.loads(path.read_text())) if path.is_file() else None


IDENTITY = "identity.json"
IDENTITY_FIELDS = ("run_id", "cell_id", "setup_id", "group")


def identity_of(rid: str, config: Mapping[str, Any] | None, group: str = "") -> Identity:
    """The identity of run `rid` with these settings: what the plan decides, and what an older
    record or plan that lacks it reads as (the values collect and RunId.cell gave it before)."""
    return Identity(rid, cell_of_run_id(rid), setup_id(config or {}), group)


def options_label(options: dict[str, Any] | None) -> str:
    """A stable, readable key for the swept options ('' when nothing is swept)."""
    return ",".join(f"{k}={workload_label(v) if k == 'workload' else v}" for k, v in sorted((options or {}).items()))


def workload_label(workload: Any) -> str:
    """A swept workload's short stable spelling in run ids and labels: a built-in's or plugin's
    name (`transformer-lm`), a factory's module and function (`models_build`), and, when args
    are given or it is a factory, 8 hex digits of the sha256 of the workload as written
    (`transformer-lm-1c2d3e4f`): the args themselves are in the record's options."""
    if isinstance(workload, str):
        workload = {"factory": workload} if ":" in workload else {"name": workload}
    if not isinstance(workload, dict):
        return str(workload)
    args = workload.get("args") or {}
    if "factory" in workload:
        target, _, function = str(workload["factory"]).rpartition(":")
        module = Path(target).stem if target.endswith(".py") or "/" in target else target.rpartition(".")[2]
        base = f"{module}_{function}"
    else:
        base = str(workload.get("name"))
    if not args and "factory" not in workload:
        return base
    canonical = json.dumps({k: v for k, v in workload.items() if k != "args"} | {"args": args},
                           sort_keys=True, default=str)
    return f"{base}-{hashlib.sha256(canonical.encode()).hexdigest()[:8]}"


def _slug(value: Any) -> str:
    return str(value).lower().replace(".", "p").replace("/", "_").replace(" ", "")
