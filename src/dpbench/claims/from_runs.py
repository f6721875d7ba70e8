"""Ledger sections that rest on the claims experiment's runs: C1, C8, and the training half of C6 and C7.

Thresholds are named constants so a verdict can be traced to the number that decided it.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

from dpbench import DP_VARIANTS
from dpbench.collect import model_mib
from dpbench.config import RunConfig
from dpbench.claims import CONFIRMED, NOT_RUN, NUANCE, REFUTED
from dpbench.claims.from_probes import find, probe_section

MIB = 2 ** 20
PARAMS = 11_173_962        # ResNet18-CIFAR (dpbench.model); tests check it against the model
NOISE_FLOOR_MIB = 1.0      # below this a per-device difference is allocator granularity, not evidence
GATHER_SHARE = 0.5         # the article's cause (gathered outputs, loss) must explain this much of the excess
FIRST_STEPS = 5            # steps compared before trajectories drift apart chaotically
SEPARATION = 2.0           # dp_mean must stray this many times further from single than dp_sum
SLOWDOWN = 1.5             # benchmark-on step time over benchmark-off that counts as "much slower"
UNCHANGED = 1.1            # ... and the ratio under which it counts as no effect
GOOD_EFFICIENCY = 0.8      # speed-up per GPU that makes "faster on more GPUs" hold
EPOCH_IMAGES = 50_000      # CIFAR-10's training set: epoch time at a run's measured rate


def _multi_gpu(ev, groups: list[str]) -> int:
    return min((n for g in groups for n in ev.groups[g]["gpus"] if n > 1), default=2)


# -- C1: memory on device 0 ---------------------------------------------------------------

def _model_mib(ev, run_id: str) -> pd.Series:
    """Per device: peak allocated less the dataset resident there (gpu feed), by collect's rule."""
    mem = ev.tables["memory"]
    rows = mem[mem["run_id"] == run_id]
    return pd.Series([model_mib(r) for r in rows.to_dict("records")],
                     index=rows["device"].to_numpy(), dtype=float).dropna()


def _ddp_spread(ev, group: str, gpus: int) -> float | None:
    spreads = [a.max() - a.min() for rid in ev.rows(group, "ddp", gpus)["run_id"]
               if len(a := _model_mib(ev, rid)) > 1]
    return max(spreads) if spreads else None


def _c1_line(r: dict[str, Any]) -> str:
    spread = "n/a" if r["ddp_spread_mib"] is None else f"{r['ddp_spread_mib']:.1f} MiB"
    return (f"{r['variant']} on {r['gpus']} GPUs, batch {r['global_batch']}: peak allocated less resident "
            f"data, device 0 {r['dev0_mib']:.1f} MiB, others {r['others_mib']:.1f} MiB: "
            f"{r['excess_mib']:+.1f} MiB "
            f"({r['ratio']:.3f}x); noise {r['noise_mib']:.1f} MiB (DDP rank spread {spread})")


