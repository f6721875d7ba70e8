"""The one owner of the results layout: every path of a result set, and the readers.

    <root>/<tag>/runs/<run_id>/metrics.json   one run's record (written last, atomically)
    <root>/<tag>/runs/<run_id>/steps.csv      one row per optimizer step
    <root>/<tag>/{summary,memory,warnings,steps,accuracy,medians}.csv   tidy tables over all runs
    <root>/<tag>/provenance.json              where the runs came from (one value, or a list)
    <root>/<tag>/summary.md, claims.md, claims.json, claims/<Cn>.json (probe records)
    <root>/<tag>/figures/<name>.png, logs/<name>.log, report.html
    <root>/compare/<baseline>_vs_<candidate>.{md,json}

`ResultSet(root, tag)` answers every path and reads the tables, records and provenance;
collect, plots, summary, claims and compare ask it, so none of them re-learns the layout or
the column names. The module-level functions are the same answers for callers that hold a
(root, tag) pair.
"""
from __future__ import annotations

import csv
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal, NamedTuple, overload

if TYPE_CHECKING:   # pandas loads only where a table is read
    import pandas as pd

    from dpbench.plan.config import RunConfig

METRICS = "metrics.json"
STEPS = "steps.csv"
PROVENANCE = "provenance.json"
SUMMARY_MD = "summary.md"
CLAIMS_MD, CLAIMS_JSON = "claims.md", "claims.json"
REPORT_HTML = "report.html"
COMPARE_DIR = "compare"

# The pipeline's figures (file stems under figures/, in drawing order). Planning needs the
# names without drawing anything: plots.py draws exactly these.
FIGURE_NAMES = ("throughput", "scaling_efficiency", "memory", "loss_curves", "loss_vs_single",
                "accuracy", "warnings")
# The claims ledger's own figures: key -> file name (claim_<key>.png); a key's claim is the part
# before "_" (C8_dp_step belongs to C8). claims/figures.py draws exactly these.
CLAIM_FIGURE_KEYS = ("C1", "C6", "C7", "C8", "C8_dp_step")

STATUS_OK, STATUS_FAILED, STATUS_SKIPPED = "ok", "failed", "skipped"

# Column order of the tidy tables (one row per observation).
STEP_COLUMNS = ["epoch", "step", "loss_global", "loss_reported", "lr", "step_ms"]
SUMMARY_COLUMNS = [
    "run_id", "variant", "gpus", "repeat", "options", "status", "reason",
    "images_per_s", "step_ms_p50", "step_ms_p95", "peak_mem_mib", "mem_dev0_over_mean_others",
    "n_warnings", "final_loss", "test_acc", "wall_s", "timed_steps", "global_batch",
    "precision", "feed", "dataset", "device_type",
    # how the run was planned and seeded; setup: a hash of the run's config without its
    # identity and batch fields, so runs that differ only in batch size share it
    "scaling", "per_gpu_batch", "seed", "deterministic", "setup",
]
# data_mib: the dataset resident on that device (gpu feed), part of allocated_mib; subtract it
# to compare what the model and optimizer cost per device.
MEMORY_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "device",
                  "allocated_mib", "reserved_mib", "nvml_used_mib", "data_mib"]
WARNING_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "category", "message",
                   "count", "first_step", "location", "rank"]
ACCURACY_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "epoch", "test_acc", "test_loss"]
RUN_STEP_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat"] + STEP_COLUMNS
# One row per cell (options, variant, gpus) and quantity: a median over the ok repeats or a
# ratio of medians (speed-up, efficiency against `reference`), with its distribution-free
# interval and that interval's confidence (ci_level: 0.75 for the range of 3 repeats).
CELL_COLUMNS = ["options", "setup", "variant", "gpus", "scaling", "global_batch", "per_gpu_batch",
                "quantity", "n", "reference", "value", "ci_low", "ci_high", "ci_level"]

# Columns that hold text in every table: an empty options label or reason reads as "", not NaN.
TEXT_COLUMNS = ("run_id", "options", "reason", "message", "location", "category", "status",
                "variant", "scaling", "setup", "quantity", "reference", "precision", "feed",
                "dataset", "device_type")

