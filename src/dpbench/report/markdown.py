"""Markdown tables for the reports (pandas' to_markdown needs the optional tabulate package)."""
from __future__ import annotations

import math
from typing import Any, Iterable


def cell(value: Any) -> str:
    """One value as table text: numbers shortened, lists joined, on one line, pipes escaped."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = "–"
    elif isinstance(value, float):
        text = f"{value:,.1f}" if abs(value) >= 100 else f"{value:.4g}"
    elif isinstance(value, list):
        text = ", ".join(cell(v) for v in value) or "[]"
    else:
        text = str(value)
    return " ".join(text.split()).replace("|", "\\|")


def md_table(headers: list[str], rows: list[list[Any]], right: Iterable[int] = ()) -> str:
    """A padded GitHub markdown table; columns whose index is in `right` align right."""
    if not rows:
        return "_none_"
    right = set(right)
    cells = [[cell(c) for c in row] for row in [headers, *rows]]
    widths = [max(3, *(len(r[i]) for r in cells)) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w - 1) + ":" if i in right else "-" * w for i, w in enumerate(widths)]
    return "\n".join([line(cells[0]), line(rule)] + [line(r) for r in cells[1:]])
