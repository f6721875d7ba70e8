"""An option set in words: 'bf16 + channels_last, batch 1024', a run's or a cell's label, and
the order labels read in (the summary's and the figures' panels)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from dpbench.analysis.intervals import present
from dpbench.analysis.options import BATCH_KEYS, STRONG, WEAK, parse_options, value_text, without_batch

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
    "max_steps": lambda v: f"{value_text(v)} steps",
    "epochs": lambda v: f"{value_text(v)} epoch" + ("" if v == 1 else "s"),
    "batchnorm": lambda v: f"BatchNorm {v}",
    "feed": lambda v: {"gpu": "GPU-resident data", "torch": "DataLoader feed",
                       "fixed": "one fixed batch"}.get(v, f"feed {v}"),
    "workers": lambda v: f"{value_text(v)} workers",
    "num_classes": lambda v: f"{value_text(v)} classes",
    "bucket_cap_mb": lambda v: f"{value_text(v)} MB buckets",
    "lr": lambda v: f"lr {value_text(v)}",
    "warmup_steps": lambda v: f"{value_text(v)} warm-up steps",
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
                            ({True: "on", False: "off"}.get(v, value_text(v)) if isinstance(v, bool)
                             else value_text(v)))
        phrases.append(word(opts[key]))
    gb = global_batch if global_batch is not None else opts.get("global_batch")
    pb = per_gpu_batch if per_gpu_batch is not None else opts.get("per_gpu_batch")
    if scaling == WEAK and present(pb):
        phrases.append(f"{value_text(pb)} per GPU")
    elif present(gb):
        phrases.append(f"batch {value_text(gb)}")
    elif present(pb):
        phrases.append(f"{value_text(pb)} per GPU")
    return ", ".join(p for p in [" + ".join(fmt)] + phrases if p)


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
