"""Ledger findings that rest on the claims experiment's runs: C1, C8, and the training half of C6 and C7.

Every cell is measured over repeats; a difference counts only beyond the spread of those
repeats (or a named floor where the repeats agree to the last bit). Thresholds are named
constants so that a verdict can be traced to the number that decided it. Verdicts state the
conditions they were measured under and say nothing about others.
"""
from __future__ import annotations

import math
from statistics import median
from typing import Any

import pandas as pd

from dpbench import DP_VARIANTS
from dpbench.collect import model_mib
from dpbench.claims import ADVICE, CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.from_probes import c1_max_batch, probe_finding
from dpbench.claims.records import STAGES, Finding, ProbeRecord

MIB = 2 ** 20
FEATURES = 512             # ResNet18's penultimate width (dpbench.model.FEATURES)
BACKBONE_PARAMS = 11_168_832   # ResNet18-CIFAR without its output layer; tests check both against the model
NOISE_FLOOR_MIB = 1.0      # below this a per-device difference is allocator granularity, not evidence
GATHER_SHARE = 0.5         # the gathered outputs must explain this much of device 0's excess
FIRST_STEPS = 5            # steps compared before trajectories drift apart chaotically
CONFIDENCE = 0.95          # of the intervals on training differences
SLOWDOWN = 1.5             # benchmark-on step time over benchmark-off that counts as "much slower"
UNCHANGED = 1.1            # ... and the ratio under which it counts as no effect
SPEED_NOISE = 0.03         # relative speed differences below this are not told apart, whatever the repeats say
THREAD_EFFECT = 1.3        # persistent replica threads this many times faster than stock DP: threads are the cost
EPOCH_IMAGES = 50_000      # CIFAR-10's training set: epoch time at a run's measured rate
# Options that set a run's length, not what it measures: groups differing only in these are twins.
BUDGET_KEYS = {"max_steps", "warmup_steps", "epochs", "eval_each_epoch", "eval_samples", "log_every"}


def param_count(num_classes: int = 10) -> int:
    """ResNet18-CIFAR's parameters with an output layer of num_classes (weights and biases)."""
    return BACKBONE_PARAMS + (FEATURES + 1) * num_classes


def _multi_gpu(ev, groups: list[str]) -> int:
    return min((n for g in groups for n in ev.groups[g]["gpus"] if n > 1), default=2)


def _not_run(ev, groups: list[str]) -> Finding:
    return Finding(verdict=NOT_RUN, not_run=ev.not_run(_multi_gpu(ev, groups), groups),
                   measured_on=[ev.measured_on_runs()])


def _fmt_batch(b: float) -> str:
    return f"{b:,.0f}"


def _about(b: float) -> str:
    """An interpolated batch to two significant figures: "about 4,100", not "about 4,095"."""
    return f"{float(f'{b:.2g}'):,.0f}"


# -- C1: memory on device 0, as a function of the output size ------------------------------

def _device_mib(ev, run_id: str) -> pd.DataFrame:
    """Per device: allocated less the dataset resident there (collect's rule), reserved, NVML."""
    mem = ev.tables["memory"]
    rows = mem[mem["run_id"] == run_id]
    out = pd.DataFrame({"allocated": [model_mib(r) for r in rows.to_dict("records")],
                        "reserved": pd.to_numeric(rows["reserved_mib"], errors="coerce").to_numpy(),
                        "nvml": pd.to_numeric(rows["nvml_used_mib"], errors="coerce").to_numpy()},
                       index=rows["device"].to_numpy())
    return out.dropna(subset=["allocated"]).sort_index()


