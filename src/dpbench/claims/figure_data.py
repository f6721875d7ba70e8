"""What a claim's figure reads from its ledger section (a Section, or a plain dict of its fields),
and the figure a claim that was not measured gets.
"""
from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from dpbench.report.figstyle import placeholder


Section = Any   # dpbench.claims.records.Section, or a plain dict of its fields


def get(s: Section, key: str, default: Any = None) -> Any:
    return s.get(key, default) if isinstance(s, dict) else getattr(s, key, default)


def data(s: Section, key: str) -> Any:
    """One entry of a section's data; None where the claim was not measured."""
    return (get(s, "data") or {}).get(key)


def missing(s: Section, title: str) -> Figure:
    return placeholder(title, get(s, "not_run") or "nothing measured for this figure in these results")
