"""Option sets and variants as data: an options label parsed back into its values and a value
written as a label writes it, the batch fields apart, and the order variants and labels sort in."""
from __future__ import annotations

import re
from typing import Any, Iterable

from dpbench import VARIANTS

BATCH_KEYS = ("global_batch", "per_gpu_batch")
STRONG, WEAK = "strong", "weak"


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


def without_batch(options: str | dict | None) -> dict[str, Any]:
    return {k: v for k, v in parse_options(options).items() if k not in BATCH_KEYS}


def value_text(value: Any) -> str:
    """A value as an options label writes it: a whole float as an integer, others by :g."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# Still said here, not in report/: analysis.experiment_time's reasons say a GPU count in words.
def gpus_label(gpus: int) -> str:
    return f"{int(gpus)} GPU" + ("" if gpus == 1 else "s")