def device0_excess_estimate(global_batch: int, gpus: int, num_classes: int = 10, precision: str = "fp32",
                            momentum: bool = True, loss_on_gathered: bool = True) -> dict[str, float]:
    """MiB that device 0 holds beyond the mean of the other devices at the end of the forward
    pass, item by item from sizes. The master weights are not among them: every other device
    holds a replica's copy while the step runs. The summed gradients are: the last step's stay
    until zero_grad, which follows the forward pass. With the loss on the gathered outputs
    (variant dp) device 0 also holds the whole batch's outputs and the loss's log-softmax of
    them (kept for backward, fp32); with the loss inside the replicas neither exists."""
    weights = param_count(num_classes) * 4 / MIB
    sample = (3 * 32 * 32 * 4 + 8) / MIB                  # one image and its int64 label
    own = -(-global_batch // gpus)                         # scatter gives device 0 the largest chunk
    others = (global_batch - own) / (gpus - 1)
    out_bytes = 2 if precision == "bf16" else 4            # autocast's Linear returns bf16
    logits = global_batch * num_classes / MIB
    return {"summed_grads": weights,
            "momentum": weights if momentum else 0.0,
            # the global batch arrives on device 0 and stays there; its own chunk is a view of it
            "input_batch": (global_batch - others) * sample,
            "gathered_logits": logits * out_bytes if loss_on_gathered else 0.0,
            "loss_log_softmax": logits * 4 if loss_on_gathered else 0.0}


def _c1_cells(ev, groups: list[str]) -> list[dict[str, Any]]:
    """One cell per (group, variant, gpus): medians over repeats of device 0 against the others."""
    cells = []
    for g in groups:
        summ = ev.rows(g)
        for (variant, gpus), runs in summ[summ["gpus"] > 1].groupby(["variant", "gpus"]):
            if variant not in (*DP_VARIANTS, "ddp"):
                continue
            per_run = []
            for rid in runs["run_id"]:
                mib = _device_mib(ev, rid)
                if 0 not in mib.index or len(mib) < 2:
                    continue
                others = mib.drop(index=0)
                per_run.append({"run_id": rid, "dev0": mib.loc[0].to_dict(), "others": others.mean().to_dict(),
                                "excess": mib.loc[0, "allocated"] - others["allocated"].mean(),
                                "rank_spread": mib["allocated"].max() - mib["allocated"].min(),
                                "config": ev.run_config(rid)})
            if not per_run:
                continue
            excess = [r["excess"] for r in per_run]
            cfg = per_run[0]["config"]
            cell = {"group": g, "variant": variant, "gpus": int(gpus), "repeats": len(per_run),
                    "run_ids": [r["run_id"] for r in per_run],
                    "excess_mib": median(excess), "repeat_spread_mib": max(excess) - min(excess),
                    "rank_spread_mib": median(r["rank_spread"] for r in per_run),
                    **{f"dev0_{k}_mib": median(r["dev0"][k] for r in per_run) for k in ("allocated", "reserved", "nvml")},
                    **{f"others_{k}_mib": median(r["others"][k] for r in per_run) for k in ("allocated", "reserved", "nvml")},
                    "config_found": cfg is not None}
            if cfg is not None:
                cell.update(num_classes=int(cfg.get("num_classes", 10)), precision=cfg.get("precision", "fp32"),
                            global_batch=int(cfg["global_batch"]), momentum=float(cfg.get("momentum", 0.0)))
                if variant in DP_VARIANTS:
                    est = device0_excess_estimate(cell["global_batch"], cell["gpus"], cell["num_classes"],
                                                  cell["precision"], cell["momentum"] > 0, variant == "dp")
                    cell.update(estimate_mib=est, estimate_total_mib=sum(est.values()),
                                logits_estimate_mib=est["gathered_logits"] + est["loss_log_softmax"])
            cells.append(cell)
    # the noise of a DP cell: its repeats' spread, the DDP ranks' spread in its group, a floor
    for c in cells:
        ddp = [d["rank_spread_mib"] for d in cells if d["variant"] == "ddp" and d["group"] == c["group"]
               and d["gpus"] == c["gpus"]]
        c["noise_mib"] = max(c["repeat_spread_mib"], max(ddp, default=0.0), NOISE_FLOOR_MIB)
        c["ratio"] = c["dev0_allocated_mib"] / c["others_allocated_mib"] if c["others_allocated_mib"] else math.nan
    return cells


def _gathered_share(cell: dict, cells: list[dict]) -> tuple[float | None, str]:
    """How much of a dp cell's excess the gathered outputs explain: measured as dp's excess less
    that of DataParallel with the loss inside the replicas (same group), else from sizes."""
    twin = [c for c in cells if c["group"] == cell["group"] and c["gpus"] == cell["gpus"]
            and c["variant"] in ("dp_sum", "dp_mean")]
    if cell["excess_mib"] <= 0:
        return None, "no excess"
    if twin:
        return (cell["excess_mib"] - twin[0]["excess_mib"]) / cell["excess_mib"], f"measured against {twin[0]['variant']}"
    if "logits_estimate_mib" in cell:
        return cell["logits_estimate_mib"] / cell["excess_mib"], "estimated from sizes"
    return None, "no run config (metrics.json) to size the outputs"


def _c1_line(c: dict[str, Any]) -> str:
    head = (f"{c['variant']} on {c['gpus']} GPUs, batch {c.get('global_batch', '?')}, "
            f"{c.get('num_classes', '?')} outputs ({c.get('precision', '?')}), {c['repeats']} repeats: ")
    alloc = (f"allocated less resident data, device 0 {c['dev0_allocated_mib']:.1f} MiB vs others "
             f"{c['others_allocated_mib']:.1f}: {c['excess_mib']:+.1f} MiB ({c['ratio']:.2f}x), noise "
             f"{c['noise_mib']:.1f} MiB")
    if c["variant"] == "ddp":
        alloc = (f"allocated less resident data per rank {c['dev0_allocated_mib']:.1f} / "
                 f"{c['others_allocated_mib']:.1f} MiB (rank spread {c['rank_spread_mib']:.1f} MiB)")
    extra = [f"reserved {c['dev0_reserved_mib']:.0f} vs {c['others_reserved_mib']:.0f} MiB"]
    if not math.isnan(c["dev0_nvml_mib"]):
        extra.append(f"NVML {c['dev0_nvml_mib']:.0f} vs {c['others_nvml_mib']:.0f} MiB")
    line = head + alloc + "; " + ", ".join(extra)
    if "estimate_mib" in c:
        e = c["estimate_mib"]
        parts = " + ".join(f"{k.replace('_', ' ')} {v:.1f}" for k, v in e.items() if v)
        line += f"; from sizes (this run's classes, dtype, momentum): {parts} = {c['estimate_total_mib']:.1f} MiB"
    if c.get("gathered_share") is not None:
        line += f"; gathered outputs {c['gathered_share']:.0%} of the excess ({c['share_basis']})"
    return line


def _with_max_batch(ev, f: Finding) -> Finding:
    """C1's runs measure memory at fixed batches; the probe (dpbench.claims.c1_max_batch) what
    that costs in batch. Its numbers join the evidence and the summary; its verdict counts only
    where no run measured memory."""
    if "C1" not in ev.probes:
        return f
    p = probe_finding(ev, "C1", c1_max_batch)
    f.evidence += p.evidence
    f.measured_on += p.measured_on
    f.data["probe"] = p.data.get("probe")
    if p.verdict == NOT_RUN:
        return f
    if f.verdict == NOT_RUN:
        f.evidence.insert(0, f.not_run or NOT_RUN)
        f.verdict, f.summary, f.not_run = p.verdict, p.summary, None
    else:
        f.summary = f"{f.summary}; {p.summary}"
    return f


def c1(ev) -> Finding:
    return _with_max_batch(ev, _c1_from_runs(ev))


def _c1_from_runs(ev) -> Finding:
    groups = ev.claim_groups("C1")
    cells = _c1_cells(ev, groups)
    dp = [c for c in cells if c["variant"] == "dp"]
    if not dp:
        return _not_run(ev, groups)
    for c in dp:
        c["gathered_share"], c["share_basis"] = _gathered_share(c, cells)
        c["above_noise"] = c["excess_mib"] > c["noise_mib"]
        c["outputs_dominate"] = c["above_noise"] and (c["gathered_share"] or 0.0) >= GATHER_SHARE
    dp.sort(key=lambda c: (c.get("num_classes", 0), c.get("global_batch", 0)))
    dominated = [c for c in dp if c["outputs_dominate"]]
    if not any(c["above_noise"] for c in dp):
        verdict = REFUTED
    elif len(dominated) == len(dp):
        verdict = CONFIRMED
    else:
        verdict = NUANCE   # device 0 is heavier, but not (always) for the article's reason
    small = [c for c in dp if not c["outputs_dominate"]]
    parts = []
    if dominated:
        d = dominated[0]
        parts.append(f"right once the gathered outputs dominate: from {d.get('num_classes', '?'):,} outputs at batch "
                     f"{d.get('global_batch', '?')} device 0 holds {d['excess_mib']:+.0f} MiB ({d['ratio']:.2f}x), "
                     f"{d['gathered_share']:.0%} of it the gathered outputs")
    if small:
        s = small[-1]
        parts.append(f"at {s.get('num_classes', '?'):,} outputs {s['excess_mib']:+.0f} MiB ({s['ratio']:.2f}x), "
                     f"gathered outputs {(s['gathered_share'] or 0):.0%} of it (the rest, from sizes: summed "
                     f"gradients, momentum, input batch)")
    inside = [c for c in cells if c["variant"] in ("dp_sum", "dp_mean")]
    if inside:
        worst = max(inside, key=lambda c: c["excess_mib"])
        parts.append(f"loss inside the replicas: at most {worst['excess_mib']:+.0f} MiB ({worst['ratio']:.2f}x)")
    reserved = [c["dev0_reserved_mib"] / c["others_reserved_mib"] for c in dp if c["others_reserved_mib"] > 0]
    if reserved:
        parts.append(f"reserved memory (what nvidia-smi sees, less the context) device 0 / others "
                     f"{min(reserved):.2f}-{max(reserved):.2f}x")
    ddp = [c for c in cells if c["variant"] == "ddp"]
    if ddp:
        parts.append("DDP ranks within " + f"{max(c['rank_spread_mib'] for c in ddp):.1f} MiB of each other")
    lines = [_c1_line(c) for c in cells]
    for c in ddp:   # each rank holds what DP keeps on device 0 alone: is a DDP rank above DP's device 0?
        same = [d for d in dp if d["group"] == c["group"] and d["gpus"] == c["gpus"]]
        if same:
            lines.append(f"{c['group']}: each DDP rank peaks at {c['dev0_allocated_mib']:.0f} MiB allocated, DP's "
                         f"device 0 at {same[0]['dev0_allocated_mib']:.0f} MiB and its other devices at "
                         f"{same[0]['others_allocated_mib']:.0f} MiB")
    advice = None
    if dominated:
        d = dominated[0]
        advice = (f"With a wide output (here from {d.get('num_classes', '?'):,} outputs at batch {d.get('global_batch', '?')}) "
                  f"compute the loss inside the replicas and return per-replica sums divided by the global batch "
                  f"(dpbench's dp_sum), or use DDP: device 0 then no longer holds the whole batch's outputs. "
                  f"With a narrow output, device 0's extra is the summed gradients, the optimizer state and the "
                  f"input batch; size the batch for it.")
    elif verdict == NUANCE:
        advice = ADVICE["C1"]
    return Finding(verdict=verdict, summary="the article is " + "; ".join(parts) if dominated else
                   "; ".join(parts) or "no DP run above noise",
                   evidence=lines, data={"cells": cells}, runs_used=True, advice=advice,
                   measured_on=[ev.measured_on_runs()])


# -- C6: reductions in training, with statistics -------------------------------------------

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
    from scipy import stats

    n = len(values)
    m = sum(values) / n
    if n < 2:
        return {"mean": m, "lo": math.nan, "hi": math.nan, "n": n, "sd": math.nan}
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n, "sd": sd}


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
            out.append({"group": g, "gpus": gpus, "batch": batch, "uneven": batch % gpus != 0,
                        "bn_eval": ev.groups[g]["options"].get("batchnorm") == "eval",
                        "deterministic": all(deterministic), "seeds": [str(s) for s in seeds],
                        "reweighting": reweighting(batch, gpus),
                        "intervals": {pair: {m: _interval(v) for m, v in d.items() if v} for pair, d in diffs.items()},
                        "single_spread": spread,
                        "first_steps_gap": {v: median(x["first_steps_max"] for x in gs) for v, gs in gaps.items()},
                        "gaps_first_seed": {v: gs[0] for v, gs in gaps.items()}})
    return out