TABLES = {
    "summary": SUMMARY_COLUMNS,
    "memory": MEMORY_COLUMNS,
    "warnings": WARNING_COLUMNS,
    "accuracy": ACCURACY_COLUMNS,
    "steps": RUN_STEP_COLUMNS,
    "medians": CELL_COLUMNS,
}


def run_id(variant: str, gpus: int, repeat: int, options: dict[str, Any] | None = None) -> str:
    """`ddp-g2-r0`, or `ddp-g2-global_batch1024-r0` when an experiment sweeps options."""
    parts = [variant, f"g{gpus}"]
    parts += [f"{k}{_slug(v)}" for k, v in sorted((options or {}).items())]
    parts.append(f"r{repeat}")
    return "-".join(parts)


class RunId(NamedTuple):
    """A run id taken apart: `options` is the slugged options part ('' when nothing is swept);
    slugs do not read back into values (the record's options hold those)."""
    variant: str
    gpus: int
    options: str
    repeat: int

    @property
    def cell(self) -> str:
        """The run id without its repeat: the repeats of one cell share it."""
        return "-".join([self.variant, f"g{self.gpus}"] + ([self.options] if self.options else []))


_RUN_ID = re.compile(r"^(?P<variant>.+?)-g(?P<gpus>\d+)(?:-(?P<options>.*))?-r(?P<repeat>\d+)$")


def parse_run_id(rid: str) -> RunId | None:
    """run_id's parts back out of a run id, or None when it is not one."""
    m = _RUN_ID.match(rid)
    if m is None:
        return None
    return RunId(m["variant"], int(m["gpus"]), m["options"] or "", int(m["repeat"]))


def options_label(options: dict[str, Any] | None) -> str:
    """A stable, readable key for the swept options ('' when nothing is swept)."""
    return ",".join(f"{k}={v}" for k, v in sorted((options or {}).items()))


def _slug(value: Any) -> str:
    return str(value).lower().replace(".", "p").replace("/", "_").replace(" ", "")


def tag_dir(root: Path | str, tag: str) -> Path:
    return ResultSet(root, tag).dir


def runs_dir(root: Path | str, tag: str) -> Path:
    return ResultSet(root, tag).runs_dir


def run_dir(root: Path | str, tag: str, rid: str) -> Path:
    return ResultSet(root, tag).run_dir(rid)


def table_path(root: Path | str, tag: str, name: str) -> Path:
    return ResultSet(root, tag).table_path(name)


def provenance_path(root: Path | str, tag: str) -> Path:
    return ResultSet(root, tag).provenance_path


def figures_dir(root: Path | str, tag: str) -> Path:
    return ResultSet(root, tag).figures_dir


def claim_figure_name(key: str) -> str:
    return f"claim_{key.lower()}.png"


def compare_dir(root: Path | str) -> Path:
    return Path(root) / COMPARE_DIR


def compare_paths(root: Path | str, baseline: str, candidate: str) -> tuple[Path, Path]:
    """The regression check's report (markdown, json) of two tags under one root."""
    folder, stem = compare_dir(root), f"{baseline}_vs_{candidate}"   # tags hold dots: no with_suffix
    return folder / f"{stem}.md", folder / f"{stem}.json"


