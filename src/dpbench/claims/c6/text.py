"""C6's ledger section in words: the probe's arithmetic and gradients, the training runs'
differences with their intervals, and what decided the verdict (c6/verdict.py decides it).
"""
from __future__ import annotations

from typing import Any

from dpbench.claims.c6.verdict import CONFIDENCE, FIRST_STEPS, NEGLIGIBLE, from_training
from dpbench.claims.findings import probe_finding, with_training
from dpbench.claims.records import Finding, ProbeRecord


def _ci_text(ci: dict[str, float], scale: float = 1.0, unit: str = "") -> str:
    if ci["n"] < 2:
        return f"{ci['mean'] * scale:+.3g}{unit} (n=1, no interval)"
    return (f"{ci['mean'] * scale:+.3g}{unit} [{ci['lo'] * scale:+.3g}, {ci['hi'] * scale:+.3g}] "
            f"({CONFIDENCE:.0%} CI, {ci['n']} seeds)")


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


def _c6_summary(p: ProbeRecord) -> str:
    arith = p.values("c6.article_example")
    emu = p.values("c6.cpu.bn_eval.batch128_split3")
    text = (f"[0.3, 0.2, 0.8]: {arith.get('one device mean', {}).get('value')} on one device, "
            f"{arith.get('mean of per-device means', {}).get('value')} as mean of means, "
            f"{arith.get('sum / N', {}).get('value')} as sum/N" if arith else
            "[0.3, 0.2, 0.8]: not recorded")
    if emu:
        text += (f"; 128 on 3 (43/43/42) gradient off by {emu['grad_rel_diff_mean_of_means']:.2g} (mean of means) vs "
                 f"{emu['grad_rel_diff_sum_over_n']:.2g} (sum/N), CPU emulation")
    for o in p.with_prefix("c6.gpu."):
        if len(set(o.get("chunks", []))) > 1:
            text += (f"; DataParallel batch {o.get('batch')} on {o.get('gpus')} GPUs: "
                     f"{o.get('grad_rel_diff_dp_mean_vs_single'):.2g} vs {o.get('grad_rel_diff_dp_sum_vs_single'):.2g}")
    return text


def finding(ev) -> Finding:
    f = probe_finding(ev, "C6", _c6_summary)
    v = from_training(ev, f.verdict)
    f.evidence += [_c6_line(t) for t in v.training]
    f.data["training"] = v.training
    if v.decisive is None:
        f.evidence.append(f"training runs on an uneven split: {ev.not_run(v.need_gpus, ev.claim_groups('C6'))}")
        return f
    t, loss, acc, size = v.decisive, v.loss, v.acc, v.size
    seeds = t["single_spread"]["final_loss"]
    w = t["reweighting"]
    against = (f", {size['share']:+.2f}x [{size['share_lo']:+.2f}, {size['share_hi']:+.2f}] the seed-to-seed sd of "
               f"single's final loss ({seeds['sd']:.3g} over {seeds['n']} seeds)" if size["negligible"] is not None
               else ", no seed-to-seed spread to weigh it against")
    if not v.measurable:
        call = "no effect told apart from zero at this size"
    elif size["negligible"]:
        call = (f"measurable but negligible in practice: the whole interval within {NEGLIGIBLE:.2g}x of what "
                f"changing the seed does")
    elif size["negligible"] is None:
        call = "a measurable effect, its practical size not weighed"
    else:
        call = (f"a measurable effect, and not negligible: beyond {NEGLIGIBLE:.2g}x of what changing the seed does")
    text = (f"in training ({t['batch']} on {t['gpus']} GPUs, {'/'.join(map(str, w['chunks']))}: weights off by "
            f"{w['max_abs']:.2%}) dp_mean - dp_sum final loss {_ci_text(loss) if loss['n'] else 'n/a'}"
            f"{against if loss['n'] else ''}, test accuracy {_ci_text(acc, 100, ' pp') if acc['n'] else 'n/a'}: {call}")
    return with_training(ev, f, v.verdict, text)