def _ci_text(ci: dict[str, float], scale: float = 1.0, unit: str = "") -> str:
    if ci["n"] < 2:
        return f"{ci['mean'] * scale:+.3g}{unit} (n=1, no interval)"
    return (f"{ci['mean'] * scale:+.3g}{unit} [{ci['lo'] * scale:+.3g}, {ci['hi'] * scale:+.3g}] "
            f"({CONFIDENCE:.0%} CI, {ci['n']} seeds)")


def _with_training(ev, f: Finding, verdict: str, text: str) -> Finding:
    """A probe's finding once training runs decided: their text follows the probe's summary (or
    replaces it where the probe did not run, whose reason then leads the evidence), and the
    verdict is the one decided with them."""
    if f.not_run:
        f.evidence.insert(0, f.not_run)
        f.summary = text
    else:
        f.summary = f"{f.summary}; {text}"
    f.measured_on.append(ev.measured_on_runs())
    f.verdict, f.not_run, f.runs_used = verdict, None, True
    return f


def _c6_line(t: dict[str, Any]) -> str:
    iv = t["intervals"]
    w = t["reweighting"]
    out = [f"training {t['group']}, batch {t['batch']} on {t['gpus']} GPUs (chunks {'/'.join(map(str, w['chunks']))}), "
           f"{'deterministic' if t['deterministic'] else 'not deterministic'}, seeds {', '.join(t['seeds'])}: "
           f"mean of means reweights samples by up to {w['max_abs']:.2%}"]
    for pair, d in iv.items():
        parts = []
        if "final_loss" in d:
            parts.append(f"final loss {_ci_text(d['final_loss'])}")
        if "test_acc" in d:
            parts.append(f"test accuracy {_ci_text(d['test_acc'], 100, ' pp')}")
        out.append(f"{pair.replace('-', ' - ')}: " + ", ".join(parts))
    sp = t["single_spread"]
    out.append(f"seed-to-seed spread of single: final loss sd {sp['final_loss']['sd']:.3g}, test accuracy sd "
               f"{sp['test_acc']['sd'] * 100:.3g} pp")
    g = t["first_steps_gap"]
    out.append(f"max |loss - single| over the first {FIRST_STEPS} steps (median over seeds): dp_mean "
               f"{g['dp_mean']:.3g} vs dp_sum {g['dp_sum']:.3g}")
    return "; ".join(out[:1]) + "\n  - " + "\n  - ".join(out[1:])