class ResultSet:
    """One result set, <root>/<tag>: every path in it, and its readers.

    Paths are answered whether or not the file exists yet (the pipeline declares them before
    anything is written); readers raise FileNotFoundError for a missing table or provenance and
    return None for a run that has not finished."""

    def __init__(self, root: Path | str, tag: str):
        self.root, self.tag = Path(root), str(tag)

    @classmethod
    def at(cls, folder: Path | str) -> "ResultSet":
        """The result set whose folder this is (<root>/<tag>)."""
        folder = Path(folder)
        return cls(folder.parent, folder.name)

    def __repr__(self) -> str:
        return f"ResultSet({str(self.root)!r}, {self.tag!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ResultSet) and (self.root, self.tag) == (other.root, other.tag)

    def __hash__(self) -> int:
        return hash((self.root, self.tag))

    # -- paths ------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.root / self.tag

    @property
    def runs_dir(self) -> Path:
        return self.dir / "runs"

    def run_dir(self, rid: str) -> Path:
        return self.runs_dir / rid

    def metrics_path(self, rid: str) -> Path:
        return self.run_dir(rid) / METRICS

    def steps_path(self, rid: str) -> Path:
        return self.run_dir(rid) / STEPS

    def table_path(self, name: str) -> Path:
        if name not in TABLES:
            raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}")
        return self.dir / f"{name}.csv"

    def table_paths(self) -> dict[str, Path]:
        return {name: self.table_path(name) for name in TABLES}

    @property
    def provenance_path(self) -> Path:
        return self.dir / PROVENANCE

    @property
    def plan_path(self) -> Path:
        """plan.json: the experiment as planned (groups -> run configs -> run ids), written
        by the Snakefile's plan rule and read by the probes and the ledger."""
        return self.dir / "plan.json"

    @property
    def summary_md(self) -> Path:
        return self.dir / SUMMARY_MD

    @property
    def claims_md(self) -> Path:
        return self.dir / CLAIMS_MD

    @property
    def claims_json(self) -> Path:
        return self.dir / CLAIMS_JSON

    @property
    def probes_dir(self) -> Path:
        return self.dir / "claims"

    @property
    def benchmarks_dir(self) -> Path:
        """pytest-benchmark's storage for the step benchmarks run with this set (tools/device/perf.sh)."""
        return self.dir / "benchmarks"

    def probe_path(self, claim: str) -> Path:
        """A claim probe's record, claims/<Cn>.json."""
        return self.probes_dir / f"{claim}.json"

    def probe_paths(self) -> dict[str, Path]:
        """The probe records present, by claim id."""
        if not self.probes_dir.is_dir():
            return {}
        return {p.stem: p for p in sorted(self.probes_dir.glob("C*.json"))}

    @property
    def figures_dir(self) -> Path:
        return self.dir / "figures"

    def figure_path(self, name: str) -> Path:
        return self.figures_dir / f"{name}.png"

    def figure_paths(self) -> dict[str, Path]:
        """The pipeline's figures, by name (FIGURE_NAMES)."""
        return {name: self.figure_path(name) for name in FIGURE_NAMES}

    def claim_figure_path(self, key: str) -> Path:
        return self.figures_dir / claim_figure_name(key)

    def claim_figure_paths(self) -> dict[str, Path]:
        """The claims ledger's figures, by key (CLAIM_FIGURE_KEYS)."""
        return {key: self.claim_figure_path(key) for key in CLAIM_FIGURE_KEYS}

    def relative(self, path: Path | str) -> str:
        """A path inside the result set as its own files link it (figures/x.png from claims.md)."""
        return Path(path).relative_to(self.dir).as_posix()

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    def log_path(self, name: str) -> Path:
        """logs/<name>.log: a run's log (name = its run id) or a step's (collect, plots, ...)."""
        return self.logs_dir / f"{name}.log"

    @property
    def report_html(self) -> Path:
        return self.dir / REPORT_HTML

    def compare_paths(self, candidate: str) -> tuple[Path, Path]:
        """The regression check of `candidate` against this result set (the baseline)."""
        return compare_paths(self.root, self.tag, candidate)

    # -- readers ----------------------------------------------------------------------------
    def table(self, name: str) -> "pd.DataFrame":
        """A tidy table as a pandas DataFrame (read_table's rule: TEXT_COLUMNS as str)."""
        return read_table(self.root, self.tag, name)

    def metrics(self, rid: str) -> dict[str, Any] | None:
        """A run's record, or None while it has not finished."""
        return read_metrics(self.run_dir(rid))

    def record(self, rid: str) -> "RunRecord | None":
        raw = self.metrics(rid)
        return None if raw is None else RunRecord.from_json(raw)

    def runs(self) -> Iterator[tuple[dict[str, Any], Path]]:
        """(record, run folder) of every finished run, sorted by run id."""
        return iter_runs(self.runs_dir)

    def provenance(self) -> dict[str, Any]:
        prov: dict[str, Any] = read_json(self.provenance_path)
        return prov


