"""provenance.json read back: each key one value, or the sorted distinct values when runs disagree."""
from __future__ import annotations

from typing import Any


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