def c6(ev) -> Finding:
    f = probe_finding(ev, "C6", _c6_summary)
    training = c6_training(ev)
    groups = ev.claim_groups("C6")
    decisive = [t for t in training if t["uneven"]]
    decisive = [t for t in decisive if t["bn_eval"]] or decisive  # BN eval isolates the reduction
    f.evidence += [_c6_line(t) for t in training]
    f.data["training"] = training
    if not decisive:
        need = min((n for g in groups for n in ev.groups[g]["gpus"]
                    if int(ev.groups[g]["options"].get("global_batch", 128)) % n), default=2)
        f.evidence.append(f"training runs on an uneven split: {ev.not_run(need, groups)}")
        return f
    t = decisive[0]
    loss = t["intervals"]["dp_mean-dp_sum"].get("final_loss", {"n": 0, "mean": math.nan})
    acc = t["intervals"]["dp_mean-dp_sum"].get("test_acc", {"n": 0, "mean": math.nan})
    measurable = _excludes_zero(loss) if loss["n"] else False
    verdict = CONFIRMED if measurable else NUANCE
    if f.verdict not in (CONFIRMED, NOT_RUN):
        verdict = f.verdict  # training cannot rescue a probe that saw no bias
    w = t["reweighting"]
    text = (f"in training ({t['batch']} on {t['gpus']} GPUs, {'/'.join(map(str, w['chunks']))}: weights off by "
            f"{w['max_abs']:.2%}) dp_mean - dp_sum final loss {_ci_text(loss) if loss['n'] else 'n/a'}, test accuracy "
            f"{_ci_text(acc, 100, ' pp') if acc['n'] else 'n/a'}: "
            + ("a measurable effect" if measurable else "no effect told apart from zero at this size"))
    return _with_training(ev, f, verdict, text)