# -- atomic writes: a reader never sees a half-written file -------------------------------

def write_atomic(path: Path | str, text: str | bytes) -> None:
    """Write to a temporary file in the same folder, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "wb" if isinstance(text, bytes) else "w"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file 0600; results are for the group too (a shared filesystem),
        # as far as the user's umask allows.
        os.fchmod(fd, 0o644 & ~_umask())
        with os.fdopen(fd, mode) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    try:   # Linux shows it without changing it (other threads may be creating files)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)   # elsewhere reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_json(path: Path | str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path | str) -> Any:
    with open(path) as f:
        return json.load(f)


def write_csv(path: Path | str, columns: list[str], rows: Iterable[dict[str, Any]]) -> None:
    """Rows are dicts; missing keys are written empty, extra keys are an error (a typo)."""
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    write_atomic(path, buf.getvalue())


def read_metrics(rdir: Path | str) -> dict[str, Any] | None:
    """A run's record, or None while the run has not finished (metrics.json is written last)."""
    path = Path(rdir) / METRICS
    return read_json(path) if path.exists() else None


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
    """A metrics.json as a run record (a dict with a run_id), or a DamagedRecord saying why not."""
    try:
        rec = read_json(path)
        if not isinstance(rec, dict) or "run_id" not in rec:
            raise ValueError("not a run record")
        return rec
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


def read_table(root: Path | str, tag: str, name: str) -> "pd.DataFrame":
    """A tidy table as a pandas DataFrame (empty, with its columns, when the file has no rows).
    One rule for text: TEXT_COLUMNS read as str, '' where empty (never NaN); the other columns
    are as pandas reads them (numbers, or whatever a damaged file holds, for the caller to judge)."""
    import pandas as pd

    text = {c: str for c in TEXT_COLUMNS if c in TABLES[name]}
    return pd.read_csv(table_path(root, tag, name), keep_default_na=False, na_values=[""],
                       dtype=text).fillna({c: "" for c in text})


# -- writing a record -----------------------------------------------------------------------

# A run's start-up, in the order it happens: each phase's end in seconds since the launch
# (runlog.mark_launch), in the record's "startup"; its first step begins at "start_s".
#   imports: the launcher, torchrun and its ranks where ddp, Python's and torch's imports (with
#            torch._dynamo, which the optimizer imports anyway: train.preload)
#   devices: CUDA and the process group; data: the numeric switches and the dataset read;
#   model: model, wrapper, optimizer; feed: the batches' source (the gpu feed's upload)
STARTUP_PHASES = ("imports", "devices", "data", "model", "feed")

# A run that measured nothing (skipped, or failed before its first timed step): the keys of
# dpbench.run.measure.throughput with no steps, and no compile time.
NO_THROUGHPUT = {"images_per_s": None, "timed_steps": 0, "step_ms_p50": None, "step_ms_p95": None,
                 "step_ms_mean": None, "compile_s": None}


def record_fields(cfg: "RunConfig", status: str, reason: str, *, device_type: str, launch: dict,
                  provenance: dict, throughput: dict | None = None, memory: list | None = None,
                  warnings: list | None = None, accuracy: list | None = None,
                  final_loss: float | None = None, steps: int = 0, wall_s: float = 0.0,
                  start_s: float | None = None, startup: dict | None = None) -> dict[str, Any]:
    """A run's metrics.json: the one layout, for the engine's records (measurements given) and
    the launcher's skipped ones (none), which it writes without importing torch."""
    return {
        "run_id": run_id(cfg.variant, cfg.gpus, cfg.repeat, cfg.options),
        "status": status, "reason": reason,
        "variant": cfg.variant, "gpus": cfg.gpus, "repeat": cfg.repeat, "options": cfg.options,
        "seed": cfg.seed, "deterministic": cfg.deterministic, "scaling": cfg.scaling,
        "per_gpu_batch": cfg.global_batch / cfg.gpus,
        "config": cfg.to_dict(), "device_type": device_type, "launch": launch,
        "throughput": dict(throughput or NO_THROUGHPUT),
        "memory": memory or [], "warnings": warnings or [], "accuracy": accuracy or [],
        "final_loss": final_loss, "steps": steps, "wall_s": wall_s, "start_s": start_s,
        "startup": dict(startup or {}), "provenance": provenance,
    }


