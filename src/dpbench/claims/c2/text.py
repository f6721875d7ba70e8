"""C2's ledger section: the probe's verdict and observations, and a one-line summary of them.
"""
from __future__ import annotations

from dpbench.claims.findings import probe_finding
from dpbench.claims.records import Finding, ProbeRecord


def _c2(p: ProbeRecord) -> str:
    wrong = p.find("c2.wrap.model_not_on_first_id")
    late = p.values("c2.cvd.set_after_cuda_init")
    plain = p.values("c2.plain_fix")
    if wrong is None:
        parts = ["the wrong-device case: not recorded"]
    elif wrong.get("error"):
        parts = [f"{wrong.what}: `{wrong.get('error')}` at {wrong.get('stage')}"]
    else:
        parts = [f"{wrong.what}: no error"]
    if late:
        parts.append(f"CUDA_VISIBLE_DEVICES set after CUDA init leaves device_count "
                     f"{late.get('before')} -> {late.get('after')}")
    if plain:
        parts.append(f"model.to(device_ids[0]) {'works' if plain.get('stage', 'x') is None else 'fails'}")
    return "; ".join(parts)


def finding(ev) -> Finding:
    return probe_finding(ev, "C2", _c2)