def _c6_summary(p: ProbeRecord) -> str:
    arith = p.values("c6.article_example")
    emu = p.values("c6.cpu.bn_eval.batch128_split3")
    text = (f"[0.3, 0.2, 0.8]: {arith.get('one device mean', {}).get('value')} on one device, "
            f"{arith.get('mean of per-device means', {}).get('value')} as mean of means, "
            f"{arith.get('sum / N', {}).get('value')} as sum/N")
    if emu:
        text += (f"; 128 on 3 (43/43/42) gradient off by {emu['grad_rel_diff_mean_of_means']:.2g} (mean of means) vs "
                 f"{emu['grad_rel_diff_sum_over_n']:.2g} (sum/N), CPU emulation")
    for o in p.with_prefix("c6.gpu."):
        if len(set(o.get("chunks", []))) > 1:
            text += (f"; DataParallel batch {o.get('batch')} on {o.get('gpus')} GPUs: "
                     f"{o.get('grad_rel_diff_dp_mean_vs_single'):.2g} vs {o.get('grad_rel_diff_dp_sum_vs_single'):.2g}")
    return text


# -- where DataParallel's time goes (the C7 probe's step breakdown) -------------------------

def dp_step_cause(ev, flag: str = "off") -> dict[str, Any] | None:
    """From the C7 probe: one GPU, stock DP and DP on persistent replica threads, and the stage
    that costs most; None where the probe did not take the step apart."""
    p: ProbeRecord | None = ev.probes.get("C7")
    if p is None or p.find(f"c7.dp_step.bench_{flag}.steps") is None:
        return None
    steps = p.values(f"c7.dp_step.bench_{flag}.steps")
    stages = p.values(f"c7.dp_step.bench_{flag}.stages.dp")
    pstages = p.values(f"c7.dp_step.bench_{flag}.stages.dp_persistent_threads")
    stock, pers, single = (steps[k]["step_ms"] for k in ("dp", "dp_persistent_threads", "single"))
    named = {k: v for k, v in stages.items() if k not in ("total", "timed_steps")}
    largest = max(named, key=named.get) if named else None
    threads = stock / pers >= THREAD_EFFECT
    return {"benchmark": flag, "batch": steps.get("batch"), "gpus": steps.get("gpus"),
            "single_ms": single, "dp_ms": stock, "dp_persistent_ms": pers,
            "dp_speedup": single / stock, "dp_persistent_speedup": single / pers,
            "stages": stages, "persistent_stages": pstages, "largest_stage": largest,
            "cause": "fresh replica threads" if threads else largest,
            "threads_are_the_cost": threads}


def _cause_text(c: dict[str, Any]) -> str:
    head = (f"batch {c['batch']} on {c['gpus']} GPUs, cudnn.benchmark {c['benchmark']}: one GPU {c['single_ms']:.1f} ms "
            f"a step, stock DP {c['dp_ms']:.1f} ms ({c['dp_speedup']:.2f}x), DP on persistent replica threads "
            f"{c['dp_persistent_ms']:.1f} ms ({c['dp_persistent_speedup']:.2f}x)")
    st = c["stages"]
    stage_text = ", ".join(f"{k.replace('_', ' ')} {st[k]:.1f}" for k in STAGES if k in st)
    if c["threads_are_the_cost"]:
        return (f"{head}: the cost is starting new replica threads every step (each new thread sets up its "
                f"cuDNN/cuBLAS state again), not scatter, replication or gather; stock step by stage (ms): {stage_text}")
    return f"{head}: largest stage {c['largest_stage']}; stock step by stage (ms): {stage_text}"


