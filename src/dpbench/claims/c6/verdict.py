"""C6's evidence as numbers: how an uneven split reweights samples, the training runs' paired
differences between the reductions with their intervals and practical size, and the verdict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import Any

import pandas as pd
from scipy import stats

from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE
from dpbench.plan.config import RunConfig


FIRST_STEPS = 5            # steps compared before trajectories drift apart chaotically
CONFIDENCE = 0.95          # of the intervals on training differences
# A reduction's effect on the final loss whose whole interval lies within this share of the
# seed-to-seed spread (single's sd over seeds) is negligible in practice: changing the seed moves
# the loss four times as much, so no one training a single run could see it.
NEGLIGIBLE = 0.25


def uneven_split(batch: int, gpus: int) -> bool:
    """Whether DataParallel's scatter (torch.chunk) gives devices different shares: 6 on 4 GPUs
    is 2/2/2 on three devices, an even split, though 6 % 4 != 0."""
    return len(set(chunk_sizes(batch, gpus))) > 1


def chunk_sizes(n: int, parts: int) -> list[int]:
    """torch.chunk's split of n samples into `parts` (DataParallel's scatter), without torch."""
    size = -(-n // parts)
    sizes = [size] * (n // size)
    return sizes + ([n % size] if n % size else [])


def reweighting(n: int, parts: int) -> dict[str, Any]:
    """Mean of per-replica means: each sample's weight relative to the true mean's 1/n."""
    chunks = chunk_sizes(n, parts)
    rel = [n / (len(chunks) * c) - 1 for c in chunks]
    return {"batch": n, "chunks": chunks, "relative_weight": rel, "max_abs": max(abs(r) for r in rel)}


def _interval(values: list[float]) -> dict[str, float]:
    """Mean and its two-sided confidence interval (Student's t) over paired differences."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return {"mean": m, "lo": math.nan, "hi": math.nan, "n": n, "sd": math.nan}
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n, "sd": sd}


def practical_size(ci: dict[str, float], seed_sd: float) -> dict[str, Any]:
    """An effect's interval as shares of the seed-to-seed sd (the sd taken as known: it comes
    from as few seeds), and whether the whole interval lies within NEGLIGIBLE of it (None where
    there is no interval or no spread to weigh it against)."""
    if ci["n"] < 2 or not seed_sd > 0:
        return {"share": math.nan, "share_lo": math.nan, "share_hi": math.nan, "negligible": None}
    largest = max(abs(ci["lo"]), abs(ci["hi"]))
    return {"share": ci["mean"] / seed_sd, "share_lo": ci["lo"] / seed_sd, "share_hi": ci["hi"] / seed_sd,
            "negligible": bool(largest < NEGLIGIBLE * seed_sd)}


def _excludes_zero(ci: dict[str, float]) -> bool:
    return ci["n"] >= 2 and (ci["lo"] > 0 or ci["hi"] < 0)


def _steps(ev, run_id: str) -> pd.DataFrame:
    st = ev.tables["steps"]
    return st[st["run_id"] == run_id].sort_values(["epoch", "step"])[["epoch", "step", "loss_global"]]


def _loss_gap(base: pd.DataFrame, other: pd.DataFrame) -> dict[str, Any]:
    m = base.merge(other, on=["epoch", "step"], suffixes=("_a", "_b"))
    gap = (m["loss_global_a"] - m["loss_global_b"]).abs()
    if gap.empty:
        return {"first_steps_max": math.nan, "all_steps_max": math.nan, "steps": 0, "by_step": []}
    return {"first_steps_max": float(gap.head(FIRST_STEPS).max()), "all_steps_max": float(gap.max()),
            "steps": int(len(gap)), "by_step": [float(g) for g in gap]}


def _seed_of(ev, row) -> Any:
    cfg = ev.run_config(row.run_id)
    return cfg.get("seed", row.repeat) if cfg else f"repeat {row.repeat}"


