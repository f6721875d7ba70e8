"""What the probes measure at, read from the claims experiment's groups as planned (plan.json,
dpbench.plan.matrix.read_plan): a probe that chose its own batch or output widths would drift
from the runs whose verdicts it explains, and one that resolved the settings again could miss
what the plan applied (weak scaling's per_gpu_batch, the train block, --config overrides).

- C1: the global batch of its groups (the memory snapshots are taken at the runs' batch; with
  several batches, the widest group's largest) and the narrowest and widest output of its
  groups (the largest-batch search and the snapshots contrast the two);
- C7: the global batch of its cudnn.benchmark group (the DataParallel step breakdown with
  cudnn.benchmark on and off), then the largest batch of C8's sweep (the breakdown again with
  benchmark off: how DataParallel's cost beyond one GPU's share changes as the batch grows).
"""
from __future__ import annotations

from typing import Any

# The probes that measure at their groups' settings (the others need no plan).
NEEDS_PLAN = ("C1", "C7")


def claim_groups(groups: dict[str, dict[str, Any]], cid: str) -> list[str]:
    """The groups of a claim: those named `<cid>_...` (c1_out10 -> C1)."""
    return [g for g in groups if g.split("_")[0] == cid.lower()]


def _setting(group: dict[str, Any], key: str) -> Any:
    """A setting as the group's runs train with it; the largest where they differ (the global
    batch under weak scaling grows with the GPUs)."""
    return max(getattr(rc, key) for rc in group["runs"].values())


def _require(groups: dict[str, dict[str, Any]], cid: str, what: str) -> list[str]:
    mine = claim_groups(groups, cid)
    if not mine:
        raise ValueError(f"the experiment has no {cid} group ({cid.lower()}_...), which the {cid} probe "
                         f"takes {what} from: add one, or drop {cid} from `probes`")
    return mine


def probe_settings(claim: str, groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Keyword arguments of the claim's probe (its module's run()); {} for a probe that needs none.
    `groups` are plan.json's (dpbench.plan.matrix.read_plan)."""
    if claim == "C1":
        mine = [groups[g] for g in _require(groups, "C1", "its batch and output widths")]
        widths = sorted({int(_setting(g, "num_classes")) for g in mine})
        widest = max(mine, key=lambda g: _setting(g, "num_classes"))
        return {"batch": int(_setting(widest, "global_batch")), "classes": [widths[0], widths[-1]]}
    if claim == "C7":
        on = [groups[g] for g in _require(groups, "C7", "its batch") if _setting(groups[g], "cudnn_benchmark")]
        if not on:
            raise ValueError("no C7 group sets cudnn_benchmark: true, whose batch the C7 probe breaks a "
                             "DataParallel step down at: add one, or drop C7 from `probes`")
        first = int(_setting(on[0], "global_batch"))
        sweep = [int(_setting(groups[g], "global_batch")) for g in claim_groups(groups, "C8")]
        return {"batches": [first] + ([max(sweep)] if sweep and max(sweep) != first else [])}
    return {}
