"""C1's evidence as numbers: device 0 against the others per run cell, the noise each is
judged against, the output-size sweeps and their onsets, DDP's ranks against DP's device 0, and
the verdict; and the probe's batch search judged the same way.

Every cell is measured over repeats; a difference counts only beyond the spread of those
repeats, or beyond a floor where the repeats agree closer than identical runs can (for memory:
one set of the run's gradients, sized from its config). Shares and floors are named constants
so that a verdict can be traced to the number that decided it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any

import pandas as pd

from dpbench import DP_VARIANTS
from dpbench.analysis.collect import model_mib
from dpbench.claims.batch_search import RESOLUTION   # the probe's search, and so its granularity
from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.plan.config import RunConfig


MIB = 2 ** 20
# A run's record counts its model's parameters and their bytes; records from before workloads
# (issue 25) do not, and all trained ResNet18-CIFAR: its size, for them only (tests check both
# against the model).
FEATURES = 512             # ResNet18's penultimate width (dpbench.workloads.resnet.FEATURES)
BACKBONE_PARAMS = 11_168_832   # ResNet18-CIFAR without its output layer
NOISE_FLOOR_MIB = 1.0      # below this a per-device difference is allocator granularity, not evidence
# Bytes of one parameter (and so of its gradient) per run precision: bf16 is autocast, which
# keeps the parameters in fp32.
PARAM_BYTES = {"fp32": 4, "bf16": 4}
OUTPUT_BYTES = {"fp32": 4, "bf16": 2}   # of the model's outputs: autocast's Linear returns bf16
GATHER_SHARE = 0.5         # the gathered outputs must explain this much of device 0's excess
DP_GPUS = 2                 # DataParallel is measured on this many GPUs


def param_count(num_classes: int = 10) -> int:
    """ResNet18-CIFAR's parameters with an output layer of num_classes (weights and biases): the
    size of a record that did not count its model's."""
    return BACKBONE_PARAMS + (FEATURES + 1) * num_classes


def grad_set_mib(num_classes: int, precision: str, param_bytes: int | None = None) -> float | None:
    """One set of the model's gradients in its parameter dtype (MiB): the bytes of its parameters
    as the record counted them, else ResNet18-CIFAR's at num_classes; None for a precision whose
    parameter dtype is not known here."""
    if param_bytes:
        return param_bytes / MIB
    size = PARAM_BYTES.get(precision)
    return None if size is None else param_count(num_classes) * size / MIB


def _device_mib(ev, run_id: str) -> pd.DataFrame:
    """Per device, each measure less the dataset resident there (collect's rule): allocated,
    reserved and NVML alike, so that no comparison counts the gpu feed's data as device 0's cost."""
    mem = ev.tables["memory"]
    rows = mem[mem["run_id"] == run_id]
    data = pd.to_numeric(rows["data_mib"], errors="coerce").fillna(0.0).to_numpy()
    out = pd.DataFrame({"allocated": [model_mib(r) for r in rows.to_dict("records")],
                        "reserved": pd.to_numeric(rows["reserved_mib"], errors="coerce").to_numpy() - data,
                        "nvml": pd.to_numeric(rows["nvml_used_mib"], errors="coerce").to_numpy() - data},
                       index=rows["device"].to_numpy())
    return out.dropna(subset=["allocated"]).sort_index()