# -- typed records --------------------------------------------------------------------------

@dataclass(frozen=True)
class RunRecord:
    """The top-level fields of a run's metrics.json. Records written before a field existed
    read with its default: strong scaling, the config's seed (or 0), not deterministic, and a
    per-GPU batch of global batch / gpus."""
    run_id: str
    status: str
    reason: str = ""
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
    start_s: float | None = None   # launch to first step; None in records from before it existed
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
        cfg = data.get("config") or {}
        gpus = data.get("gpus", cfg.get("gpus", 0))
        per_gpu = data.get("per_gpu_batch")
        if per_gpu is None:
            per_gpu = cls.planned_per_gpu_batch(cfg, gpus)
        return cls(
            run_id=data["run_id"], status=data["status"], reason=data.get("reason") or "",
            variant=data.get("variant", cfg.get("variant", "")), gpus=gpus,
            repeat=data.get("repeat", cfg.get("repeat", 0)),
            options=dict(data.get("options") or cfg.get("options") or {}),
            seed=data.get("seed", cfg.get("seed", 0)),
            deterministic=bool(data.get("deterministic", cfg.get("deterministic", False))),
            scaling=data.get("scaling") or cls.planned_scaling(cfg),
            per_gpu_batch=per_gpu, device_type=data.get("device_type") or "",
            steps=data.get("steps") or 0, wall_s=data.get("wall_s"), start_s=data.get("start_s"),
            startup=dict(data.get("startup") or {}), final_loss=data.get("final_loss"), config=dict(cfg), raw=data)

    # The defaults of the planning fields, for a record (or a table row) that lacks them. The
    # tables' reader asks these too (tables.with_run_defaults), so both read old runs alike.
    @staticmethod
    def planned_scaling(config: dict[str, Any]) -> str:
        """Weak when the config fixes the per-GPU batch, else strong (every run before weak
        scaling existed)."""
        return "weak" if config.get("per_gpu_batch") is not None else "strong"

    @staticmethod
    def planned_per_gpu_batch(config: dict[str, Any], gpus: Any) -> float | None:
        """The config's per-GPU batch for a weak run, else global batch / gpus (a float: an
        uneven split stays fractional); None when the global batch or the GPU count is unknown."""
        global_batch = config.get("global_batch")
        if global_batch is None or not gpus:
            return None
        planned: float | None = config.get("per_gpu_batch")
        return planned if planned is not None else global_batch / gpus


# -- provenance.json: each key one value, or the sorted distinct values when runs disagree -----

# Keys whose value in one run is itself a list: there, a list of lists means the runs disagreed.
LIST_VALUED_PROVENANCE = ("gpu_names",)


def provenance_values(provenance: dict[str, Any], key: str) -> list[Any]:
    """The distinct values a provenance.json key took over the runs ([] when absent)."""
    if key not in provenance or provenance[key] is None:
        return []
    value = provenance[key]
    if key in LIST_VALUED_PROVENANCE:
        return list(value) if value and all(isinstance(v, list) for v in value) else [value]
    return list(value) if isinstance(value, list) else [value]


def gpu_models(provenance: dict[str, Any]) -> list[str]:
    """The GPU models any run saw, sorted (the hardware, whatever each run's GPU count)."""
    return sorted({str(name) for names in provenance_values(provenance, "gpu_names") for name in names})


def widest_gpu_names(provenance: dict[str, Any]) -> list[str]:
    """The GPUs of the run that saw the most, one name per GPU ([] when no run saw one)."""
    return max(provenance_values(provenance, "gpu_names"), key=len, default=[])
