"""C2's ledger section: the probe's verdict and observations, and a one-line summary of them.
"""
from __future__ import annotations

from dpbench.claims.findings import probe_finding
from dpbench.claims.records import Finding, ProbeRecord


def _c2(p: ProbeRecord) -> str:
    wrong = p.find("c2.wrap.model_not_on_first_id")
    late = p.values("c2.cvd.set_after_cuda_init")
    plain = p.values("c2.plain_fix")
    errored = wrong is not None and wrong.get("error")
    head = (f"{wrong.what}: `{wrong.get('error')}` at {wrong.get('stage')}" if errored
            else "no wrong-device case erred")
    return (f"{head}; CUDA_VISIBLE_DEVICES set after CUDA init leaves device_count "
            f"{late.get('before')} -> {late.get('after')}; model.to(device_ids[0]) "
            f"{'works' if plain.get('stage', 'x') is None else 'fails'}")


def finding(ev) -> Finding:
    return probe_finding(ev, "C2", _c2)