def device0_excess_estimate(global_batch: int, gpus: int, num_classes: int = 10, precision: str = "fp32",
                            momentum: bool = True, loss_on_gathered: bool = True,
                            param_bytes: int | None = None) -> dict[str, float]:
    """MiB that device 0 holds beyond the mean of the other devices at the end of the forward
    pass, item by item from sizes. The master weights are not among them: every other device
    holds a replica's copy while the step runs. The summed gradients are: the last step's stay
    until zero_grad, which follows the forward pass. With the loss on the gathered outputs
    (variant dp) device 0 also holds the whole batch's outputs and the loss's log-softmax of
    them (kept for backward, fp32); with the loss inside the replicas neither exists. param_bytes:
    the model's parameters' bytes as the run's record counted them (else ResNet18-CIFAR's)."""
    if precision not in OUTPUT_BYTES:
        raise ValueError(f"no sizes known for precision {precision!r} (known: {', '.join(sorted(OUTPUT_BYTES))}); "
                         f"add its bytes to PARAM_BYTES and OUTPUT_BYTES in dpbench.claims.c1.verdict")
    weights = (param_bytes or param_count(num_classes) * PARAM_BYTES[precision]) / MIB
    sample = (3 * 32 * 32 * 4 + 8) / MIB                  # one image and its int64 label
    own = -(-global_batch // gpus)                         # scatter gives device 0 the largest chunk
    others = (global_batch - own) / (gpus - 1)
    out_bytes = OUTPUT_BYTES[precision]
    logits = global_batch * num_classes / MIB
    return {"summed_grads": weights,
            "momentum": weights if momentum else 0.0,
            # the global batch arrives on device 0 and stays there; its own chunk is a view of it
            "input_batch": (global_batch - others) * sample,
            "gathered_logits": logits * out_bytes if loss_on_gathered else 0.0,
            "loss_log_softmax": logits * 4 if loss_on_gathered else 0.0}


def _c1_run(ev, rid: str) -> dict[str, Any] | None:
    """One run's devices: device 0 against the mean of the others, and every device's allocation."""
    mib = _device_mib(ev, rid)
    if 0 not in mib.index or len(mib) < 2:
        return None
    others = mib.drop(index=0)
    return {"run_id": rid, "dev0": mib.loc[0].to_dict(), "others": others.mean().to_dict(),
            "excess": mib.loc[0, "allocated"] - others["allocated"].mean(),
            "allocated": mib["allocated"].to_dict(), "config": ev.run_config(rid),
            "model_size": ev.model_size(rid)}


def _alike_spread(variant: str, per_run: list[dict]) -> float:
    """Spread of allocated memory over the devices that should hold the same, pooled over every
    repeat: all of a DDP run's ranks; DataParallel's devices other than 0. Identical runs differ
    by whole buffers (a gradient set allocated at the peak or not), and which rank holds it
    changes between repeats: one run's ranks alone can agree to the byte."""
    vals = [m for r in per_run for d, m in r["allocated"].items() if variant == "ddp" or d != 0]
    return max(vals) - min(vals) if vals else 0.0


def _c1_cell(group: str, variant: str, gpus: int, per_run: list[dict]) -> dict[str, Any]:
    excess = [r["excess"] for r in per_run]
    cfg = per_run[0]["config"]
    cell = {"group": group, "variant": variant, "gpus": gpus, "repeats": len(per_run),
            "run_ids": [r["run_id"] for r in per_run],
            "excess_mib": median(excess), "repeat_spread_mib": max(excess) - min(excess),
            "alike_spread_mib": _alike_spread(variant, per_run),
            **{f"dev0_{k}_mib": median(r["dev0"][k] for r in per_run) for k in ("allocated", "reserved", "nvml")},
            **{f"others_{k}_mib": median(r["others"][k] for r in per_run) for k in ("allocated", "reserved", "nvml")},
            "config_found": cfg is not None}
    if cfg is None:
        return cell
    # a key the record lacks is RunConfig's default, which the run trained with
    cell.update(num_classes=int(cfg.get("num_classes", RunConfig.num_classes)),
                precision=cfg.get("precision", RunConfig.precision),
                global_batch=int(cfg.get("global_batch", RunConfig.global_batch)),
                momentum=float(cfg.get("momentum", RunConfig.momentum)))
    parameters, param_bytes = per_run[0]["model_size"]
    cell["params"] = int(parameters or param_count(cell["num_classes"]))
    cell["grad_set_mib"] = grad_set_mib(cell["num_classes"], cell["precision"], param_bytes)
    if variant in DP_VARIANTS and cell["precision"] not in OUTPUT_BYTES:
        cell["unsized"] = f"no sizes known for precision {cell['precision']!r}"
    elif variant in DP_VARIANTS:
        est = device0_excess_estimate(cell["global_batch"], gpus, cell["num_classes"],
                                      cell["precision"], cell["momentum"] > 0, variant == "dp", param_bytes)
        cell.update(estimate_mib=est, estimate_total_mib=sum(est.values()),
                    logits_estimate_mib=est["gathered_logits"] + est["loss_log_softmax"])
    return cell


def _same_model(a: dict, b: dict) -> bool:
    return "num_classes" in a and "num_classes" in b and \
        (a["num_classes"], a["precision"]) == (b["num_classes"], b["precision"])


def _set_noise(c: dict, cells: list[dict]) -> None:
    """A cell's noise: the largest of what identical runs showed (its repeats, its alike devices
    over the repeats, the DDP ranks over the repeats of its group or of the same model on as many
    GPUs) and, where the run's config sizes it, one set of the model's gradients: identical runs
    swing by that much, gradients allocated or not at the moment of the peak."""
    ddp = [d["alike_spread_mib"] for d in cells if d["variant"] == "ddp" and d["gpus"] == c["gpus"]
           and (d["group"] == c["group"] or _same_model(d, c))]
    terms = {"repeats": c["repeat_spread_mib"], "alike devices": c["alike_spread_mib"],
             "DDP ranks x repeats": max(ddp, default=0.0), "one gradient set": c.get("grad_set_mib") or 0.0,
             "allocator floor": NOISE_FLOOR_MIB}
    c["noise_terms"] = terms
    c["noise_basis"] = max(terms, key=terms.get)
    c["noise_mib"] = terms[c["noise_basis"]]


def c1_cells(ev, groups: list[str]) -> list[dict[str, Any]]:
    """One cell per (group, variant, gpus): medians over repeats of device 0 against the others."""
    cells = []
    for g in groups:
        summ = ev.rows(g)
        for (variant, gpus), runs in summ[summ["gpus"] > 1].groupby(["variant", "gpus"]):
            if variant not in (*DP_VARIANTS, "ddp"):
                continue
            per_run = [r for r in (_c1_run(ev, rid) for rid in runs["run_id"]) if r is not None]
            if per_run:
                cells.append(_c1_cell(g, variant, int(gpus), per_run))
    for c in cells:
        _set_noise(c, cells)
        c["ratio"] = c["dev0_allocated_mib"] / c["others_allocated_mib"] if c["others_allocated_mib"] else math.nan
    return cells


def _gathered(cell: dict, cells: list[dict]) -> dict[str, Any]:
    """How much of a dp cell's excess the gathered outputs explain, and the noise of that part:
    measured as dp's excess less that of DataParallel with the loss inside the replicas (same
    group; the sum of both cells' noise), else from sizes (dp's noise)."""
    twin = [c for c in cells if c["group"] == cell["group"] and c["gpus"] == cell["gpus"]
            and c["variant"] in ("dp_sum", "dp_mean")]
    none = {"gathered_share": None, "gathered_mib": None, "gathered_noise_mib": cell["noise_mib"]}
    if cell["excess_mib"] <= 0:
        return {**none, "share_basis": "no excess"}
    if twin:
        # a difference of two cells carries both cells' noise
        part, noise, basis = (cell["excess_mib"] - twin[0]["excess_mib"], cell["noise_mib"] + twin[0]["noise_mib"],
                              f"measured against {twin[0]['variant']}")
    elif "logits_estimate_mib" in cell:
        part, noise, basis = cell["logits_estimate_mib"], cell["noise_mib"], "estimated from sizes"
    else:
        return {**none, "share_basis": cell.get("unsized", "no run config (metrics.json) to size the outputs")}
    return {"gathered_share": part / cell["excess_mib"], "gathered_mib": part, "gathered_noise_mib": noise,
            "share_basis": basis}


def _judge(c: dict, cells: list[dict]) -> None:
    """A dp cell's excess is evidence beyond its noise; the article's reason holds there when the
    gathered outputs' part is beyond its noise too and most of the excess."""
    c.update(_gathered(c, cells))
    c["above_noise"] = bool(c["excess_mib"] > c["noise_mib"])
    c["attributable"] = c["gathered_mib"] is not None and bool(c["gathered_mib"] > c["gathered_noise_mib"]) \
        and bool(c["gathered_share"] >= GATHER_SHARE)
    c["outputs_dominate"] = c["above_noise"] and c["attributable"]


def _sweeps(dp: list[dict]) -> list[list[dict]]:
    """dp cells grouped by what an output-size sweep holds fixed (batch, GPUs, precision), each
    sorted by output size."""
    by: dict[tuple, list[dict]] = {}
    for c in dp:
        by.setdefault((c.get("global_batch", 0), c["gpus"], str(c.get("precision", "?"))), []).append(c)
    return [sorted(v, key=lambda c: c.get("num_classes", 0)) for _, v in sorted(by.items())]


def _onset(sweep: list[dict]) -> tuple[dict | None, bool]:
    """The smallest output size measured from which the gathered outputs dominate device 0's
    excess at every larger size of the sweep (None where the largest does not), and whether the
    sweep is that clean: no size below the onset dominated (an effect that comes and goes with
    the output size states no condition)."""
    first = None
    for c in reversed(sweep):
        if not c["outputs_dominate"]:
            break
        first = c
    below = sweep[:sweep.index(first)] if first else sweep
    return first, not any(c["outputs_dominate"] for c in below)


def _c1_verdict(dp: list[dict], onsets: list[tuple[dict | None, bool]]) -> str:
    """Refuted where device 0 is nowhere heavier beyond noise; confirmed where, in a sweep of the
    output size, the gathered outputs dominate from some size on (the condition the summary
    states) and no sweep has them come and go; needs nuance otherwise."""
    if not any(c["above_noise"] for c in dp):
        return REFUTED
    if any(first for first, _ in onsets) and all(clean for _, clean in onsets):
        return CONFIRMED
    return NUANCE


def ddp_vs_dp_device0(cells: list[dict]) -> list[dict[str, Any]]:
    """Per group with both: a DDP rank's allocated peak (the mean of its ranks) against DP's
    device 0, which DDP's every rank resembles (the whole model, its gradients and optimizer
    state), and whether the difference lies beyond the two cells' noise added up."""
    out = []
    for c in cells:
        same = [d for d in cells if d["variant"] == "dp" and (d["group"], d["gpus"]) == (c["group"], c["gpus"])]
        if c["variant"] != "ddp" or not same:
            continue
        d = same[0]
        rank = (c["dev0_allocated_mib"] + (c["gpus"] - 1) * c["others_allocated_mib"]) / c["gpus"]
        diff, noise = rank - d["dev0_allocated_mib"], c["noise_mib"] + d["noise_mib"]
        out.append({"group": c["group"], "gpus": c["gpus"], "num_classes": c.get("num_classes"),
                    "ddp_rank_mib": rank, "dp_dev0_mib": d["dev0_allocated_mib"], "dp_others_mib": d["others_allocated_mib"],
                    "diff_mib": diff, "noise_mib": noise,
                    "call": "higher" if diff > noise else "lower" if diff < -noise else "within noise"})
    return out


def gathered_cost_onset(found: dict[str, dict[str, int]]) -> tuple[str | None, bool]:
    """found: variant -> {classes: global batch}. The narrowest width from which computing the
    loss on the gathered outputs (dp) costs batch against computing it in the replicas (dp_sum)
    at every wider width measured (None where the widest does not), and whether that is clean:
    no narrower width costs batch (an effect that comes and goes with the width states no
    condition). Differences within 2 x RESOLUTION are the search's own granularity."""
    dp, inside = found.get("dp", {}), found.get("dp_sum", {})
    margin = 1 - 2 * RESOLUTION
    widths = sorted((c for c, b in dp.items() if b > 0), key=int)
    costs = [c in inside and dp[c] < margin * inside[c] for c in widths]
    first = None
    for c, cost in zip(reversed(widths), reversed(costs)):
        if not cost:
            break
        first = c
    below = costs[:widths.index(first)] if first else costs
    return first, not any(below)


def verdict_from(found: dict[str, dict[str, int]]) -> str:
    """found: variant -> {classes: global batch}. Confirmed where the gathered outputs cost batch
    from some width on (gathered_cost_onset: the condition the ledger states) and not below it;
    refuted where dp trains as much as two single GPUs at every width; else nuance."""
    dp, single = found.get("dp", {}), found.get("single", {})
    widths = sorted((c for c, b in dp.items() if b > 0), key=int)
    if not widths:
        return NOT_RUN
    first, clean = gathered_cost_onset(found)
    if first is not None and clean:
        return CONFIRMED
    margin = 1 - 2 * RESOLUTION
    if single and all(c in single and dp[c] >= margin * DP_GPUS * single[c] for c in widths):
        return REFUTED
    return NUANCE


@dataclass
class C1Runs:
    """What C1's runs showed (their cells' dicts are what claims.json's data and the figure hold)."""
    verdict: str
    cells: list[dict[str, Any]]               # every (group, variant, gpus) cell of device 0 against the others
    dp: list[dict[str, Any]]                  # the dp cells among them, judged (_judge)
    sweeps: list[list[dict[str, Any]]]        # the sized dp cells by what an output-size sweep holds fixed
    onsets: list[tuple[dict[str, Any] | None, bool]]   # per sweep: where the outputs start to dominate, cleanly?
    ddp_vs_dp: list[dict[str, Any]]

    @property
    def unsized(self) -> int:
        """dp cells without a run config: on no sweep."""
        return len(self.dp) - sum(len(s) for s in self.sweeps)

    def conditions(self) -> list[dict[str, Any]]:
        """Per sweep, the condition the verdict states: from which output size, and whether cleanly."""
        return [{"batch": s[0].get("global_batch"), "gpus": s[0]["gpus"], "precision": s[0].get("precision"),
                 "outputs": [c.get("num_classes") for c in s],
                 "from_outputs": first.get("num_classes") if first else None, "clean": clean}
                for s, (first, clean) in zip(self.sweeps, self.onsets)]


def from_runs(ev) -> C1Runs | None:
    """C1's cells judged, swept and decided; None where no dp run measured memory."""
    cells = c1_cells(ev, ev.claim_groups("C1"))
    dp = [c for c in cells if c["variant"] == "dp"]
    if not dp:
        return None
    for c in dp:
        _judge(c, cells)
    # An output-size sweep needs each cell's size: cells without a run config (metrics.json)
    # join the evidence lines, not the sweeps, their onsets or the advice.
    sweeps = _sweeps([c for c in dp if "num_classes" in c])
    onsets = [_onset(s) for s in sweeps]
    return C1Runs(_c1_verdict(dp, onsets), cells, dp, sweeps, onsets, ddp_vs_dp_device0(cells))


def decide(runs_verdict: str, probe_verdict: str | None) -> str:
    """C1's verdict: the runs' where they measured memory; the probe's batch search decides only
    where no run did (None: no probe record)."""
    if runs_verdict != NOT_RUN or probe_verdict is None:
        return runs_verdict
    return probe_verdict

