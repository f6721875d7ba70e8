"""A result set's run records read back: metrics.json through upgrade(), the walker over run
folders (finished runs only; damaged records named, not fatal where asked), and the typed record."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, overload

from dpbench.results.files import read_json
from dpbench.results.formats import RecordFormatError, upgrade
from dpbench.results.names import METRICS, STATUS_OK


def read_metrics(rdir: Path | str) -> dict[str, Any] | None:
    """A run's record in the current format (upgrade), or None while the run has not finished
    (metrics.json is written last). JSON that is no object comes as it is, for its reader to judge."""
    path = Path(rdir) / METRICS
    if not path.exists():
        return None
    rec = read_json(path)
    return upgraded(rec, path) if isinstance(rec, dict) else rec


def upgraded(record: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """upgrade() of a run record read from `path`; a record too new to read names its file."""
    try:
        return upgrade(record)
    except RecordFormatError as exc:
        raise RecordFormatError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class DamagedRecord:
    """A finished run whose metrics.json cannot be read as a run record (not JSON, not an
    object, no run_id): what iter_runs yields for it when asked to go on past it."""
    path: Path
    error: Exception

    @property
    def run_id(self) -> str:
        return self.path.parent.name


def read_run(path: Path | str) -> dict[str, Any] | DamagedRecord:
    """A metrics.json as a run record (a dict with a run_id, upgraded), or a DamagedRecord saying
    why not. A record from a newer format is no damage (rerunning would not help): it raises
    RecordFormatError."""
    try:
        rec = read_json(path)
        if not isinstance(rec, dict) or "run_id" not in rec:
            raise ValueError("not a run record")
        return upgraded(rec, path)
    except RecordFormatError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as exc:   # JSONDecodeError is a ValueError
        return DamagedRecord(Path(path), exc)


@overload
def iter_runs(folder: Path | str, *, damaged: Literal[False] = ...) -> Iterator[tuple[dict[str, Any], Path]]: ...
@overload
def iter_runs(folder: Path | str, *, damaged: bool) -> Iterator[tuple[dict[str, Any] | DamagedRecord, Path]]: ...


def iter_runs(folder: Path | str, *, damaged: bool = False
              ) -> Iterator[tuple[dict[str, Any] | DamagedRecord, Path]]:
    """(record, run folder) of every finished run (one with a metrics.json) in a folder of run
    folders, sorted by name. A record that cannot be read raises its error, or with
    damaged=True comes as a DamagedRecord so that the other runs are still read."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for rdir in sorted(p for p in folder.iterdir() if p.is_dir()):
        path = rdir / METRICS
        if not path.is_file():
            continue   # unfinished: metrics.json is written last
        rec = read_run(path)
        if isinstance(rec, DamagedRecord) and not damaged:
            raise rec.error
        yield rec, rdir


@dataclass(frozen=True)
class RunRecord:
    """The top-level fields of a run's metrics.json, read through upgrade() (an older record
    reads with the defaults formats.upgrade gives its missing fields)."""
    run_id: str
    status: str
    reason: str = ""
    cell_id: str = ""    # the plan's identities (identity.Identity); upgrade derives older records'
    setup_id: str = ""
    group: str = ""
    variant: str = ""
    gpus: int = 0
    repeat: int = 0
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    deterministic: bool = False
    scaling: str = "strong"
    per_gpu_batch: float | None = None
    device_type: str = ""
    steps: int = 0
    wall_s: float | None = None
    start_s: float | None = None   # launch to first step; None where not measured
    startup: dict[str, float] = field(default_factory=dict)   # STARTUP_PHASES' ends, where measured
    final_loss: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunRecord":
        if not isinstance(data, dict) or "run_id" not in data or "status" not in data:
            raise ValueError("not a run record (no run_id or status)")
        rec = upgrade(data)
        return cls(
            run_id=rec["run_id"], status=rec["status"], reason=rec["reason"], cell_id=rec["cell_id"],
            setup_id=rec["setup_id"], group=rec["group"], variant=rec["variant"],
            gpus=rec["gpus"], repeat=rec["repeat"], options=dict(rec["options"]), seed=rec["seed"],
            deterministic=rec["deterministic"], scaling=rec["scaling"], per_gpu_batch=rec["per_gpu_batch"],
            device_type=rec.get("device_type") or "", steps=rec.get("steps") or 0, wall_s=rec.get("wall_s"),
            start_s=rec["start_s"], startup=dict(rec["startup"]), final_loss=rec.get("final_loss"),
            config=dict(rec.get("config") or {}), raw=rec)
