"""C4's ledger section: the probe's verdict and observations, and a one-line summary of them.
"""
from __future__ import annotations

from dpbench.claims.findings import probe_finding
from dpbench.claims.records import Finding, ProbeRecord


def _c4(p: ProbeRecord) -> str:
    article = p.values("c4.article_load")
    exact = [o for o in p.observations if "round_trip_bit_exact" in o.values]
    ok = sum(bool(o.get("round_trip_bit_exact")) for o in exact)
    return (f"article's load: `{article.get('error', 'loads')}` {article.get('second_line', '')[:60]}...; "
            f"{ok}/{len(exact)} other loads round-trip bit for bit")


def finding(ev) -> Finding:
    return probe_finding(ev, "C4", _c4)
