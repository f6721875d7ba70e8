"""Every path of a result set (<root>/<tag>), and ResultSet, which answers them and reads its
tables, records and provenance: collect, plots, summary, claims and compare ask it, so none of
them re-learns the layout or the column names."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from dpbench.results.errors import message_line
from dpbench.results.files import read_json, write_csv
from dpbench.results.identity import cell_of_run_id
from dpbench.results.names import (CLAIM_FIGURE_KEYS, COMPARE_DIR, FIGURE_NAMES, METRICS, PROVENANCE,
                                   REPORT_HTML, SHARDING_FIGURE_NAMES, STEPS, SUMMARY_MD, CLAIMS_JSON, CLAIMS_MD)
from dpbench.results.runs import RunRecord, iter_runs, read_metrics
from dpbench.results.schema import CLAIM_SCHEMAS, LATER_TABLES, SCHEMAS, TABLES, TableError

# pandas loads only where a table is read: the launcher of every run imports results
# and reads no table, and pandas would double its start-up (0.4 s of 0.45 s).
if TYPE_CHECKING:
    import pandas as pd


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
        import pandas as pd   # only where a table is read (see the top)

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


def read_table(root: Path | str, tag: str, name: str, require: Iterable[str] | None = None) -> "pd.DataFrame":
    """A tidy table as a pandas DataFrame (empty, with its columns, when the file has no rows).
    A table of LATER_TABLES that an older set lacks reads as empty, but runs.csv: a set collected
    before it existed reads its summary.csv with the ids its records would get (`older_runs`).
    One rule for text: the schema's text columns read as str, '' where empty (never NaN); the
    other columns are as pandas reads them (numbers, or whatever a damaged file holds).

    With `require` the caller's columns are checked (schema.TableSchema.checked): a file that is
    no CSV table, a missing column, a non-number in a numeric one, an empty key column is a
    TableError naming the file, column and line, and the numeric required columns are numbers."""
    import pandas as pd   # only where a table is read (see the top)

    schema, path = SCHEMAS[name], table_path(root, tag, name)
    if name == "runs" and not path.exists() and table_path(root, tag, "summary").exists():
        return older_runs(read_table(root, tag, "summary", require))
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


def older_runs(summary: "pd.DataFrame") -> "pd.DataFrame":
    """runs.csv of a set collected before it existed: its summary.csv rows with the cell id
    every record of theirs reads with (identity.cell_of_run_id, as upgrade() derives it) and no
    group (plan.json's groups were not joined then)."""
    ids = [cell_of_run_id(rid) for rid in summary["run_id"]]
    runs = summary.assign(cell_id=ids, group="")
    if "rate" not in runs.columns and "images_per_s" in runs.columns:   # before the workload's unit: images
        runs = runs.assign(rate=runs["images_per_s"], rate_unit="images/s")
    return runs[[c for c in SCHEMAS["runs"].columns if c in runs.columns]]
