"""The one owner of the results layout.

    results/<tag>/runs/<run_id>/metrics.json   one run's record (written last, atomically)
    results/<tag>/runs/<run_id>/steps.csv      one row per optimizer step
    results/<tag>/{summary,memory,warnings,steps,accuracy}.csv   tidy tables over all runs
    results/<tag>/figures/*.png, summary.md, claims.{md,json}, report.html
    results/compare/<baseline>_vs_<candidate>.{md,json}

Collect, plots, claims and compare read and write through this module, so none of them
re-learns the layout or the column names.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

METRICS = "metrics.json"
STEPS = "steps.csv"

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
# ratio of medians (speed-up, efficiency against `reference`), with its bootstrap interval.
CELL_COLUMNS = ["options", "setup", "variant", "gpus", "scaling", "global_batch", "per_gpu_batch",
                "quantity", "n", "reference", "value", "ci_low", "ci_high"]

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


def options_label(options: dict[str, Any] | None) -> str:
    """A stable, readable key for the swept options ('' when nothing is swept)."""
    return ",".join(f"{k}={v}" for k, v in sorted((options or {}).items()))


def _slug(value: Any) -> str:
    return str(value).lower().replace(".", "p").replace("/", "_").replace(" ", "")


def tag_dir(root: Path | str, tag: str) -> Path:
    return Path(root) / tag


def runs_dir(root: Path | str, tag: str) -> Path:
    return tag_dir(root, tag) / "runs"


def run_dir(root: Path | str, tag: str, rid: str) -> Path:
    return runs_dir(root, tag) / rid


def table_path(root: Path | str, tag: str, name: str) -> Path:
    if name not in TABLES:
        raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}")
    return tag_dir(root, tag) / f"{name}.csv"


def provenance_path(root: Path | str, tag: str) -> Path:
    return tag_dir(root, tag) / "provenance.json"


def figures_dir(root: Path | str, tag: str) -> Path:
    return tag_dir(root, tag) / "figures"


def compare_paths(root: Path | str, baseline: str, candidate: str) -> tuple[Path, Path]:
    folder, stem = Path(root) / "compare", f"{baseline}_vs_{candidate}"   # tags hold dots: no with_suffix
    return folder / f"{stem}.md", folder / f"{stem}.json"


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


def iter_runs(folder: Path | str) -> Iterable[tuple[dict[str, Any], Path]]:
    """(record, run folder) of every finished run in a folder of run folders, sorted by name."""
    folder = Path(folder)
    if not folder.exists():
        return
    for rdir in sorted(p for p in folder.iterdir() if p.is_dir()):
        rec = read_metrics(rdir)
        if rec is not None:
            yield rec, rdir


def read_table(root: Path | str, tag: str, name: str):
    """A tidy table as a pandas DataFrame (empty, with its columns, when the file is empty)."""
    import pandas as pd

    # Text columns stay text: an empty options label or reason is "", not NaN.
    text = {c: str for c in ("run_id", "options", "reason", "message", "location", "category",
                             "status", "variant", "scaling", "setup", "quantity", "reference")
            if c in TABLES[name]}
    return pd.read_csv(table_path(root, tag, name), keep_default_na=False, na_values=[""],
                       dtype=text).fillna({c: "" for c in text})
