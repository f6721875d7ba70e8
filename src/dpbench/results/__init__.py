"""The one owner of the results layout: every path of a result set, and the readers.

    <root>/<tag>/runs/<run_id>/metrics.json   one run's record (written last, atomically)
    <root>/<tag>/runs/<run_id>/steps.csv      one row per optimizer step
    <root>/<tag>/{summary,memory,warnings,steps,accuracy,medians}.csv   tidy tables over all runs
    <root>/<tag>/{memory_components,collectives}.csv   the sharded work's (rows only where recorded)
    <root>/<tag>/provenance.json              where the runs came from (one value, or a list)
    <root>/<tag>/summary.md, claims.md, claims.json, claims/<Cn>.json (probe records), sharding.md
    <root>/<tag>/figures/<name>.png, logs/<name>.log, report.html
    <root>/compare/<baseline>_vs_<candidate>.{md,json}

`ResultSet(root, tag)` answers every path and reads the tables, records and provenance;
collect, plots, summary, claims and compare ask it, so none of them re-learns the layout or
the column names. The module-level functions are the same answers for callers that hold a
(root, tag) pair. Its length (a little over 450 lines) is the layout's: every path, run id and
reader of a set in one place is the point.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Literal, overload

# Re-exported: the tables' names, columns and dtypes (schema.py), the record's format (formats.py),
# the atomic writers (files.py).
from dpbench.results.formats import FORMAT, LATER_PHASES, NO_THROUGHPUT, STARTUP_PHASES, RecordFormatError, upgrade  # noqa: F401
from dpbench.results.formats import planned_per_gpu_batch, planned_scaling  # noqa: F401
from dpbench.results.formats import workload_name  # noqa: F401
from dpbench.results.schema import ACCURACY_COLUMNS, CELL_COLUMNS, MEMORY_COLUMNS  # noqa: F401
from dpbench.results.schema import COLLECTIVE_COLUMNS, LATER_TABLES, MEMORY_COMPONENT_COLUMNS  # noqa: F401
from dpbench.results.schema import RUN_STEP_COLUMNS, STEP_COLUMNS, SUMMARY_COLUMNS  # noqa: F401
from dpbench.results.schema import SCHEMAS, TABLES, TEXT_COLUMNS, WARNING_COLUMNS  # noqa: F401
from dpbench.results.schema import CLAIM_SCHEMAS, LARGEST_BATCH_COLUMNS, CELLS_COLUMNS, RUN_COLUMNS  # noqa: F401
from dpbench.results.schema import TableError, TableSchema  # noqa: F401
from dpbench.results.files import NotWritable, read_json, write_atomic, write_csv, write_json  # noqa: F401
from dpbench.results.errors import message_line
# The run's identities (identity.py): run id, cell id, setup id, their labels.
from dpbench.results.identity import IDENTITY, Identity, RunId, cell_id, identity_of, options_label  # noqa: F401
from dpbench.results.identity import parse_run_id, run_id, setup_id, workload_label  # noqa: F401

if TYPE_CHECKING:   # pandas loads only where a table is read
    import pandas as pd

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
# The sharded variants' figures (report/sharding_plots.py draws exactly these), drawn where the
# plan has sharded runs.
SHARDING_FIGURE_NAMES = ("memory_components", "sharding_vs_size")
# The largest batch per variant and model size (C9's search, issue 26), where a set has it.
# The claims ledger's own figures: key -> file name (claim_<key>.png); a key's claim is the part
# before "_" (C8_dp_step belongs to C8). claims/figures.py draws exactly these.
CLAIM_FIGURE_KEYS = ("C1", "C6", "C7", "C8", "C8_dp_step", "C9")

STATUS_OK, STATUS_FAILED, STATUS_SKIPPED = "ok", "failed", "skipped"
# In a failed row's reason: collect could not read the run's metrics.json or steps.csv (the file
# is named before it). Compare reads such a row as a broken input (exit 2), never as a result.
DAMAGED_MARK = " is damaged ("

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


def paired_compare_paths(root: Path | str, tag: str, base: str, cand: str) -> tuple[Path, Path]:
    """The report (markdown, json) of environment `cand` against `base` within paired launch `tag`."""
    return compare_paths(root, f"{tag}.{base}", cand)


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

    def claim_table_path(self, name: str) -> Path:
        """A table the claims ledger writes from the probes' records (CLAIM_SCHEMAS: largest_batch)."""
        if name not in CLAIM_SCHEMAS:
            raise KeyError(f"unknown claim table {name!r}; known: {sorted(CLAIM_SCHEMAS)}")
        return self.dir / f"{name}.csv"

    def write_claim_table(self, name: str, rows: list[dict[str, Any]]) -> Path:
        path = self.claim_table_path(name)
        write_csv(path, CLAIM_SCHEMAS[name].columns, rows)
        return path

    def claim_table(self, name: str) -> "pd.DataFrame":
        """A claim table read back by its schema's dtypes (empty, with its columns, where absent)."""
        import pandas as pd

        schema, path = CLAIM_SCHEMAS[name], self.claim_table_path(name)
        df = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=schema.columns)
        return schema.typed(df)

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

    def sharding_figure_paths(self) -> dict[str, Path]:
        """The sharded variants' figures, by name (SHARDING_FIGURE_NAMES)."""
        return {name: self.figure_path(name) for name in SHARDING_FIGURE_NAMES}

    @property
    def sharding_md(self) -> Path:
        """sharding.md: the sharded variants' memory model and traffic formulas against the runs."""
        return self.dir / "sharding.md"

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


