"""Ledger sections for the claims settled by probes alone (C2..C5), and the probe half of C6/C7.

A section is a dict: verdict, summary (one line), evidence (lines), data, measured_on,
not_run. The verdicts are the probes' own, computed there from their observations.
"""
from __future__ import annotations

from typing import Any, Callable

from dpbench.claims import NOT_RUN

_QUOTED = {"error", "second_line", "warnings"}  # exact text a user would see
_QUIET = {"what", "uuids", "rc"}


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


def observation_line(o: dict[str, Any]) -> str:
    extras = [f"{k} {_fmt(k, v)}" for k, v in o.items() if k not in _QUIET]
    if o.get("rc"):
        extras.append(f"exit code {o['rc']}")
    return f"{o['what']}: " + "; ".join(extras)


def find(probe: dict[str, Any], text: str, key: str | None = None) -> dict[str, Any]:
    """The first observation whose `what` contains text (and that has `key`), else {}."""
    return next((o for o in probe["observations"]
                 if text in o["what"] and (key is None or key in o)), {})


def probe_section(ev, cid: str, summarise: Callable[[dict], str]) -> dict[str, Any]:
    probe = ev.probes.get(cid)
    if probe is None:
        msg = f"not run here: no probe record claims/{cid}.json (python -m dpbench.claims.probe {cid})"
        return {"verdict": NOT_RUN, "summary": msg, "evidence": [], "data": {}, "measured_on": [],
                "not_run": msg}
    lines = [observation_line(o) for o in probe["observations"]]
    lines += [f"not run here: {part}" for part in probe.get("parts_not_run", [])]
    not_run = f"not run here: {probe['not_run']}" if probe["not_run"] else None
    return {"verdict": probe["verdict"], "summary": not_run or summarise(probe), "evidence": lines,
            "data": {"probe": probe}, "measured_on": [ev.measured_on_probe(cid)], "not_run": not_run}


def _c2(p: dict) -> str:
    wrong = find(p, "model on cuda:0, DataParallel", "error")
    late = find(p, "CUDA_VISIBLE_DEVICES", "after")
    plain = find(p, "plain fix")
    return (f"{wrong.get('what', 'no wrong-device case erred')}: `{wrong.get('error', '')}` at "
            f"{wrong.get('stage')}; CUDA_VISIBLE_DEVICES set after CUDA init leaves device_count "
            f"{late.get('before')} -> {late.get('after')}; model.to(device_ids[0]) "
            f"{'works' if plain.get('stage', 'x') is None else 'fails'}")


def _c3(p: dict) -> str:
    bad = find(p, "calls that misbehave").get("result", [])
    zero = find(p, "wrapper.zero_grad()").get("result", "")
    one_id = find(p, "construction (cuda:0, device_ids=[0])", "error").get("error")
    return (f"{len(bad)} calls on the wrapper misbehave (CPU and CUDA paths together); "
            f"wrapper.zero_grad(): {zero}"
            + (f"; one CUDA id: `{one_id}`" if one_id else ""))


def _c4(p: dict) -> str:
    article = find(p, "article's load")
    exact = [o for o in p["observations"] if "round_trip_bit_exact" in o]
    ok = sum(o["round_trip_bit_exact"] for o in exact)
    return (f"article's load: `{article.get('error', 'loads')}` {article.get('second_line', '')[:60]}...; "
            f"{ok}/{len(exact)} other loads round-trip bit for bit")


def _c5(p: dict) -> str:
    many = find(p, "batch 8 * n")
    one = find(p, "device_ids=[0]")
    default = find(p, "default filters", "shown")
    always = find(p, "simplefilter('always')", "shown")
    return (f"exact article text: {many.get('exact_article_text')}; shape {many.get('shape')} on "
            f"{len(many.get('device_ids', []))} GPUs, {one.get('shape')} on one; shown "
            f"{default.get('shown')}x over {default.get('steps')} steps with default filters, "
            f"{always.get('shown')}x with 'always'")


def _gather_warnings_in_runs(ev) -> list[str]:
    w = ev.tables["warnings"]
    w = w[w["message"].astype(str).str.contains("Was asked to gather")]
    return [f"training run {r.run_id}: gather warning counted {r.count} times (first at step {r.first_step})"
            for r in w.itertuples()]


def c2(ev):
    return probe_section(ev, "C2", _c2)


def c3(ev):
    return probe_section(ev, "C3", _c3)


def c4(ev):
    return probe_section(ev, "C4", _c4)


def c5(ev):
    s = probe_section(ev, "C5", _c5)
    in_runs = _gather_warnings_in_runs(ev)
    s["evidence"] += in_runs
    s["runs_used"] = bool(in_runs)
    return s