# -- C7: cudnn.benchmark under DataParallel -----------------------------------------------

def _twin(ev, group: str, key: str) -> str | None:
    """Another group whose options equal this one's except `key` (absent or different) and the
    step budget: the other leg of a comparison of `key`."""
    mine = {k: v for k, v in ev.groups[group]["options"].items() if k not in BUDGET_KEYS | {key}}
    for g, spec in ev.groups.items():
        other = spec["options"]
        if g != group and other.get(key) != ev.groups[group]["options"].get(key) and \
                {k: v for k, v in other.items() if k not in BUDGET_KEYS | {key}} == mine:
            return g
    return None


def c7_training(ev) -> list[dict[str, Any]]:
    """Step p50 with cudnn.benchmark on and off (medians and ranges over repeats), per variant and GPU count."""
    out = []
    for on in ev.claim_groups("C7"):
        if not ev.groups[on]["options"].get("cudnn_benchmark"):
            continue
        off = _twin(ev, on, "cudnn_benchmark")
        if off is None:
            continue
        for variant in ev.groups[on]["variants"]:
            for gpus in ([1] if variant == "single" else ev.groups[on]["gpus"]):
                a, b = ev.rows(on, variant, gpus), ev.rows(off, variant, gpus)
                if a.empty or b.empty:
                    continue
                p_on, p_off = a["step_ms_p50"].median(), b["step_ms_p50"].median()
                out.append({"variant": variant, "gpus": gpus, "on_group": on, "off_group": off,
                            "p50_on_ms": p_on, "p50_off_ms": p_off, "ratio": p_on / p_off,
                            "ratio_lo": a["step_ms_p50"].min() / b["step_ms_p50"].max(),
                            "ratio_hi": a["step_ms_p50"].max() / b["step_ms_p50"].min(),
                            "repeats": min(len(a), len(b))})
    return out


def c7(ev) -> Finding:
    f = probe_finding(ev, "C7", _c7_summary)
    training = c7_training(ev)
    f.evidence += [
        f"training {t['variant']} on {t['gpus']} GPU(s): step p50 {t['p50_on_ms']:.1f} ms with benchmark on "
        f"({t['on_group']}), {t['p50_off_ms']:.1f} ms off ({t['off_group']}): {t['ratio']:.2f}x "
        f"(over {t['repeats']} repeats {t['ratio_lo']:.2f}-{t['ratio_hi']:.2f}x)" for t in training]
    f.data["training"] = training
    cause_on, cause_off = dp_step_cause(ev, "on"), dp_step_cause(ev, "off")
    f.data["dp_step"] = {"on": cause_on, "off": cause_off}
    dp = [t for t in training if t["variant"] == "dp" and t["gpus"] > 1]
    groups = ev.claim_groups("C7")
    if not dp:
        f.evidence.append(f"training runs: {ev.not_run(_multi_gpu(ev, groups), groups)}")
        return f
    others_slow = any(t["ratio_lo"] > SLOWDOWN for t in training if t["variant"] != "dp")
    t = max(dp, key=lambda t: t["ratio"])
    if t["ratio_hi"] <= UNCHANGED:
        verdict = REFUTED
    elif t["ratio_lo"] > SLOWDOWN and not others_slow and f.verdict in (CONFIRMED, NOT_RUN):
        verdict = CONFIRMED
    else:
        verdict = NUANCE  # slower, but mildly, within the repeats' spread, not DP's alone, or the thread mechanism not shown
    text = (f"DP on {t['gpus']} GPUs: step p50 {t['p50_on_ms']:.1f} ms benchmark on vs {t['p50_off_ms']:.1f} ms off "
            f"({t['ratio']:.1f}x)")
    if cause_on:
        text += (f"; on persistent replica threads {cause_on['dp_persistent_ms']:.1f} ms with benchmark on "
                 f"(stock {cause_on['dp_ms']:.1f} ms)")
        if cause_on["threads_are_the_cost"]:
            f.advice = (f"Leave torch.backends.cudnn.benchmark off under DataParallel: it autotunes again in every "
                        f"step's new replica threads ({cause_on['dp_ms']:.0f} ms a step here against "
                        f"{cause_on['dp_persistent_ms']:.0f} ms when the same threads are reused). Or use DDP, whose "
                        f"one process per GPU keeps its thread and its autotuning cache.")
    return _with_training(ev, f, verdict, text)


def _c7_summary(p: ProbeRecord) -> str:
    r = p.values("c7.conv.slowdown")
    return (f"3x3 conv in a new thread per step vs the same thread: {r.get('benchmark_on')}x slower with "
            f"benchmark on, {r.get('benchmark_off')}x off")


# -- C8: speed-up over one GPU against the global batch ------------------------------------

