"""What each side ran on and with: provenance keys, hardware and software differences, and the
config keys that differ between runs of the same run id."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpbench import results as R
from dpbench.analysis.cells import cell_fields
from dpbench.analysis.compare.loading import CELL, in_order, shown

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
    # Hardware differs only where both sides know it: a side whose runs never saw a device
    # (all skipped, or failed before) says nothing about its machine.
    hardware = [k for k in HARDWARE_KEYS if keys[k]["differs"]
                and keys[k]["baseline"] is not None and keys[k]["candidate"] is not None]
    return {"keys": keys, "differs": [k for k, v in keys.items() if v["differs"]],
            "config_differs": compare_configs(base["records"], cand["records"]),
            "hardware_differs": bool(hardware),
            "warning": HARDWARE_WARNING.format(keys=", ".join(hardware)) if hardware else None,
            "severity": "finding" if hardware else "info"}


def _cells(rs: dict) -> set:
    """The cells a set planned (their CELL keys): every summary row, whatever its status."""
    return set(rs["tables"]["summary"][CELL])


def compare_sets(results_dir: Path | str, baseline: str, candidate: str, base: dict, cand: dict) -> dict[str, Any]:
    """Whether the two sides are one result set (the same folder, or the same records under two
    tags: nothing can differ) and whether they ran the same experiment (the same cells), with
    the cells they share and those only one side has."""
    same_folder = R.tag_dir(results_dir, baseline).resolve() == R.tag_dir(results_dir, candidate).resolve()
    ra, rb = base["records"], cand["records"]
    same_records = bool(ra) and ra.keys() == rb.keys() and all(ra[k].raw == rb[k].raw for k in ra)
    ca, cb = _cells(base), _cells(cand)
    return {
        "same_set": same_folder or same_records,
        "same_because": "same folder" if same_folder else "identical records" if same_records else None,
        "experiments": {"baseline": {"cells": len(ca), "runs": len(base["tables"]["summary"])},
                        "candidate": {"cells": len(cb), "runs": len(cand["tables"]["summary"])},
                        "differ": ca != cb},
        "shared_cells": len(ca & cb),
        "only_baseline": [cell_fields(shown(k, base)) for k in in_order(ca - cb, base)],
        "only_candidate": [cell_fields(shown(k, cand)) for k in in_order(cb - ca, cand)],
    }
