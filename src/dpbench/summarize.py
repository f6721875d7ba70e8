"""results/<tag>/summary.md: provenance, headline ratios, medians over repeats, skipped and
failed runs, and warnings, all from the tidy tables and provenance.json.

Also the small table helpers that plots.py shares, so the figures and the text compute
speed-up and scaling efficiency the same way.

    python -m dpbench.summarize --results-dir results --tag TAG
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from dpbench import DP_VARIANTS, VARIANTS, results
from dpbench.markdown import md_table

SUMMARY_MD = "summary.md"

# Everything else in the tidy tables is numeric (null when not measured).
TEXT_COLUMNS = {"run_id", "variant", "options", "status", "reason", "category", "message",
                "location", "precision", "feed", "dataset", "device_type"}
SORT_KEYS = ["options", "variant", "gpus", "repeat", "device", "epoch", "step", "category",
             "message", "rank"]
GROUP = ["options", "variant", "gpus"]

PROVENANCE_KEYS = [("torch", "torch"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL"),
                   ("driver", "driver"), ("gpu_names", "GPUs"), ("python", "Python"),
                   ("hostname", "host"), ("git_sha", "git"), ("n_runs", "runs")]

# (summary column, header, format) for the medians table.
MEDIAN_COLUMNS = [
    ("images_per_s", "images/s", "{:,.0f}"),
    ("speedup", "× single", "{:.2f}"),
    ("efficiency", "efficiency", "{:.0%}"),
    ("step_ms_p50", "step ms p50", "{:.1f}"),
    ("peak_mem_mib", "peak MiB", "{:,.0f}"),
    ("mem_dev0_over_mean_others", "dev0 / others", "{:.2f}"),
    ("final_loss", "final loss", "{:.3f}"),
    ("test_acc", "test acc", "{:.3f}"),
    ("n_warnings", "warnings", "{:.0f}"),
]


# -- tables ---------------------------------------------------------------------------------

def variant_rank(variant: str) -> int:
    return VARIANTS.index(variant) if variant in VARIANTS else len(VARIANTS)


def variant_order(values: Iterable[str]) -> list[str]:
    """Known variants in the fixed order, then any others alphabetically."""
    return sorted(set(values), key=lambda v: (variant_rank(v), v))


def natural_key(text: str) -> list:
    """'global_batch=128' before 'global_batch=1024': digit runs compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def ordered(values: Iterable) -> list:
    """Distinct values, sorted numerically or naturally (for options labels)."""
    distinct = set(values)
    return sorted(distinct, key=natural_key if all(isinstance(v, str) for v in distinct) else None)


def _sort_key(col: pd.Series) -> pd.Series:
    if col.name == "variant":
        return col.map(variant_rank)
    if col.name == "options":
        return col.map({v: i for i, v in enumerate(ordered(col))})
    return col


def load_table(results_dir: Path | str, tag: str, name: str) -> pd.DataFrame:
    """A tidy table with text columns as str ('' for empty) and the rest numeric, sorted.

    A table with no rows reads back with untyped columns, and some text columns (precision,
    feed, ...) are not text for read_table; both would break grouping and plotting.
    """
    df = results.read_table(results_dir, tag, name)
    for col in df.columns:
        if col in TEXT_COLUMNS:
            df[col] = df[col].astype(object).fillna("").astype(str)
        else:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    keys = [k for k in SORT_KEYS if k in df.columns]
    return df.sort_values(keys, key=_sort_key, kind="stable").reset_index(drop=True)


def ok_runs(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["status"] == results.STATUS_OK]