def _series_name(options: dict[str, Any], precision: str) -> str:
    """What a curve holds fixed while the batch varies: precision, memory format, feed..."""
    rest = {k: v for k, v in options.items()
            if k not in BUDGET_KEYS | {"global_batch", "precision", "channels_last"}}
    name = precision + ("+channels_last" if options.get("channels_last") else "")
    return name + "".join(f", {k}={v}" for k, v in sorted(rest.items()))


def c8_points(ev) -> list[dict[str, Any]]:
    """Speed-up over single (1 GPU, same group) per group, variant and GPU count, with the range
    over repeats (slowest against fastest and back)."""
    points = []
    for g in ev.claim_groups("C8"):
        single = ev.rows(g, "single", 1)
        if single.empty:
            continue
        s = single["images_per_s"].astype(float)
        opts = ev.groups[g]["options"]
        precision = str(single["precision"].iloc[0]) if "precision" in single else opts.get("precision", "fp32")
        for variant in ("dp", "ddp"):
            for gpus in ev.groups[g]["gpus"]:
                r = ev.rows(g, variant, gpus)
                if r.empty:
                    continue
                ips = r["images_per_s"].astype(float)
                sp = ips.median() / s.median()
                points.append({"group": g, "series": _series_name(opts, precision), "variant": variant,
                               "gpus": int(gpus), "global_batch": int(r["global_batch"].iloc[0]),
                               "images_per_s": ips.median(), "single_images_per_s": s.median(),
                               "speedup": sp, "speedup_lo": ips.min() / s.max(), "speedup_hi": ips.max() / s.min(),
                               "repeats": min(len(r), len(single)), "efficiency": sp / gpus,
                               "wall_s": r["wall_s"].median(), "single_wall_s": single["wall_s"].median()})
    for p in points:
        margin = SPEED_NOISE * p["speedup"]
        p["faster"] = p["speedup_lo"] > 1 and p["speedup"] > 1 + margin
        p["slower"] = p["speedup_hi"] < 1 and p["speedup"] < 1 - margin
    return points


