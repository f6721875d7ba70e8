"""The tidy tables' schema: each table's name, columns and their dtypes, in one place.

collect writes the tables with these columns; `dpbench.results.read_table` reads them back by
these dtypes (text, a flag, or a number), for every reader alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal

# pandas and numpy load only where a table is read: the launcher of every run imports results
# and reads no table, and pandas would double its start-up (0.4 s of 0.45 s).
if TYPE_CHECKING:
    import pandas as pd

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
    # what the run trained: its workload's name or factory (records before workloads: the default)
    "workload",
    # throughput in the workload's own unit (rate: images/s for images, tokens/s for tokens; its
    # unit in rate_unit), and the step's regime: the host's time to issue one step from an idle
    # device and whether the host or the device set the pace (results.formats.step_bound)
    "sample_unit", "samples_per_s", "tokens_per_s", "rate", "rate_unit", "host_step_ms", "bound",
    # its ranks shared one GPU (the run option rehearse): memory per rank, no speed of anyone's
    "rehearsed",
]
# data_mib: the dataset resident on that device (gpu feed), part of allocated_mib; subtract it
# to compare what the model and optimizer cost per device.
MEMORY_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "device",
                  "allocated_mib", "reserved_mib", "nvml_used_mib", "data_mib"]
# The sharded work's memory by component (issue 26): one row per run and device of a record with
# memory_components. The measured columns are the record's (MiB of the tensors the rank holds, and
# the allocator's peaks during one profiled step); state_mib: allocated as that step's forward
# began, its dataset left out; parameters: the model's count; predicted_*: the closed forms
# (dpbench.analysis.memory_model).
MEMORY_COMPONENT_MEASURED = ["parameters_mib", "gradients_mib", "optimizer_mib", "largest_unit_mib",
                             "forward_peak_mib", "backward_peak_mib", "step_peak_mib",
                             "activation_peak_mib", "reserved_peak_mib", "largest_gather_mib",
                             "nvml_process_mib", "forward_end_mib", "zero_grad_end_mib",
                             "model_forward_peak_mib", "forward_last_gather_mib",
                             "forward_last_unit_start_mib", "backward_start_peak_mib",
                             "backward_late_peak_mib", "loss_peak_mib"]
# what the memory model predicts, each a predicted_<name>_mib column (analysis.memory_model fills them)
PREDICTED_COMPONENTS = ("parameters", "gradients", "optimizer", "buckets", "state", "unsharded", "largest_unit",
                        "held_at_peak", "gather_kept")
MEMORY_COMPONENT_COLUMNS = (["run_id", "variant", "gpus", "options", "repeat", "device", "parameters"]
                            + MEMORY_COMPONENT_MEASURED + ["data_mib", "state_mib"]
                            + [f"predicted_{c}_mib" for c in PREDICTED_COMPONENTS] + ["rehearsed"])
# One training step's collectives as rank 0 counted them (count, payload bytes), beside the
# formulas' payload and ring bytes per rank (dpbench.analysis.traffic_model).
COLLECTIVE_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "collective", "count", "bytes",
                      "predicted_bytes", "predicted_wire_bytes", "source"]
WARNING_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "category", "message",
                   "count", "first_step", "location", "rank"]
ACCURACY_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat", "epoch", "test_acc", "test_loss"]
RUN_STEP_COLUMNS = ["run_id", "variant", "gpus", "options", "repeat"] + STEP_COLUMNS
# medians.csv: cells.csv in long form (the references' layout), one row per cell (options, variant,
# gpus) and quantity: a median over the ok repeats or a ratio of medians (speed-up, efficiency against `reference`), with its distribution-free
# interval and that interval's confidence (ci_level: 0.75 for the range of 3 repeats).
CELL_COLUMNS = ["options", "setup", "variant", "gpus", "scaling", "global_batch", "per_gpu_batch",
                "quantity", "n", "reference", "value", "ci_low", "ci_high", "ci_level"]
# runs.csv: the summary's row of every run, with the identities its plan gave it (cell_id, group;
# `setup` is the plan's setup_id): what the summary, figures and perf targets read by cell_id.
RUN_COLUMNS = ["run_id", "cell_id", "group"] + SUMMARY_COLUMNS[1:]
# cells.csv: one row a cell (cell_id, from the plan), its facts, n_ok (the ok repeats), and each
# quantity's median or ratio of medians with its interval (<q>, <q>_ci_low, <q>_ci_high,
# <q>_ci_level), computed once by collect (dpbench.analysis.tables.cells); rate is in rate_unit.
CELL_MEDIANS = ("rate", "images_per_s", "step_ms_p50", "peak_mem_mib", "mem_dev0_over_mean_others",
                "final_loss", "test_acc", "n_warnings")
CELL_RATIOS = ("speedup_strong", "efficiency_strong", "speedup_weak", "efficiency_weak")
CELLS_COLUMNS = (["cell_id", "options", "setup", "variant", "gpus", "scaling", "global_batch", "per_gpu_batch",
                  "n_ok", "precision", "rate_unit", "bound", "rehearsed", "label"]
                 + [f"{q}{end}" for q in CELL_MEDIANS + CELL_RATIOS for end in ("", "_ci_low", "_ci_high", "_ci_level")]
                 + [f"{kind}_reference{end}" for kind in ("strong", "weak") for end in ("", "_n")])
# The claims' own tables (the ledger writes them from the probes' records, not collect from the
# runs'): largest_batch, one row per (workload size, variant, GPUs, precision) of C9's search: the
# largest per-GPU batch that trained within cap_gib allocated per GPU, the throughput a short timed
# run reached there, and why a search found none (reason).
LARGEST_BATCH_COLUMNS = ["workload", "parameters", "variant", "reshard_after_forward", "gpus", "precision",
                         "largest_batch", "samples_per_s_at_largest", "cap_gib", "reason",
                         # the budget's name (the devices it stands for), whether the ranks were
                         # rehearsed on one GPU (then no samples/s), the memory model's largest batch
                         "budget", "rehearsed", "predicted_largest_batch",
                         "smallest_failing"]   # the search's bracket: the largest fits, this does not

# Tables added after result sets were archived: a set without the file reads as having no rows.
LATER_TABLES = ("memory_components", "collectives", "runs", "cells")

# Columns that hold text in every table: an empty options label or reason reads as "", not NaN.
TEXT_COLUMNS = ("run_id", "options", "reason", "message", "location", "category", "status",
                "variant", "scaling", "setup", "quantity", "reference", "precision", "feed",
                "dataset", "device_type", "workload", "collective", "sample_unit", "rate_unit", "bound",
                "source", "budget", "cell_id", "group", "label", "strong_reference", "weak_reference")
# Columns that hold True/False (written by csv as the words).
FLAG_COLUMNS = ("deterministic", "reshard_after_forward", "rehearsed")
# Numeric columns that count or index something: empty is never a value there.
KEY_COLUMNS = ("gpus", "repeat", "epoch", "step", "device")
# What reads as a number though pandas leaves it text in a column with damaged cells.
NUMBER_WORDS = {"nan", "inf", "-inf", "+inf", "infinity", "-infinity"}

Dtype = Literal["text", "flag", "number"]


def dtype(column: str) -> Dtype:
    """A column's dtype, the same in every table it appears in."""
    if column in TEXT_COLUMNS:
        return "text"
    return "flag" if column in FLAG_COLUMNS else "number"


