"""The ledger's own figures, drawn from the sections' data, so that a figure shows exactly what
decided a verdict: each claim's figure.py draws its own (registry.REGISTRY names them).

Every figure is always written (the pipeline declares them as outputs); a claim that was not
measured gets a figure that says why. The look is dpbench.report.figstyle's, as dpbench.report.plots'.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure

from dpbench import results
from dpbench.claims.figure_data import Section, get
from dpbench.claims.registry import REGISTRY
from dpbench.report.figstyle import save, style


def _function(where: str) -> Callable[[Section], Figure]:
    module, name = where.split(":")
    return getattr(importlib.import_module(f"dpbench.claims.{module}"), name)


# Figure key -> how to draw it; a key's claim is the part before "_" (C8_dp_step -> C8). The
# keys are results.CLAIM_FIGURE_KEYS, which the pipeline plans with (without this module).
DRAW: dict[str, Callable[[Section], Figure]] = {key: _function(where) for claim in REGISTRY.values()
                                                for key, where in claim.figures.items()}


def claim_of(key: str) -> str:
    return key.split("_")[0]


def draw(results_dir: Path | str, tag: str, sections: list[Section]) -> dict[str, str]:
    """Writes every claim figure under results/<tag>/figures; returns figure key -> the path
    relative to the tag's folder, which is how claims.md links it."""
    rs = results.ResultSet(results_dir, tag)
    by_id = {get(s, "id"): s for s in sections}
    written = {}
    with style():
        for key, draw_one in DRAW.items():
            path = rs.claim_figure_path(key)
            save(draw_one(by_id.get(claim_of(key), {"id": claim_of(key)})), path)
            written[key] = rs.relative(path)
    return written