def crossovers(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (series, variant, gpus) with two or more batches: where the speed-up crosses 1,
    interpolated linearly in log2(batch) between the measured batches around the crossing."""
    out = []
    keys = sorted({(p["series"], p["variant"], p["gpus"]) for p in points})
    for series, variant, gpus in keys:
        curve = sorted((p for p in points if (p["series"], p["variant"], p["gpus"]) == (series, variant, gpus)),
                       key=lambda p: p["global_batch"])
        if len(curve) < 2:
            continue
        found = []
        for a, b in zip(curve, curve[1:]):
            if (a["speedup"] - 1) * (b["speedup"] - 1) < 0:
                xa, xb = math.log2(a["global_batch"]), math.log2(b["global_batch"])
                x = xa + (1 - a["speedup"]) * (xb - xa) / (b["speedup"] - a["speedup"])
                found.append({"batch": 2 ** x, "between": [a["global_batch"], b["global_batch"]],
                              "direction": "faster above" if b["speedup"] > 1 else "slower above"})
        out.append({"series": series, "variant": variant, "gpus": gpus, "crossings": found,
                    "batches": [p["global_batch"] for p in curve], "speedups": [p["speedup"] for p in curve],
                    "all_faster": all(p["faster"] for p in curve), "all_slower": all(p["slower"] for p in curve)})
    return out


def _curve_text(c: dict[str, Any]) -> str:
    lo, hi = c["batches"][0], c["batches"][-1]
    span = f"{c['speedups'][0]:.2f}x at {_fmt_batch(lo)} to {c['speedups'][-1]:.2f}x at {_fmt_batch(hi)}"
    who = f"{c['variant'].upper()} on {c['gpus']} GPUs, {c['series']}"
    ups = [x for x in c["crossings"] if x["direction"] == "faster above"]
    if c["all_slower"]:
        return f"{who}: slower than one GPU at every batch from {_fmt_batch(lo)} to {_fmt_batch(hi)} ({span})"
    if c["all_faster"]:
        return f"{who}: faster than one GPU at every batch from {_fmt_batch(lo)} to {_fmt_batch(hi)} ({span})"
    if ups and len(c["crossings"]) == 1:
        return (f"{who}: slower below about {_about(ups[0]['batch'])} images a step on this machine, "
                f"faster above ({span})")
    if c["crossings"]:
        where = ", ".join(f"{_about(x['batch'])} ({x['direction']})" for x in c["crossings"])
        return f"{who}: crosses one GPU's speed at about {where} ({span})"
    return f"{who}: within noise of one GPU somewhere between {_fmt_batch(lo)} and {_fmt_batch(hi)} ({span})"


def c8(ev) -> Finding:
    groups = ev.claim_groups("C8")
    points = c8_points(ev)
    dp = [p for p in points if p["variant"] == "dp" and p["gpus"] > 1]
    if not dp:
        return _not_run(ev, groups)
    curves = crossovers(points)
    if all(p["faster"] for p in dp):
        verdict = CONFIRMED
    elif all(p["slower"] for p in dp):
        verdict = REFUTED
    else:
        verdict = NUANCE   # faster at some batches, slower at others (or not told apart)
    dp_curves = [c for c in curves if c["variant"] == "dp" and c["gpus"] > 1]
    alone = [p for p in dp if not any(c["series"] == p["series"] and c["gpus"] == p["gpus"] for c in dp_curves)]
    parts = [_curve_text(c) for c in dp_curves]
    parts += [f"DP on {p['gpus']} GPUs, {p['series']} ({p['group']}, batch {p['global_batch']}): {p['speedup']:.2f}x"
              for p in alone]
    ddp = [p for p in points if p["variant"] == "ddp" and p["gpus"] > 1]
    if ddp:
        parts.append(f"DDP {min(p['speedup'] for p in ddp):.2f}x-{max(p['speedup'] for p in ddp):.2f}x")
    cause = dp_step_cause(ev, "off")
    if cause:
        parts.append("cause: " + ("fresh replica threads every step" if cause["threads_are_the_cost"]
                                  else f"{cause['largest_stage']}")
                     + f" (DP on persistent threads {cause['dp_persistent_speedup']:.2f}x one GPU at batch "
                       f"{cause['batch']}, stock {cause['dp_speedup']:.2f}x)")
    lines = [f"{p['group']}: {p['variant']} on {p['gpus']} GPU(s), batch {_fmt_batch(p['global_batch'])}, "
             f"{p['series']}: {p['images_per_s']:.0f} images/s vs one GPU {p['single_images_per_s']:.0f}: "
             f"{p['speedup']:.2f}x (repeats {p['speedup_lo']:.2f}-{p['speedup_hi']:.2f}x, {p['repeats']} each), "
             f"efficiency {p['efficiency']:.0%}; an epoch of {EPOCH_IMAGES:,} images "
             f"{EPOCH_IMAGES / p['images_per_s']:.1f} s vs {EPOCH_IMAGES / p['single_images_per_s']:.1f} s"
             for p in points]
    lines += [f"crossover: {_curve_text(c)}" for c in curves if c["variant"] == "ddp" or c["gpus"] == 1]
    if cause:
        lines.append("where a DataParallel step's time goes (C7 probe): " + _cause_text(cause))
    dtype = _replica_dtype(ev)
    if dtype and any(p["series"].startswith("bf16") for p in dp):
        note = (f"DataParallel's replica threads computed in {dtype} when autocast asked for torch.bfloat16 "
                f"(C7 probe): its bf16 points ran in {dtype}")
        lines.append(note)
        parts.append(note)
    measured_on = [ev.measured_on_runs()] + ([ev.measured_on_probe("C7")] if cause else [])
    return Finding(verdict=verdict, summary="; ".join(parts), evidence=lines,
                   data={"rows": points, "curves": curves, "dp_step": cause}, runs_used=True,
                   advice=_c8_advice(dp_curves, alone, cause), measured_on=measured_on)


def _replica_dtype(ev) -> str | None:
    """The dtype stock DataParallel's replicas computed in under autocast(bfloat16), where it was
    not bfloat16 (a new thread starts with autocast's default dtype); None otherwise."""
    p: ProbeRecord | None = ev.probes.get("C7")
    got = p.values("c7.dp_step.replica_autocast_dtype").get("stock") if p else None
    return got if got and got != "torch.bfloat16" else None


def _c8_advice(curves: list[dict], alone: list[dict], cause: dict | None) -> str:
    parts = []
    for c in curves:
        ups = [x for x in c["crossings"] if x["direction"] == "faster above"]
        if ups:
            parts.append(f"with {c['series']} DataParallel on {c['gpus']} GPUs paid off only from about "
                         f"{_about(ups[-1]['batch'])} images a step")
        elif c["all_slower"]:
            parts.append(f"with {c['series']} DataParallel on {c['gpus']} GPUs never paid off up to "
                         f"{_fmt_batch(c['batches'][-1])} images a step")
    text = ("Measure before scaling out: on this machine " + "; ".join(parts) + ". ") if parts else \
        "Measure before scaling out. "
    if cause and cause["threads_are_the_cost"]:
        text += (f"Most of DataParallel's cost per step is its new replica threads (on persistent threads it ran at "
                 f"{cause['dp_persistent_speedup']:.2f}x one GPU at batch {cause['batch']}, stock at "
                 f"{cause['dp_speedup']:.2f}x), so the fixed cost per step, not the data moved, sets the crossover. ")
    elif cause:
        text += f"The largest part of a DataParallel step here is {cause['largest_stage']}. "
    return text + "Use DDP (one process per GPU) for multi-GPU training, and feed data fast enough for one GPU first."