def device0_excess_estimate(global_batch: int, gpus: int, momentum: bool = True) -> dict[str, float]:
    """MiB that device 0 holds beyond the mean of the other devices at the training peak, the
    end of the forward pass, item by item from sizes (fp32). The master weights are not among
    them: every other device holds a replica's copy while the step runs. The gradients summed
    on device 0 are: the last step's stay until zero_grad, which follows the forward pass."""
    weights = PARAMS * 4 / MIB
    sample = (3 * 32 * 32 * 4 + 8) / MIB                  # one image and its int64 label
    own = -(-global_batch // gpus)                         # scatter gives device 0 the largest chunk
    others = (global_batch - own) / (gpus - 1)
    return {"summed_grads": weights,
            "momentum": weights if momentum else 0.0,
            # the global batch arrives on device 0 and stays there; its own chunk is a view of it
            "input_batch": (global_batch - others) * sample,
            "gathered_logits": global_batch * 10 * 4 / MIB}


def c1(ev) -> dict[str, Any]:
    groups = ev.claim_groups("C1")
    runs = []
    for g in groups:
        summ = ev.rows(g)
        for r in summ[summ["variant"].isin(DP_VARIANTS)].itertuples():
            alloc = _model_mib(ev, r.run_id)
            if 0 not in alloc.index or len(alloc) < 2:
                continue
            others = alloc.drop(0).mean()
            spread = _ddp_spread(ev, g, r.gpus)
            estimate = device0_excess_estimate(int(r.global_batch), int(r.gpus), RunConfig.momentum > 0)
            runs.append({"run_id": r.run_id, "variant": r.variant, "gpus": int(r.gpus),
                         "global_batch": int(r.global_batch), "dev0_mib": alloc[0], "others_mib": others,
                         "excess_mib": alloc[0] - others, "ratio": alloc[0] / others,
                         "ddp_spread_mib": spread, "noise_mib": max(spread or 0.0, NOISE_FLOOR_MIB),
                         "estimate_mib": estimate, "estimate_total_mib": sum(estimate.values()),
                         "gathered_logits_mib": estimate["gathered_logits"]})
    if not runs:
        return {"not_run": ev.not_run(_multi_gpu(ev, groups), groups), "measured_on": [ev.measured_on_runs()]}

    above = [r for r in runs if r["excess_mib"] > r["noise_mib"]]
    share = max(r["gathered_logits_mib"] / r["excess_mib"] for r in above) if above else None
    if not above:
        verdict = REFUTED
    elif len(above) < len(runs) or share < GATHER_SHARE:
        verdict = NUANCE  # device 0 is heavier, but not always, or not for the article's reason
    else:
        verdict = CONFIRMED
    ex = [r["excess_mib"] for r in runs]
    ratios = [r["ratio"] for r in runs]
    lines = [_c1_line(r) for r in runs]
    for batch, gpus in sorted({(r["global_batch"], r["gpus"]) for r in runs}):
        r = next(r for r in runs if (r["global_batch"], r["gpus"]) == (batch, gpus))
        e = r["estimate_mib"]
        lines.append(f"from sizes, batch {batch} on {gpus} GPUs: summed grads {e['summed_grads']:.1f} + momentum "
                     f"{e['momentum']:.1f} + input batch kept for the others {e['input_batch']:.1f} + gathered "
                     f"logits {e['gathered_logits']:.2f} = {r['estimate_total_mib']:.1f} MiB (weights: matched "
                     f"by the replicas' copies during the step); measured {r['excess_mib']:+.1f} MiB")
    worst = max(runs, key=lambda r: abs(r["excess_mib"] - r["estimate_total_mib"]))
    summary = (f"device 0 {min(ex):+.0f}..{max(ex):+.0f} MiB against the mean of the others ({min(ratios):.2f}-"
               f"{max(ratios):.2f}x), above noise in {len(above)}/{len(runs)} DP runs; estimate from sizes "
               f"(grads+momentum+input batch+logits) off by at most "
               f"{abs(worst['excess_mib'] - worst['estimate_total_mib']):.1f} MiB; gathered logits <= "
               f"{max(r['gathered_logits_mib'] for r in runs):.2f} MiB of it")
    return {"verdict": verdict, "summary": summary, "evidence": lines, "runs_used": True,
            "data": {"runs": runs, "gathered_share_max": share},
            "measured_on": [ev.measured_on_runs()]}


def _fold_training(ev, s: dict[str, Any], verdict: str, summary: str) -> None:
    """Put a training-level verdict into a probe's section; a missing probe stays in the evidence."""
    if s["not_run"]:
        s["evidence"].insert(0, s["not_run"])
        s["summary"] = summary
    else:
        s["summary"] = f"{s['summary']}; {summary}"
    s["measured_on"].append(ev.measured_on_runs())
    s.update(verdict=verdict, not_run=None, runs_used=True)


# -- C6: reductions in training -----------------------------------------------------------

def _steps(ev, run_id: str) -> pd.DataFrame:
    st = ev.tables["steps"]
    return st[st["run_id"] == run_id].sort_values(["epoch", "step"])[["epoch", "step", "loss_global"]]


def _loss_gap(base: pd.DataFrame, other: pd.DataFrame) -> dict[str, Any]:
    m = base.merge(other, on=["epoch", "step"], suffixes=("_a", "_b"))
    gap = (m["loss_global_a"] - m["loss_global_b"]).abs()
    return {"first_steps_max": float(gap.head(FIRST_STEPS).max()), "all_steps_max": float(gap.max()),
            "last_step": float(gap.iloc[-1]), "steps": int(len(gap)),
            "by_step": [float(g) for g in gap]}   # in step order: the claim's figure draws it


def c6_training(ev) -> list[dict[str, Any]]:
    """Per group and GPU count: how far dp_mean and dp_sum stray from single in loss_global."""
    out = []
    for g in ev.claim_groups("C6"):
        single = ev.rows(g, "single", 1)
        if single.empty:
            continue
        base = _steps(ev, single["run_id"].iloc[0])
        batch = int(single["global_batch"].iloc[0])
        for gpus in sorted(set(ev.groups[g]["gpus"]) - {1}):
            runs = {v: ev.rows(g, v, gpus) for v in ("dp_mean", "dp_sum")}
            if any(r.empty for r in runs.values()):
                continue
            gaps = {v: _loss_gap(base, _steps(ev, r["run_id"].iloc[0])) for v, r in runs.items()}
            out.append({"group": g, "gpus": gpus, "uneven": batch % gpus != 0,
                        "bn_eval": ev.groups[g]["options"].get("batchnorm") == "eval",
                        **{f"{v}_vs_single": gaps[v] for v in gaps}})
    return out


def _c6_line(t: dict[str, Any]) -> str:
    m, s = t["dp_mean_vs_single"], t["dp_sum_vs_single"]
    split = "uneven" if t["uneven"] else "even"
    return (f"training {t['group']} on {t['gpus']} GPUs ({split} split): max |loss_global - single| "
            f"over the first {FIRST_STEPS} steps dp_mean {m['first_steps_max']:.3g} vs dp_sum "
            f"{s['first_steps_max']:.3g}; over all {m['steps']} steps {m['all_steps_max']:.3g} vs "
            f"{s['all_steps_max']:.3g}; at the last (short) step {m['last_step']:.3g} vs {s['last_step']:.3g}")


def c6(ev) -> dict[str, Any]:
    s = probe_section(ev, "C6", _c6_summary)
    training = c6_training(ev)
    groups = ev.claim_groups("C6")
    decisive = [t for t in training if t["uneven"]]
    decisive = [t for t in decisive if t["bn_eval"]] or decisive  # BN eval isolates the reduction
    separated = [t["dp_mean_vs_single"]["first_steps_max"]
                 > SEPARATION * t["dp_sum_vs_single"]["first_steps_max"] for t in decisive]
    s["evidence"] += [_c6_line(t) for t in training]
    s["data"]["training"] = training
    if not decisive:
        need = min((n for g in groups for n in ev.groups[g]["gpus"]
                    if int(ev.groups[g]["options"].get("global_batch", 128)) % n), default=3)
        s["evidence"].append(f"training runs on an uneven split: {ev.not_run(need, groups)}")
        return s
    t = decisive[0]
    # the bias must show in training too, or it is real but too small to matter here
    verdict = CONFIRMED if all(separated) else NUANCE
    if s["verdict"] not in (CONFIRMED, NOT_RUN):
        verdict = s["verdict"]  # training cannot rescue a probe that saw no bias
    _fold_training(ev, s, verdict,
                   f"training ({t['group']}, {t['gpus']} GPUs) loss gap to single over the first {FIRST_STEPS} "
                   f"steps: dp_mean {t['dp_mean_vs_single']['first_steps_max']:.3g} vs dp_sum "
                   f"{t['dp_sum_vs_single']['first_steps_max']:.3g}; over all {t['dp_sum_vs_single']['steps']} "
                   f"steps, where any two runs drift apart, {t['dp_mean_vs_single']['all_steps_max']:.3g} vs "
                   f"{t['dp_sum_vs_single']['all_steps_max']:.3g}")
    return s


def _c6_summary(p: dict) -> str:
    arith = find(p, "article's example")
    emu = find(p, "CPU emulation, BatchNorm eval: batch 128 as 3")
    gpu = [o for o in p["observations"]
           if "DataParallel first step" in o["what"] and len(set(o["chunks"])) > 1]
    text = (f"[0.3, 0.2, 0.8]: {arith['one device mean']['value']} on one device, "
            f"{arith['mean of per-device means']['value']} as mean of means, "
            f"{arith['sum / N']['value']} as sum/N; "
            f"128 on 3 (43/43/42) gradient off by {emu['grad_rel_diff_mean_of_means']:.2g} (mean of means) vs "
            f"{emu['grad_rel_diff_sum_over_n']:.2g} (sum/N), CPU emulation")
    for o in gpu:
        text += (f"; DataParallel batch {o['batch']} on {o['gpus']} GPUs: "
                 f"{o['grad_rel_diff_dp_mean_vs_single']:.2g} vs {o['grad_rel_diff_dp_sum_vs_single']:.2g}")
    return text


# -- C7: cudnn.benchmark under DataParallel -----------------------------------------------

def c7_training(ev) -> list[dict[str, Any]]:
    """Step p50 with cudnn.benchmark on and off, per variant and GPU count."""
    by_flag = {}
    for g in ev.claim_groups("C7"):
        by_flag.setdefault(bool(ev.groups[g]["options"].get("cudnn_benchmark")), g)
    if set(by_flag) != {True, False}:
        return []
    on, off = by_flag[True], by_flag[False]
    out = []
    for variant in ev.groups[on]["variants"]:
        for gpus in ([1] if variant == "single" else ev.groups[on]["gpus"]):
            a, b = ev.rows(on, variant, gpus), ev.rows(off, variant, gpus)
            if a.empty or b.empty:
                continue
            p_on, p_off = a["step_ms_p50"].median(), b["step_ms_p50"].median()  # over repeats
            out.append({"variant": variant, "gpus": gpus, "p50_on_ms": p_on, "p50_off_ms": p_off,
                        "ratio": p_on / p_off})
    return out


def c7(ev) -> dict[str, Any]:
    s = probe_section(ev, "C7", _c7_summary)
    training = c7_training(ev)
    s["evidence"] += [
        f"training {t['variant']} on {t['gpus']} GPU(s): step p50 {t['p50_on_ms']:.1f} ms with benchmark on, "
        f"{t['p50_off_ms']:.1f} ms off ({t['ratio']:.2f}x)" for t in training]
    s["data"]["training"] = training
    dp = [t for t in training if t["variant"] == "dp" and t["gpus"] > 1]
    groups = ev.claim_groups("C7")
    if not dp:
        s["evidence"].append(f"training runs: {ev.not_run(_multi_gpu(ev, groups), groups)}")
        return s
    others_slow = any(t["ratio"] > SLOWDOWN for t in training if t["variant"] != "dp")
    t = max(dp, key=lambda t: t["ratio"])
    if t["ratio"] <= UNCHANGED:
        verdict = REFUTED
    elif t["ratio"] > SLOWDOWN and not others_slow and s["verdict"] in (CONFIRMED, NOT_RUN):
        verdict = CONFIRMED
    else:
        verdict = NUANCE  # slower, but mildly, or not DP's alone, or the thread mechanism not shown
    _fold_training(ev, s, verdict,
                   f"DP on {t['gpus']} GPUs: step p50 {t['p50_on_ms']:.1f} ms benchmark on vs "
                   f"{t['p50_off_ms']:.1f} ms off ({t['ratio']:.1f}x)")
    return s


def _c7_summary(p: dict) -> str:
    r = find(p, "new-thread / same-thread")
    return (f"3x3 conv in a new thread per step vs the same thread: {r.get('benchmark_on')}x slower with "
            f"benchmark on, {r.get('benchmark_off')}x off")


# -- C8: speed-up over one GPU ------------------------------------------------------------

def c8(ev) -> dict[str, Any]:
    groups = ev.claim_groups("C8")
    rows = []
    for g in groups:
        single = ev.rows(g, "single", 1)
        if single.empty:
            continue
        base = single["images_per_s"].median()  # medians over repeats
        for variant in ("dp", "ddp"):
            for gpus in ev.groups[g]["gpus"]:
                r = ev.rows(g, variant, gpus)
                if r.empty:
                    continue
                ips = r["images_per_s"].median()
                rows.append({"group": g, "options": ev.groups[g]["label"], "variant": variant, "gpus": gpus,
                             "images_per_s": ips,
                             "single_images_per_s": base, "speedup": ips / base,
                             "efficiency": ips / base / gpus, "wall_s": r["wall_s"].median(),
                             "single_wall_s": single["wall_s"].median()})
    dp = [r for r in rows if r["variant"] == "dp" and r["gpus"] > 1]
    if not dp:
        return {"not_run": ev.not_run(_multi_gpu(ev, groups), groups), "measured_on": [ev.measured_on_runs()]}
    if all(r["efficiency"] >= GOOD_EFFICIENCY for r in dp):
        verdict = CONFIRMED
    elif any(r["speedup"] < 1.0 for r in dp):
        verdict = REFUTED  # more GPUs, less speed
    else:
        verdict = NUANCE
    lines = [f"{r['group']}: {r['variant']} on {r['gpus']} GPU(s) {r['images_per_s']:.0f} images/s vs one GPU "
             f"{r['single_images_per_s']:.0f}: {r['speedup']:.2f}x, efficiency {r['efficiency']:.0%}; "
             f"an epoch of {EPOCH_IMAGES:,} images at this rate {EPOCH_IMAGES / r['images_per_s']:.1f} s vs "
             f"{EPOCH_IMAGES / r['single_images_per_s']:.1f} s" for r in rows]
    best_ddp = max((r["speedup"] for r in rows if r["variant"] == "ddp" and r["gpus"] > 1), default=None)
    summary = "DP on >1 GPU: " + ", ".join(f"{r['speedup']:.2f}x ({r['group']}, {r['gpus']} GPUs)" for r in dp)
    if best_ddp is not None:
        summary += f"; DDP best {best_ddp:.2f}x"
    return {"verdict": verdict, "summary": summary, "evidence": lines, "data": {"rows": rows}, "runs_used": True,
            "measured_on": [ev.measured_on_runs()]}
