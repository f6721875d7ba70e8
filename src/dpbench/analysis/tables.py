"""The tidy-table layer: read the tables, order them, describe option sets in words, and compute
medians, strong and weak scaling efficiencies and their confidence intervals.

summarize.py (summary.md), plots.py (figures) and collect.py (medians.csv) all ask this module,
so a number means the same thing in every place it appears.

Strong and weak scaling. A run on k GPUs at global batch B with per-GPU batch b = B / k is
compared with `single` runs of the same setup (every option equal but the batch fields):

    strong efficiency = images/s_k(B) / (k × images/s_single(B))   same global batch
    weak efficiency   = images/s_k(k·b) / (k × images/s_single(b))  same per-GPU batch

Both are computed wherever the matching single runs exist, whichever way the run was planned
(`scaling` says how it was planned).

Intervals come from the order of the repeats alone (no assumption about their distribution),
and each carries the confidence it has: a handful of repeats cannot give 95%, and a bootstrap
of three values would call their range 95% when it holds the median three times in four.
The medians, ratios and their intervals stay in one module (a little over 450 lines) so that
summary, figures and medians.csv cannot compute a number two ways.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from dpbench import VARIANTS, results
from dpbench.analysis.cells import CELL_FACTS, CELL_KEY

SORT_KEYS = ["options", "variant", "gpus", "repeat", "device", "epoch", "step", "category",
             "message", "rank", "quantity"]
BATCH_KEYS = ("global_batch", "per_gpu_batch")
STRONG, WEAK = "strong", "weak"

# The confidence an interval aims at. Intervals are distribution-free (order statistics of the
# repeats), so their confidence follows from the number of repeats alone; with too few repeats
# for this level an interval is the full range, at the lower confidence it has, and says so.
CONFIDENCE = 0.95
NO_INTERVAL = "n=1, no interval"

# Quantities of a cell (options, variant, gpus): a median over its ok repeats, or a ratio of
# medians against the matching single runs. (name, what it is, interval?)
MEDIANS = [
    ("rate", "median throughput in the workload's unit (the cell's rate_unit)", True),
    ("images_per_s", "median images/s", True),
    ("step_ms_p50", "median step time (ms)", False),
    ("peak_mem_mib", "median peak allocated MiB", True),
    ("mem_dev0_over_mean_others", "device 0's memory over the others' mean", True),
    ("final_loss", "median final loss", False),
    ("test_acc", "median test accuracy", False),
    ("n_warnings", "median warnings", False),
]
RATIOS = [   # (name, scaling kind, divided by gpus?)
    ("speedup_strong", STRONG, False),
    ("efficiency_strong", STRONG, True),
    ("speedup_weak", WEAK, False),
    ("efficiency_weak", WEAK, True),
]
RATIO_NAMES = {name for name, _, _ in RATIOS}
# A cell's key and facts, in the column order of the cell table (medians.csv).
CELL_IDENT = [c for c in results.CELL_COLUMNS if c in CELL_KEY + CELL_FACTS]


# -- order and words ------------------------------------------------------------------------

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


def gpus_label(gpus: int) -> str:
    return f"{int(gpus)} GPU" + ("" if gpus == 1 else "s")


def parse_options(label: str | dict | None) -> dict[str, Any]:
    """An options label ('channels_last=True,global_batch=1024') back into a dict of values."""
    if isinstance(label, dict):
        return dict(label)
    out: dict[str, Any] = {}
    for part in filter(None, (label or "").split(",")):
        key, _, text = part.partition("=")
        out[key.strip()] = _value(text.strip())
    return out


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    if text in ("None", ""):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# How an option reads. Format-like settings join with " + " ("bf16 + channels_last"); the rest
# follow as ", "-separated phrases; the batch comes last.
_FORMAT_WORDS = {
    "precision": lambda v: str(v),
    "channels_last": lambda v: "channels_last" if v else "NCHW",
    "tf32": lambda v: "TF32" if v else "no TF32",
    "compile": lambda v: "eager" if v in (None, "none") else f"compile {v}",
    "deterministic": lambda v: "deterministic" if v else "non-deterministic",
}
_PHRASES = {
    "cudnn_benchmark": lambda v: f"cudnn.benchmark {'on' if v else 'off'}",
    "max_steps": lambda v: f"{_num(v)} steps",
    "epochs": lambda v: f"{_num(v)} epoch" + ("" if v == 1 else "s"),
    "batchnorm": lambda v: f"BatchNorm {v}",
    "feed": lambda v: {"gpu": "GPU-resident data", "torch": "DataLoader feed",
                       "fixed": "one fixed batch"}.get(v, f"feed {v}"),
    "workers": lambda v: f"{_num(v)} workers",
    "num_classes": lambda v: f"{_num(v)} classes",
    "bucket_cap_mb": lambda v: f"{_num(v)} MB buckets",
    "lr": lambda v: f"lr {_num(v)}",
    "warmup_steps": lambda v: f"{_num(v)} warm-up steps",
}


def describe(options: str | dict | None, precision: str | None = None,
             global_batch: Any = None, per_gpu_batch: Any = None,
             scaling: str | None = None) -> str:
    """An option set in words: 'bf16 + channels_last, batch 1024', 'fp32, 512 per GPU'.

    Explicit arguments (a run's own precision and batch) win over the label's values. The batch
    is said the way the run was planned: the global batch for strong scaling, the per-GPU batch
    for weak.
    """
    opts = parse_options(options)
    if precision:
        opts["precision"] = precision
    opts = {k: v for k, v in opts.items() if v is not None or k in _FORMAT_WORDS}
    fmt = [_FORMAT_WORDS[k](opts[k]) for k in _FORMAT_WORDS if k in opts]
    phrases = []
    for key in sorted(k for k in opts if k not in _FORMAT_WORDS and k not in BATCH_KEYS):
        word = _PHRASES.get(key, lambda v, k=key: f"{k.replace('_', ' ')} " +
                            ({True: "on", False: "off"}.get(v, _num(v)) if isinstance(v, bool)
                             else _num(v)))
        phrases.append(word(opts[key]))
    gb = global_batch if global_batch is not None else opts.get("global_batch")
    pb = per_gpu_batch if per_gpu_batch is not None else opts.get("per_gpu_batch")
    if scaling == WEAK and _present(pb):
        phrases.append(f"{_num(pb)} per GPU")
    elif _present(gb):
        phrases.append(f"batch {_num(gb)}")
    elif _present(pb):
        phrases.append(f"{_num(pb)} per GPU")
    return ", ".join(p for p in [" + ".join(fmt)] + phrases if p)


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def label(row: Any) -> str:
    """The words for a run's or a cell's option set, batch said the way it was planned."""
    return describe(row["options"], row.get("precision") or None, row.get("global_batch"),
                    row.get("per_gpu_batch"), row.get("scaling"))


def labels(df: pd.DataFrame) -> pd.Series:
    """label() of every row; the fields a table lacks count as absent."""
    return pd.Series([label(r) for r in df.to_dict("records")], index=df.index, dtype=str)


def label_order(df: pd.DataFrame) -> list[str]:
    """The distinct labels of a table's rows in reading order: plain settings first (fewest
    options besides the batch), then by their words; strong before weak; batches increasing."""
    def key(r):
        rest = without_batch(r["options"])
        batch = r["global_batch"] if r["scaling"] == STRONG else r["per_gpu_batch"]
        return (len(rest), describe(rest, r.get("precision") or None), r["scaling"] != STRONG,
                batch, r["label"])
    firsts = df.drop_duplicates("label").to_dict("records")
    return [r["label"] for r in sorted(firsts, key=key)]


def without_batch(options: str | dict | None) -> dict[str, Any]:
    return {k: v for k, v in parse_options(options).items() if k not in BATCH_KEYS}


# -- reading --------------------------------------------------------------------------------

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


# -- intervals ------------------------------------------------------------------------------

class Estimate(NamedTuple):
    """A median or a ratio of medians, with its interval and that interval's confidence (the
    probability that it holds the true value; NaN bounds and level when there is none). For a
    ratio the level is a lower bound (at_least): the interval can hold the ratio when a side's
    interval misses its median."""
    value: float
    low: float
    high: float
    level: float
    at_least: bool = False


NONE = Estimate(math.nan, math.nan, math.nan, math.nan)


def range_coverage(n: int, k: int = 1) -> float:
    """Confidence that the k-th smallest and k-th largest of n values hold their population's
    median: each value falls below it with probability 1/2, so the count below is binomial."""
    return float(1 - 2 * stats.binom.cdf(k - 1, n, 0.5))


def repeats_for(level: float) -> int:
    """The fewest values whose full range holds the median with at least `level` confidence."""
    n = 2
    while range_coverage(n) < level:
        n += 1
    return n


def ratio_repeats_for(level: float) -> tuple[int, int]:
    """The fewest repeats in all, (a, b) with a <= b, whose two ranges bound a ratio's confidence
    at `level` or more."""
    total = 4
    while True:
        for a in range(2, total // 2 + 1):
            if range_coverage(a) * range_coverage(total - a) >= level:
                return a, total - a
        total += 1


def _order_interval(x: np.ndarray, level: float) -> tuple[float, float, float]:
    """(low, high, confidence): the narrowest order-statistic interval of at least `level`
    confidence, or the full range (and its own confidence) when n is too small for it."""
    s, n, k = np.sort(x), len(x), 1
    while k + 1 <= n // 2 and range_coverage(n, k + 1) >= level:
        k += 1
    return float(s[k - 1]), float(s[n - k]), range_coverage(n, k)


def median_ci(values: Iterable[float]) -> Estimate:
    """The median with its distribution-free interval; no interval with fewer than 2 values."""
    x = np.asarray([v for v in values if _present(v)], dtype=float)
    if len(x) == 0:
        return NONE
    if len(x) < 2:
        return Estimate(float(np.median(x)), math.nan, math.nan, math.nan)
    return Estimate(float(np.median(x)), *_order_interval(x, CONFIDENCE))


def ratio_ci(num: Iterable[float], den: Iterable[float], scale: float = 1.0) -> Estimate:
    """median(num) / (scale × median(den)), with the interval that spans the two medians'
    intervals (low over high, high over low): when both hold their medians it holds the ratio,
    so for independent groups its confidence is at least the product of theirs (each aims at
    the square root of CONFIDENCE; simulated, 3 and 3 normal repeats are covered about 90% of
    the time, against the 56% bound). No interval unless each group has 2 positive values."""
    a = np.asarray([v for v in num if _present(v)], dtype=float)
    b = np.asarray([v for v in den if _present(v)], dtype=float)
    if len(a) == 0 or len(b) == 0 or np.median(b) == 0:
        return NONE
    value = float(np.median(a) / (scale * np.median(b)))
    if len(a) < 2 or len(b) < 2 or min(a.min(), b.min()) <= 0:
        return Estimate(value, math.nan, math.nan, math.nan)
    lo_a, hi_a, conf_a = _order_interval(a, math.sqrt(CONFIDENCE))
    lo_b, hi_b, conf_b = _order_interval(b, math.sqrt(CONFIDENCE))
    return Estimate(value, lo_a / (scale * hi_b), hi_a / (scale * lo_b), conf_a * conf_b, at_least=True)


# -- strong and weak scaling ----------------------------------------------------------------

def _batch(value: float) -> float | None:
    """A batch size usable as a key (a fractional per-GPU batch has no single run to match)."""
    return float(value) if _present(value) and float(value).is_integer() else None


def single_pools(ok: pd.DataFrame) -> dict[tuple[str, float], np.ndarray]:
    """Throughput (in the workload's unit) of the ok single runs, by (setup, global batch)."""
    single = ok[(ok["variant"] == "single") & ok["rate"].notna()]
    return {(s, float(g)): grp["rate"].to_numpy()
            for (s, g), grp in single.groupby(["setup", "global_batch"], sort=True)}


def reference_batch(kind: str, global_batch: float, per_gpu_batch: float) -> float | None:
    """The global batch of the single runs a scaling kind compares with."""
    return _batch(global_batch) if kind == STRONG else _batch(per_gpu_batch)


def reference_text(kind: str, batch: float | None) -> str:
    if batch is None:
        return ""
    return f"single at global batch {_num(batch)}" + (" (the per-GPU batch)" if kind == WEAK else "")


def with_efficiency(ok: pd.DataFrame) -> pd.DataFrame:
    """Each ok run with its own speedup_{strong,weak} and efficiency_{strong,weak}: its images/s
    against the median of the matching single runs (NaN where none ran)."""
    pools = single_pools(ok)
    out = ok.copy()
    for name, kind, per_gpu in RATIOS:
        refs = []
        for _, r in ok.iterrows():
            pool = pools.get((r["setup"], reference_batch(kind, r["global_batch"], r["per_gpu_batch"])))
            ref = np.median(pool) * (r["gpus"] if per_gpu else 1) if pool is not None else math.nan
            refs.append(ref)
        out[name] = ok["rate"].to_numpy() / np.asarray(refs, dtype=float) if len(ok) else []
    return out


def cells(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (options, variant, gpus) of ok runs: n_ok, each quantity's median (or ratio
    of medians) and its interval as <q>, <q>_ci_low, <q>_ci_high, and the reference of each
    scaling kind. Sorted like the tables."""
    ok = ok_runs(summary)
    if ok.empty:
        return pd.DataFrame(columns=CELL_IDENT + ["n_ok"])
    pools = single_pools(ok)
    rows = []
    for key, grp in ok.groupby(CELL_IDENT, sort=False, dropna=False):
        row = dict(zip(CELL_IDENT, key), n_ok=len(grp), precision=grp["precision"].iloc[0],
                   rate_unit=grp["rate_unit"].iloc[0], bound=regime(grp["bound"]))
        if "rehearsed" in grp.columns:
            row["rehearsed"] = bool(grp["rehearsed"].fillna(False).astype(bool).any())
        row["label"] = label(row)
        for q, _, interval in MEDIANS:
            est = median_ci(grp[q]) if interval else Estimate(grp[q].median(), math.nan, math.nan, math.nan)
            row.update(estimate_fields(q, est))
        for q, kind, per_gpu in RATIOS:
            batch = reference_batch(kind, row["global_batch"], row["per_gpu_batch"])
            pool = pools.get((row["setup"], batch))
            row[f"{kind}_reference"] = reference_text(kind, batch) if pool is not None else ""
            row[f"{kind}_reference_n"] = len(pool) if pool is not None else 0
            if row["variant"] == "single":   # the baseline against itself: 1 by definition
                est = Estimate(1.0, math.nan, math.nan, math.nan) if pool is not None else NONE
            elif pool is None:
                est = NONE
            else:
                est = ratio_ci(grp["rate"], pool, row["gpus"] if per_gpu else 1.0)
            row.update(estimate_fields(q, est))
        rows.append(row)
    return sort(pd.DataFrame(rows))


def regime(bounds: pd.Series) -> str:
    """A cell's regime: "host" or "device" where its runs agree, "mixed" where they do not, ""
    where none was probed (the CPU, records before the probe)."""
    seen = sorted({b for b in bounds if isinstance(b, str) and b})
    return seen[0] if len(seen) == 1 else ("mixed" if seen else "")


def estimate_fields(q: str, est: Estimate) -> dict[str, float]:
    """A quantity's columns in the cell table: q, q_ci_low, q_ci_high, q_ci_level."""
    return {q: est.value, f"{q}_ci_low": est.low, f"{q}_ci_high": est.high, f"{q}_ci_level": est.level}


def cell_estimate(c: pd.Series, q: str) -> Estimate:
    return Estimate(c[q], c[f"{q}_ci_low"], c[f"{q}_ci_high"], c[f"{q}_ci_level"],
                    at_least=q in RATIO_NAMES)


def cell_rows(cell_table: pd.DataFrame) -> list[dict]:
    """The cells in long form, one row per (cell, quantity): what medians.csv holds."""
    rows = []
    for _, c in cell_table.iterrows():
        ident = {k: c[k] for k in CELL_IDENT}
        for q, _, _ in MEDIANS:
            rows.append({**ident, "quantity": q, "n": c["n_ok"], "reference": "", **long_fields(c, q)})
        for q, kind, _ in RATIOS:
            ref = c[f"{kind}_reference"]
            if not ref:
                continue
            rows.append({**ident, "quantity": q, "n": c["n_ok"],
                         "reference": f"{ref}, n={c[f'{kind}_reference_n']}", **long_fields(c, q)})
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in rows]


def long_fields(c: pd.Series, q: str) -> dict[str, float]:
    est = cell_estimate(c, q)
    return {"value": est.value, "ci_low": est.low, "ci_high": est.high, "ci_level": est.level}


def interval_text(est: Estimate, spec: str, n: int | None = None) -> str:
    """'95% CI 1.62–1.71', '75% CI 1.62–1.71' (the confidence three repeats give), or
    'n=1, no interval'."""
    if not (_present(est.low) and _present(est.high)):
        return NO_INTERVAL if n is None or n < 2 else "no interval"
    return f"{level_text(est.level, est.at_least)} CI {spec.format(est.low)}–{spec.format(est.high)}"


def level_text(level: float, at_least: bool = False) -> str:
    """A confidence as a whole percent, never rounded up to a level it does not reach; '≥56%'
    where it is a lower bound (a ratio's)."""
    return f"{'≥' if at_least else ''}{math.floor(level * 100 + 1e-9)}%"
