"""The tidy tables read back: typed, sorted, the summary with the defaults of older tables, and
the runs a table of speeds or a per-run table may count."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpbench import results
from dpbench.analysis.options import ordered, variant_rank, without_batch

SORT_KEYS = ["options", "variant", "gpus", "repeat", "device", "epoch", "step", "category",
             "message", "rank", "quantity"]


def _sort_key(col: pd.Series) -> pd.Series:
    if col.name == "variant":
        return col.map(variant_rank)
    if col.name == "options":
        return col.map({v: i for i, v in enumerate(ordered(col))})
    return col


def sort(df: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in SORT_KEYS if k in df.columns]
    return df.sort_values(keys, key=_sort_key, kind="stable").reset_index(drop=True)


def with_run_defaults(summary: pd.DataFrame) -> pd.DataFrame:
    """Fills what tables written before strong/weak scaling lack, by results.RunRecord's rules
    for records without those fields: such runs are strong, their per-GPU batch is global/gpus,
    they are not deterministic (a table holds no config, so an unknown seed stays empty).

    Their setup is the options without the batch fields plus the precision. It is not
    collect.setup_key (a hash of the run's config), which needs the config a table does not
    hold; the two never meet in one comparison: collect writes the hash for every record with a
    config, so the fallback fills whole tables written before the column existed, or the failed
    row of a damaged record, which no cell counts."""
    df = summary.copy()
    legacy = results.RunRecord(run_id="", status="")   # what a record without these fields reads as
    for col, default in (("scaling", ""), ("setup", ""), ("per_gpu_batch", np.nan),
                         ("seed", np.nan), ("deterministic", legacy.deterministic), ("rehearsed", False)):
        if col not in df.columns:
            df[col] = default
    df["scaling"] = df["scaling"].replace("", results.planned_scaling({}))
    planned = [results.planned_per_gpu_batch({"global_batch": b}, g)
               for b, g in zip(df["global_batch"], df["gpus"])]
    df["per_gpu_batch"] = df["per_gpu_batch"].fillna(pd.Series(planned, index=df.index, dtype=float))
    fallback = [results.options_label(without_batch(o)) + "|" + str(p)
                for o, p in zip(df["options"], df["precision"])]
    df["setup"] = df["setup"].where(df["setup"] != "", pd.Series(fallback, index=df.index, dtype=str))
    return df


def load_table(results_dir: Path | str, tag: str, name: str) -> pd.DataFrame:
    """A tidy table, typed and sorted; the summary with the defaults of with_run_defaults."""
    df = results.SCHEMAS[name].typed(results.read_table(results_dir, tag, name))
    if name == "summary":
        df = with_run_defaults(df)
    return sort(df)


def ok_runs(summary: pd.DataFrame) -> pd.DataFrame:
    ok = summary[summary["status"] == results.STATUS_OK]
    if "rate" not in ok.columns:   # a summary.csv from before the workload's unit: images only
        ok = ok.assign(rate=ok["images_per_s"], rate_unit="images/s", bound=None)
    return ok


def speed_runs(table: pd.DataFrame) -> pd.DataFrame:
    """Rows (runs or cells) whose speed is a speed: not rehearsed (N ranks sharing one GPU over
    gloo measure memory per rank; their step times never enter a throughput or scaling table)."""
    if "rehearsed" not in table.columns:
        return table
    return table[~table["rehearsed"].fillna(False).astype(bool)]


def only_ok(table: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Rows of a per-run table that belong to ok runs (failed runs leave partial records)."""
    return table[table["run_id"].isin(ok_runs(summary)["run_id"])]
