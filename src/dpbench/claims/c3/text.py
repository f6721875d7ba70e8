"""C3's ledger section: the probe's verdict and observations, and a one-line summary of them.
"""
from __future__ import annotations

from dpbench.claims.findings import probe_finding
from dpbench.claims.records import Finding, ProbeRecord


def _c3(p: ProbeRecord) -> str:
    listed = p.find("c3.misbehaving_calls")
    bad = (listed.get("result", []) if listed is not None else
           [o.what for o in p.observations if o.get("misbehaves")])   # each call's own flag
    zero = (p.values("c3.cuda_all_ids.zero_grad") or p.values("c3.cpu.zero_grad")).get("result", "")
    one_id = p.values("c3.cuda_one_id.construction").get("error")
    return (f"{len(bad)} calls on the wrapper misbehave (CPU and CUDA paths together)"
            + (f"; wrapper.zero_grad(): {zero}" if zero else "")   # not observed without 2 GPUs
            + (f"; one CUDA id: `{one_id}`" if one_id else ""))


def finding(ev) -> Finding:
    return probe_finding(ev, "C3", _c3)
