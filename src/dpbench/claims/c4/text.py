"""C4's ledger section: the probe's verdict and observations, and a one-line summary of them.
"""
from __future__ import annotations

from dpbench.claims.findings import probe_finding
from dpbench.claims.records import Finding, ProbeRecord


def _c4(p: ProbeRecord) -> str:
    article = p.values("c4.article_load")
    exact = [o for o in p.observations if "round_trip_bit_exact" in o.values]
    ok = sum(bool(o.get("round_trip_bit_exact")) for o in exact)
    if not article:
        head = "article's load: not recorded"
    elif article.get("error"):
        head = f"article's load: `{article['error']}` {article.get('second_line', '')[:60]}..."
    else:
        head = "article's load: works"
    return f"{head}; {ok}/{len(exact)} other round trips bit for bit"


def finding(ev) -> Finding:
    return probe_finding(ev, "C4", _c4)
