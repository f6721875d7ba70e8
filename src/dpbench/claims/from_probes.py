"""Ledger findings for the claims settled by probes alone (C2..C5), and the probe half of C6/C7.

The verdicts are the probes' own, computed there from their observations. The one-line
summaries look observations up by their stable ids (dpbench.claims.records), never by the
wording of their descriptions.
"""
from __future__ import annotations

from typing import Any, Callable

from dpbench.claims import NOT_RUN
from dpbench.claims.c1_max_batch import gathered_cost_onset
from dpbench.claims.records import Finding, Observation, ProbeRecord

_QUOTED = {"error", "second_line", "warnings"}  # exact text a user would see
_QUIET = {"uuids", "rc"}


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if key in _QUOTED and isinstance(value, str):
        return f"`{value}`"
    if key in _QUOTED and isinstance(value, list):
        return "[" + ", ".join(f"`{v}`" for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(k, v)}" for k, v in value.items()) + "}"
    return str(value)


def observation_line(o: Observation) -> str:
    extras = [f"{k} {_fmt(k, v)}" for k, v in o.values.items() if k not in _QUIET]
    if o.get("rc"):
        extras.append(f"exit code {o.get('rc')}")
    return f"{o.what}: " + "; ".join(extras)


def probe_finding(ev, cid: str, summarise: Callable[[ProbeRecord], str]) -> Finding:
    probe: ProbeRecord | None = ev.probes.get(cid)
    if probe is None:
        msg = f"{NOT_RUN}: no probe record claims/{cid}.json (python -m dpbench.claims.probe {cid})"
        return Finding(verdict=NOT_RUN, summary=msg, not_run=msg)
    lines = [observation_line(o) for o in probe.observations]
    lines += [f"{NOT_RUN}: {part}" for part in probe.parts_not_run]
    not_run = f"{NOT_RUN}: {probe.not_run}" if probe.not_run else None
    return Finding(verdict=probe.verdict, summary=not_run or summarise(probe), evidence=lines,
                   data={"probe": probe.to_json()}, measured_on=[ev.measured_on_probe(cid)], not_run=not_run)


def c1_max_batch(p: ProbeRecord) -> str:
    """'largest global batch within 8 GiB per GPU: 10 outputs: dp 5,000, dp_sum ...; 32,768 outputs: ...'"""
    cells: dict[str, list[str]] = {}
    caps = set()
    found: dict[str, dict[str, int]] = {}
    for o in p.with_prefix("c1.max_batch."):
        _, _, variant, width = o.id.split(".")
        label = f"{int(width.removeprefix('out')):,} outputs"
        name = "single (1 GPU)" if variant == "single" else variant
        cells.setdefault(label, []).append(f"{name} {o.get('global_batch'):,}")
        caps.add(f"{o.get('cap_gib'):g} GiB")
        found.setdefault(variant, {})[width.removeprefix("out")] = o.get("global_batch")
    attribution = c1_attribution_text(p)
    if not cells:
        return attribution or "no batch search finished"
    first, clean = gathered_cost_onset(found)
    onset = ("" if first is None else
             f"; the loss on the gathered outputs costs batch against dp_sum from {int(first):,} outputs"
             + (", not below" if clean else "; below it at some widths, not at others"))
    return (f"largest global batch within {'/'.join(sorted(caps))} allocated per GPU: "
            + "; ".join(f"{label}: {', '.join(parts)}" for label, parts in cells.items()) + onset
            + (f"; {attribution}" if attribution else ""))


ATTRIBUTED = 3   # categories named per device in the summary (the evidence lists them all)


def c1_attribution_text(p: ProbeRecord) -> str:
    """'device 0's peak by what allocated it (memory snapshot), dp at batch 2,048: 32,768 outputs:
    device 0 6,100 MiB (gathered outputs 256, loss 512, ...) vs device 1 ...' for the DataParallel
    variants; '' where no snapshot was taken."""
    parts = []
    for variant in ("dp", "dp_sum"):
        rows = p.with_prefix(f"c1.attribution.{variant}.")
        widths = sorted({o.id.split(".")[3] for o in rows}, key=lambda w: int(w.removeprefix("out")))
        for width in widths[-1:]:   # the widest output: where the article's reason would show
            devs = sorted((o for o in rows if o.id.split(".")[3] == width), key=lambda o: o.id)
            text = " vs ".join(
                f"device {o.id.split('.')[4].removeprefix('dev')} {o.get('peak_mib'):,.0f} MiB ("
                + ", ".join(f"{c} {m:,.0f}" for c, m in sorted((o.get("by_category") or {}).items(),
                                                key=lambda cm: -cm[1])[:ATTRIBUTED])
                + ")" for o in devs)
            parts.append(f"{variant}, {int(width.removeprefix('out')):,} outputs: {text}")
    return ("each device's peak by what allocated it (memory snapshot, biggest first): " + "; ".join(parts)
            if parts else "")


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


def _c3(p: ProbeRecord) -> str:
    bad = p.values("c3.misbehaving_calls").get("result", [])
    zero = (p.values("c3.cuda_all_ids.zero_grad") or p.values("c3.cpu.zero_grad")).get("result", "")
    one_id = p.values("c3.cuda_one_id.construction").get("error")
    return (f"{len(bad)} calls on the wrapper misbehave (CPU and CUDA paths together)"
            + (f"; wrapper.zero_grad(): {zero}" if zero else "")   # not observed without 2 GPUs
            + (f"; one CUDA id: `{one_id}`" if one_id else ""))


def _c4(p: ProbeRecord) -> str:
    article = p.values("c4.article_load")
    exact = [o for o in p.observations if "round_trip_bit_exact" in o.values]
    ok = sum(bool(o.get("round_trip_bit_exact")) for o in exact)
    return (f"article's load: `{article.get('error', 'loads')}` {article.get('second_line', '')[:60]}...; "
            f"{ok}/{len(exact)} other loads round-trip bit for bit")


def _c5(p: ProbeRecord) -> str:
    many = p.values("c5.all_gpus")
    one = p.values("c5.one_gpu")
    default = p.values("c5.shown.default_filters")
    always = p.values("c5.shown.always")
    return (f"exact article text: {many.get('exact_article_text')}; shape {many.get('shape')} on "
            f"{len(many.get('device_ids', []))} GPUs, {one.get('shape')} on one; shown "
            f"{default.get('shown')}x over {default.get('steps')} steps with default filters, "
            f"{always.get('shown')}x with 'always'")


def _gather_warnings_in_runs(ev) -> list[str]:
    w = ev.tables["warnings"]
    w = w[w["message"].astype(str).str.contains("Was asked to gather")]
    return [f"training run {r.run_id}: gather warning counted {r.count} times (first at step {r.first_step})"
            for r in w.itertuples()]


def c2(ev) -> Finding:
    return probe_finding(ev, "C2", _c2)


def c3(ev) -> Finding:
    return probe_finding(ev, "C3", _c3)


def c4(ev) -> Finding:
    return probe_finding(ev, "C4", _c4)


def c5(ev) -> Finding:
    f = probe_finding(ev, "C5", _c5)
    in_runs = _gather_warnings_in_runs(ev)
    f.evidence += in_runs
    f.runs_used = bool(in_runs)
    return f