class TableError(ValueError):
    """A table that cannot be read as its schema says; the message names the file (and column)."""


@dataclass(frozen=True)
class TableSchema:
    name: str
    columns: list[str]

    @property
    def text(self) -> list[str]:
        return [c for c in self.columns if dtype(c) == "text"]

    def typed(self, df: "pd.DataFrame") -> "pd.DataFrame":
        """Every column by its dtype: text as str ('' for empty), flags as bool, the rest numeric
        (NaN where a value is no number). A table with no rows reads back untyped without this."""
        import pandas as pd   # only where a table is read (see the top)

        df = df.copy()
        for col in df.columns:
            kind = dtype(col)
            if kind == "text":
                df[col] = df[col].astype(object).where(df[col].notna(), "").astype(str)
            elif kind == "flag":
                df[col] = df[col].map(lambda v: str(v).strip().lower() in ("true", "1", "1.0"))
            else:
                df[col] = pd.to_numeric(df[col], errors="coerce")
        return df

    def checked(self, df: "pd.DataFrame", path: object, require: Iterable[str]) -> "pd.DataFrame":
        """The required columns present, those of them that are numbers numeric, and key columns
        never empty; else a TableError that names the file, the column and the line."""
        import numpy as np   # only where a table is read (see the top)
        import pandas as pd

        require = list(dict.fromkeys(require))
        missing = [c for c in require if c not in df.columns]
        if missing:
            raise TableError(f"{path} has no column {missing[0]!r}"
                             + (f" (nor {', '.join(map(repr, missing[1:]))})" if missing[1:] else ""))
        numeric = [c for c in require if dtype(c) == "number"]
        for col in numeric:
            if pd.api.types.is_numeric_dtype(df[col]):
                continue
            values = pd.to_numeric(df[col], errors="coerce")
            raw = df[col].astype(str).str.strip()
            bad = values.isna() & df[col].notna() & ~raw.str.lower().isin(NUMBER_WORDS | {""})
            if bad.any():
                i = int(np.flatnonzero(bad.to_numpy())[0])
                raise TableError(f"{path}: column {col!r} holds a non-numeric value {raw.iloc[i]!r} "
                                 f"(line {i + 2})")
            df[col] = values
        for col in (c for c in KEY_COLUMNS if c in numeric):
            if df[col].isna().any():
                i = int(np.flatnonzero(df[col].isna().to_numpy())[0])
                raise TableError(f"{path}: column {col!r} is empty at line {i + 2}")
        return df


SCHEMAS = {schema.name: schema for schema in (
    TableSchema("summary", SUMMARY_COLUMNS),
    TableSchema("runs", RUN_COLUMNS),
    TableSchema("cells", CELLS_COLUMNS),
    TableSchema("medians", CELL_COLUMNS),
    TableSchema("memory", MEMORY_COLUMNS),
    TableSchema("warnings", WARNING_COLUMNS),
    TableSchema("accuracy", ACCURACY_COLUMNS),
    TableSchema("steps", RUN_STEP_COLUMNS),
    TableSchema("memory_components", MEMORY_COMPONENT_COLUMNS),
    TableSchema("collectives", COLLECTIVE_COLUMNS),
)}
# The columns of each table, by name (the order collect writes them in).
TABLES = {name: schema.columns for name, schema in SCHEMAS.items()}
CLAIM_SCHEMAS = {schema.name: schema for schema in (TableSchema("largest_batch", LARGEST_BATCH_COLUMNS),)}
