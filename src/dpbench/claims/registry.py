"""Claim id -> its parts: the ledger and the probe runner look a claim up here, never by name.

Each claim lives in its folder claims/cN/: probe.py (the torch probe, where it has one),
verdict.py (the numbers and the verdict, where the ledger decides it: a probe-only claim keeps
its probe's verdict), text.py (the ledger section in words) and figure.py (where it draws one).
Probes and figures are named as modules, imported where they run, so that the ledger's imports
stay free of torch and of matplotlib.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from dpbench.claims.c1 import text as c1
from dpbench.claims.c2 import text as c2
from dpbench.claims.c3 import text as c3
from dpbench.claims.c4 import text as c4
from dpbench.claims.c5 import text as c5
from dpbench.claims.c6 import text as c6
from dpbench.claims.c7 import text as c7
from dpbench.claims.c8 import text as c8
from dpbench.claims.c9 import text as c9
from dpbench.claims.records import Finding


@dataclass(frozen=True)
class Claim:
    finding: Callable[..., Finding]    # the ledger's evidence -> the verdict and its words
    probe: str | None = None           # module under dpbench.claims with run(**settings) -> ProbeRecord
    # figure key (results.CLAIM_FIGURE_KEYS) -> "module:function" under dpbench.claims drawing it
    figures: dict[str, str] = field(default_factory=dict)
    # claim table (results.CLAIM_SCHEMAS) -> "module:function" under dpbench.claims giving its rows
    # from the ledger's evidence (the ledger writes it beside claims.md)
    tables: dict[str, str] = field(default_factory=dict)


REGISTRY: dict[str, Claim] = {
    "C1": Claim(c1.finding, "c1.probe", {"C1": "c1.figure:c1_figure"}),
    "C2": Claim(c2.finding, "c2.probe"),
    "C3": Claim(c3.finding, "c3.probe"),
    "C4": Claim(c4.finding, "c4.probe"),
    "C5": Claim(c5.finding, "c5.probe"),
    "C6": Claim(c6.finding, "c6.probe", {"C6": "c6.figure:c6_figure"}),
    "C7": Claim(c7.finding, "c7.probe", {"C7": "c7.figure:c7_figure"}),
    "C8": Claim(c8.finding, None, {"C8": "c8.figure:c8_figure", "C8_dp_step": "c8.figure:c8_dp_step_figure"}),
    "C9": Claim(c9.finding, "c9.probe", {"C9": "c9.figure:c9_figure"}, {"largest_batch": "c9.verdict:ledger_rows"}),
}
