"""What each side ran on and with: provenance keys, hardware and software differences, and the
config keys that differ between runs of the same run id."""
from __future__ import annotations

import json
from typing import Any

from dpbench import results as R

PROVENANCE_KEYS = ["torch", "torch_git", "cuda", "cudnn", "nccl", "driver", "gpu_names",
                   "python", "hostname", "device_type", "git_sha"]
HARDWARE_KEYS = ("gpu_names", "device_type", "hostname")
# What must match for deterministic runs to be bit-identical: the hostname need not.
EXACT_HARDWARE_KEYS = ("gpu_names", "device_type")
# Software whose change explains changed bits in deterministic runs (git_sha: dpbench's own code).
SOFTWARE_KEYS = ("torch", "torch_git", "cuda", "cudnn", "nccl", "driver", "git_sha")
HARDWARE_WARNING = "hardware differs ({keys}): timings are not comparable"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def compare_configs(a: dict, b: dict) -> dict[str, dict]:
    """Config keys that differ between runs with the same run_id, with the values on each side."""
    diffs: dict[str, dict[str, set]] = {}
    for rid in a.keys() & b.keys():
        fa, fb = flatten(a[rid].config), flatten(b[rid].config)
        for k in fa.keys() | fb.keys():
            va, vb = json.dumps(fa.get(k), sort_keys=True), json.dumps(fb.get(k), sort_keys=True)
            if va != vb:
                d = diffs.setdefault(k, {"baseline": set(), "candidate": set()})
                d["baseline"].add(va)
                d["candidate"].add(vb)
    return {k: {side: [json.loads(v) for v in sorted(vals)] for side, vals in d.items()}
            for k, d in sorted(diffs.items())}


def prov_value(rs: dict, key: str) -> Any:
    """One value, the list of the values the runs disagree on, or None when absent."""
    if key == "gpu_names":
        # The visible GPUs vary with each run's gpus; the models are the hardware.
        return R.gpu_models(rs["provenance"])
    if key == "device_type":   # lives in the records, not provenance.json
        values = sorted(set(rs["tables"]["summary"]["device_type"].dropna().astype(str)) - {""})
    else:
        values = R.provenance_values(rs["provenance"], key)
    return None if not values else values[0] if len(values) == 1 else values


def compare_provenance(base: dict, cand: dict) -> dict[str, Any]:
    keys = {}
    for k in PROVENANCE_KEYS:
        va, vb = prov_value(base, k), prov_value(cand, k)
        keys[k] = {"baseline": va, "candidate": vb, "differs": va != vb}
    hardware = [k for k in HARDWARE_KEYS if keys[k]["differs"]]
    return {"keys": keys, "differs": [k for k, v in keys.items() if v["differs"]],
            "config_differs": compare_configs(base["records"], cand["records"]),
            "hardware_differs": bool(hardware),
            "warning": HARDWARE_WARNING.format(keys=", ".join(hardware)) if hardware else None,
            "severity": "finding" if hardware else "info"}