def only_ok(table: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Rows of a per-run table that belong to ok runs (failed runs leave partial records)."""
    return table[table["run_id"].isin(ok_runs(summary)["run_id"])]


def single_medians(ok: pd.DataFrame) -> pd.Series:
    """Median images/s of the single-device runs, per options label."""
    single = ok[ok["variant"] == "single"]
    return single.groupby("options")["images_per_s"].median()


def with_efficiency(ok: pd.DataFrame) -> pd.DataFrame:
    """Adds speedup (vs single's median, same options) and efficiency (speedup / gpus).

    Rows whose options have no single baseline get NaN.
    """
    base = ok["options"].map(single_medians(ok))
    return ok.assign(speedup=ok["images_per_s"] / base,
                     efficiency=ok["images_per_s"] / (ok["gpus"] * base))


def medians(summary: pd.DataFrame) -> pd.DataFrame:
    """Medians over the repeats of the ok runs, one row per (options, variant, gpus).

    speedup and efficiency are recomputed from the median images/s, so the headline
    reads as median(variant) / median(single).
    """
    ok = ok_runs(summary)
    cols = [c for c, _, _ in MEDIAN_COLUMNS if c not in ("speedup", "efficiency")]
    groups = ok.groupby(GROUP, sort=False)
    med = groups[cols].median().assign(n_ok=groups.size()).reset_index()
    base = med["options"].map(single_medians(ok))
    med["speedup"] = med["images_per_s"] / base
    med["efficiency"] = med["speedup"] / med["gpus"]
    return med.sort_values(GROUP, key=_sort_key, kind="stable").reset_index(drop=True)


# -- markdown -------------------------------------------------------------------------------

def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def fmt(value: Any, spec: str = "{}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return spec.format(value)


def _fmt_gpus(value: Any) -> str:
    """gpu_names is a list per run (the GPUs it could see); runs on 1 and on 2 GPUs disagree.
    Show the models and the most GPUs any run saw: '2 × NVIDIA H200'."""
    lists = value if value and isinstance(value[0], list) else [value or []]
    widest = max(lists, key=len)
    models = sorted(set(widest))
    return ", ".join(f"{widest.count(m)} × {m}" for m in models) or "none"


def _fmt_provenance(value: Any) -> str:
    # A list means the runs disagreed.
    if isinstance(value, list):
        return "; ".join(_fmt_provenance(v) for v in value) or "n/a"
    return "n/a" if value in (None, "") else str(value)


def gpus_label(gpus: int) -> str:
    return f"{gpus} GPU" + ("" if gpus == 1 else "s")


# -- sections -------------------------------------------------------------------------------

def provenance_section(results_dir: Path | str, tag: str) -> str:
    path = results.tag_dir(results_dir, tag) / "provenance.json"
    if not path.exists():
        return "## Provenance\n\nNo provenance.json was written (no finished runs?).\n"
    prov = results.read_json(path)
    rows = [[label, _fmt_gpus(prov.get(key)) if key == "gpu_names" else _fmt_provenance(prov.get(key))]
            for key, label in PROVENANCE_KEYS]
    return "## Provenance\n\n" + md_table(["", "value"], rows) + "\n"


def headline_line(row: pd.Series) -> str:
    """e.g. 'ddp on 2 GPUs: 1.77× single (efficiency 88%), 17,700 images/s'."""
    where = f"{row['variant']} on {gpus_label(row['gpus'])}"
    speed = fmt(row["images_per_s"], "{:,.0f}") + " images/s"
    if row["variant"] == "single":
        text = f"{where}: {speed} (baseline)"
    elif math.isnan(row["speedup"]):
        text = f"{where}: {speed} (no single baseline)"
    else:
        text = (f"{where}: {row['speedup']:.2f}× single "
                f"(scaling efficiency {row['efficiency']:.0%}), {speed}")
    ratio = row["mem_dev0_over_mean_others"]
    if row["variant"] in DP_VARIANTS and row["gpus"] > 1 and not math.isnan(ratio):
        text += f"; device 0 holds {ratio:.2f}× the mean of the other devices' memory"
    return f"- {text}"


def headline_section(med: pd.DataFrame) -> str:
    out = ["## Headline (medians over repeats)", ""]
    if med.empty:
        return "\n".join(out + ["No successful runs.", ""])
    for options, group in med.groupby("options", sort=False):
        if options:
            out += [f"### {options}", ""]
        out += [headline_line(row) for _, row in group.iterrows()] + [""]
    return "\n".join(out)


def medians_section(med: pd.DataFrame) -> str:
    out = ["## Summary medians (ok runs)", ""]
    if med.empty:
        return "\n".join(out + ["No successful runs.", ""])
    with_options = (med["options"] != "").any()
    headers = ["variant", "gpus"] + (["options"] if with_options else []) + ["ok runs"]
    headers += [h for _, h, _ in MEDIAN_COLUMNS]
    rows = []
    for _, r in med.iterrows():
        row = [r["variant"], str(r["gpus"])] + ([r["options"]] if with_options else [])
        row += [str(r["n_ok"])] + [fmt(r[c], spec) for c, _, spec in MEDIAN_COLUMNS]
        rows.append(row)
    right = [1] + list(range(len(headers) - len(MEDIAN_COLUMNS) - 1, len(headers)))
    return "\n".join(out + [md_table(headers, rows, right=right), ""])


def not_ok_section(summary: pd.DataFrame) -> str:
    """Skipped and failed runs, each distinct reason once with the runs that gave it."""
    out = ["## Skipped and failed runs", ""]
    bad = summary[summary["status"] != results.STATUS_OK]
    if bad.empty:
        return "\n".join(out + ["None: every recorded run finished.", ""])
    bad = bad.assign(reason=bad["reason"].map(one_line).replace("", "(no reason given)"))
    for status, by_status in bad.groupby("status", sort=True):
        out += [f"### {status} ({len(by_status)})", ""]
        for reason, group in by_status.groupby("reason", sort=True):
            ids = ", ".join(f"`{rid}`" for rid in group["run_id"])
            out.append(f"- {reason}: {ids}")
        out.append("")
    return "\n".join(out)


def warnings_section(warnings: pd.DataFrame) -> str:
    """Per variant, each distinct warning once with its total count over all runs."""
    out = ["## Warnings", ""]
    if warnings.empty:
        return "\n".join(out + ["No warnings recorded.", ""])
    # A recorded warning happened at least once even when its count was not kept.
    warnings = warnings.assign(count=warnings["count"].fillna(1),
                               message=warnings["message"].map(one_line))
    for variant in variant_order(warnings["variant"]):
        rows = warnings[warnings["variant"] == variant]
        out += [f"### {variant}", ""]
        totals = rows.groupby(["category", "message"], sort=True).agg(
            count=("count", "sum"), runs=("run_id", "nunique"), location=("location", "first"))
        for (category, message), t in totals.iterrows():
            where = f" (at `{t['location']}`)" if t["location"] else ""
            out.append(f"- {category} ×{t['count']:,.0f} in {t['runs']} run(s){where}: {message}")
        out.append("")
    return "\n".join(out)


def render_summary(results_dir: Path | str, tag: str) -> str:
    summary = load_table(results_dir, tag, "summary")
    warnings = load_table(results_dir, tag, "warnings")
    med = medians(summary)
    ran = ok_runs(summary)
    # Without CUDA the engine runs single and ddp on the CPU: a "GPU" count is a process count.
    cpu_note = ("_These runs ran on the CPU (no CUDA device): \"GPUs\" below count ddp's gloo "
                "processes, and the timings say nothing about GPUs._\n"
                if len(ran) and (ran["device_type"] == "cpu").all() else "")
    sections = [f"# dpbench results: {tag}\n", cpu_note, provenance_section(results_dir, tag),
                headline_section(med), medians_section(med), not_ok_section(summary),
                warnings_section(warnings)]
    return "\n".join(s for s in sections if s).rstrip() + "\n"


def write_summary_md(results_dir: Path | str, tag: str) -> Path:
    path = results.tag_dir(results_dir, tag) / SUMMARY_MD
    results.write_atomic(path, render_summary(results_dir, tag))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write results/<tag>/summary.md.")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", required=True)
    args = parser.parse_args(argv)
    print(write_summary_md(args.results_dir, args.tag))


if __name__ == "__main__":
    main()
