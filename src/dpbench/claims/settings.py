"""The claims experiment's groups, and what the probes measure at, read from them: a probe that
chose its own batch or output widths would drift from the runs whose verdicts it explains.

- C1: the global batch of its groups (the memory snapshots are taken at the runs' batch; with
  several batches, the widest group's) and the narrowest and widest output of its groups (the
  largest-batch search and the snapshots contrast the two);
- C7: the global batch of its cudnn.benchmark group (the DataParallel step breakdown with
  cudnn.benchmark on and off), then the largest batch of C8's sweep (the breakdown again with
  benchmark off: how DataParallel's cost beyond one GPU's share changes as the batch grows).

The pipeline passes the groups as it planned them (--config overrides included); by hand,
experiments/claims.yaml.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dpbench import results
from dpbench.plan.config import RunConfig


def experiment_groups(experiment_path: Path | str) -> dict[str, dict[str, Any]]:
    """Group name -> {variants, gpus, options, label, train} as declared in the experiment file
    (or in inline JSON, as the pipeline passes the groups it planned); `train` is the
    experiment's own block, which a group's options override."""
    text = str(experiment_path)
    spec = yaml.safe_load(text if text.lstrip().startswith("{") else Path(text).read_text())
    train = dict(spec.get("train") or {})
    return {g["name"]: {"variants": list(g.get("variants") or spec["variants"]),
                        "gpus": list(g.get("gpus") or spec["gpus"]),
                        "options": dict(g.get("options") or {}),
                        "label": results.options_label(g.get("options")),
                        "train": train}
            for g in spec["matrix"]}


def claim_groups(groups: dict[str, dict[str, Any]], cid: str) -> list[str]:
    """The groups of a claim: those named `<cid>_...` (c1_out10 -> C1)."""
    return [g for g in groups if g.split("_")[0] == cid.lower()]


def _option(group: dict[str, Any], key: str) -> Any:
    """A setting as the group's runs train with it: its options, else the experiment's train
    block, else RunConfig's default."""
    return group["options"].get(key, group["train"].get(key, getattr(RunConfig, key)))


def _require(groups: dict[str, dict[str, Any]], cid: str, what: str) -> list[str]:
    mine = claim_groups(groups, cid)
    if not mine:
        raise ValueError(f"the experiment has no {cid} group ({cid.lower()}_...), which the {cid} probe "
                         f"takes {what} from: add one, or drop {cid} from `probes`")
    return mine


def probe_settings(claim: str, groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Keyword arguments of the claim's probe (its module's run()); {} for a probe that needs none."""
    if claim == "C1":
        mine = [groups[g] for g in _require(groups, "C1", "its batch and output widths")]
        widths = sorted({int(_option(g, "num_classes")) for g in mine})
        widest = max(mine, key=lambda g: _option(g, "num_classes"))
        return {"batch": int(_option(widest, "global_batch")), "classes": [widths[0], widths[-1]]}
    if claim == "C7":
        on = [groups[g] for g in _require(groups, "C7", "its batch") if _option(groups[g], "cudnn_benchmark")]
        if not on:
            raise ValueError("no C7 group sets cudnn_benchmark: true, whose batch the C7 probe breaks a "
                             "DataParallel step down at: add one, or drop C7 from `probes`")
        first = int(_option(on[0], "global_batch"))
        sweep = [int(_option(groups[g], "global_batch")) for g in claim_groups(groups, "C8")]
        return {"batches": [first] + ([max(sweep)] if sweep and max(sweep) != first else [])}
    return {}