def read_table(root: Path | str, tag: str, name: str, require: Iterable[str] | None = None) -> "pd.DataFrame":
    """A tidy table as a pandas DataFrame (empty, with its columns, when the file has no rows).
    A table of LATER_TABLES that an older set lacks reads as empty. One rule for text: the schema's text columns read as str, '' where empty (never NaN); the
    other columns are as pandas reads them (numbers, or whatever a damaged file holds).

    With `require` the caller's columns are checked (schema.TableSchema.checked): a file that is
    no CSV table, a missing column, a non-number in a numeric one, an empty key column is a
    TableError naming the file, column and line, and the numeric required columns are numbers."""
    import pandas as pd

    schema, path = SCHEMAS[name], table_path(root, tag, name)
    if name in LATER_TABLES and not path.exists():   # a set collected before the table existed
        return pd.DataFrame(columns=schema.columns)
    text = {c: str for c in schema.text}
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype=text).fillna({c: "" for c in text})
    except pd.errors.EmptyDataError:
        if require is None:
            raise
        raise TableError(f"{path} is empty (not even a header line)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        if require is None:
            raise
        raise TableError(f"{path} is not a readable CSV table ({message_line(exc)})") from None
    return df if require is None else schema.checked(df, path, require)


# -- typed records --------------------------------------------------------------------------

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


# -- provenance.json: each key one value, or the sorted distinct values when runs disagree -----

# Keys whose value in one run is itself a list: there, a list of lists means the runs disagreed.
LIST_VALUED_PROVENANCE = ("gpu_names",)


def provenance_values(provenance: dict[str, Any], key: str) -> list[Any]:
    """The distinct values a provenance.json key took over the runs ([] when absent)."""
    if key not in provenance or provenance[key] is None:
        return []
    value = provenance[key]
    if key in LIST_VALUED_PROVENANCE:
        if not isinstance(value, list):
            return []
        # Runs that disagreed: a list of lists, where a run that did not learn it wrote null
        # (an older collect kept those: [null, []]); nulls say nothing and are left out.
        if any(v is None or isinstance(v, list) for v in value):
            return [v for v in value if isinstance(v, list)]
        return [value]
    return [v for v in value if v is not None] if isinstance(value, list) else [value]


def gpu_models(provenance: dict[str, Any]) -> list[str]:
    """The GPU models any run saw, sorted (the hardware, whatever each run's GPU count)."""
    return sorted({str(name) for names in provenance_values(provenance, "gpu_names") for name in names})


def widest_gpu_names(provenance: dict[str, Any]) -> list[str]:
    """The GPUs of the run that saw the most, one name per GPU ([] when no run saw one)."""
    return max(provenance_values(provenance, "gpu_names"), key=len, default=[])
