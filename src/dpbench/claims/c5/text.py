"""C5's ledger section: the probe's verdict and observations with a one-line summary, and the
gather warnings the training runs counted.
"""
from __future__ import annotations

from dpbench.claims.findings import probe_finding
from dpbench.claims.records import Finding, ProbeRecord


def _c5(p: ProbeRecord) -> str:
    many = p.values("c5.all_gpus")
    one = p.values("c5.one_gpu")
    default = p.values("c5.shown.default_filters")
    always = p.values("c5.shown.always")
    parts = []
    if many:
        parts.append(f"exact article text: {many.get('exact_article_text')}; shape {many.get('shape')} on "
                     f"{len(many.get('device_ids', []))} GPUs" + (f", {one.get('shape')} on one" if one else ""))
    if default and always:
        parts.append(f"shown {default.get('shown')}x over {default.get('steps')} steps with default filters, "
                     f"{always.get('shown')}x with 'always'")
    return "; ".join(parts) or "no observation of the gather recorded under today's ids"


def _gather_warnings_in_runs(ev) -> list[str]:
    w = ev.tables["warnings"]
    w = w[w["message"].astype(str).str.contains("Was asked to gather")]
    return [f"training run {r.run_id}: gather warning counted {r.count} times (first at step {r.first_step})"
            for r in w.itertuples()]


def finding(ev) -> Finding:
    f = probe_finding(ev, "C5", _c5)
    in_runs = _gather_warnings_in_runs(ev)
    f.evidence += in_runs
    f.runs_used = bool(in_runs)
    return f