def c6_training(ev) -> list[dict[str, Any]]:
    """Per C6 group on an uneven split: paired (same seed) differences of final loss and test
    accuracy between the reductions and one device, over the repeats."""
    out = []
    for g in ev.claim_groups("C6"):
        single = ev.rows(g, "single", 1)
        if single.empty:
            continue
        batch = int(single["global_batch"].iloc[0])
        for gpus in sorted(set(ev.groups[g]["gpus"]) - {1}):
            runs = {"single": single, **{v: ev.rows(g, v, gpus) for v in ("dp_mean", "dp_sum")}}
            if any(r.empty for r in runs.values()):
                continue
            by_seed = {v: {_seed_of(ev, r): r for r in rows.itertuples()} for v, rows in runs.items()}
            seeds = sorted(set.intersection(*(set(s) for s in by_seed.values())), key=str)
            if not seeds:
                continue
            diffs: dict[str, dict[str, list[float]]] = {}
            for a, b in (("dp_mean", "single"), ("dp_sum", "single"), ("dp_mean", "dp_sum")):
                for metric in ("final_loss", "test_acc"):
                    vals = [float(getattr(by_seed[a][s], metric)) - float(getattr(by_seed[b][s], metric))
                            for s in seeds]
                    diffs.setdefault(f"{a}-{b}", {})[metric] = [v for v in vals if not math.isnan(v)]
            gaps = {v: [_loss_gap(_steps(ev, by_seed["single"][s].run_id), _steps(ev, by_seed[v][s].run_id))
                        for s in seeds] for v in ("dp_mean", "dp_sum")}
            deterministic = [bool((ev.run_config(r.run_id) or {}).get("deterministic")) for r in single.itertuples()]
            spread = {m: _interval([float(getattr(by_seed["single"][s], m)) for s in seeds]) for m in ("final_loss", "test_acc")}
            out.append({"group": g, "gpus": gpus, "batch": batch, "uneven": uneven_split(batch, gpus),
                        "bn_eval": ev.groups[g]["options"].get("batchnorm") == "eval",
                        "deterministic": all(deterministic), "seeds": [str(s) for s in seeds],
                        "reweighting": reweighting(batch, gpus),
                        "intervals": {pair: {m: _interval(v) for m, v in d.items() if v} for pair, d in diffs.items()},
                        "single_spread": spread,
                        "first_steps_gap": {v: median(x["first_steps_max"] for x in gs) for v, gs in gaps.items()},
                        "gaps_first_seed": {v: gs[0] for v, gs in gaps.items()}})
    return out


@dataclass
class C6Training:
    """What C6's training runs decided, on the uneven split that decides (BN eval first)."""
    verdict: str                             # the probe's where training did not decide
    training: list[dict[str, Any]]           # every C6 group on 2+ GPUs, paired by seed
    decisive: dict[str, Any] | None = None   # the deciding group's entry of `training`
    loss: dict[str, float] = field(default_factory=dict)   # dp_mean - dp_sum final loss, its interval
    acc: dict[str, float] = field(default_factory=dict)    # ... and test accuracy's
    measurable: bool = False                 # the loss interval excludes zero
    size: dict[str, Any] = field(default_factory=dict)     # practical_size against the seeds' spread
    need_gpus: int = 2                       # where no uneven split ran: the fewest GPUs that split one


def from_training(ev, probe_verdict: str) -> C6Training:
    training = c6_training(ev)
    decisive = [t for t in training if t["uneven"]]
    decisive = [t for t in decisive if t["bn_eval"]] or decisive  # BN eval isolates the reduction
    if not decisive:
        groups = ev.claim_groups("C6")
        need = min((n for g in groups for n in ev.groups[g]["gpus"]
                    if uneven_split(int(ev.groups[g]["options"].get("global_batch", RunConfig.global_batch)), n)),
                   default=2)
        return C6Training(probe_verdict, training, need_gpus=need)
    t = decisive[0]
    loss = t["intervals"]["dp_mean-dp_sum"].get("final_loss", {"n": 0, "mean": math.nan})
    acc = t["intervals"]["dp_mean-dp_sum"].get("test_acc", {"n": 0, "mean": math.nan})
    measurable = _excludes_zero(loss) if loss["n"] else False
    seeds = t["single_spread"]["final_loss"]
    size = practical_size(loss, seeds["sd"]) if loss["n"] else practical_size({"n": 0}, math.nan)
    t["practical"] = size
    # confirmed: told apart from zero and not negligible against what changing the seed does
    # (with no seed-to-seed spread to weigh it against, its size in practice is unknown: nuance)
    verdict = CONFIRMED if measurable and size["negligible"] is False else NUANCE
    if probe_verdict not in (CONFIRMED, NOT_RUN):
        verdict = probe_verdict  # training cannot rescue a probe that saw no bias
    return C6Training(verdict, training, t, loss, acc, measurable, size)

