"""What the claims' text modules share: a probe's finding, a claim whose runs are absent, a
probe's finding once training runs decided, and how batches are written.

The probe findings look observations up by their stable ids (dpbench.claims.records), never by
the wording of their descriptions.
"""
from __future__ import annotations

from typing import Any, Callable

from dpbench.claims import NOT_RUN
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


def without_ids(p: ProbeRecord) -> bool:
    """A record written before observations had ids: no summary can look a value up in it."""
    return bool(p.observations) and all(o.id.startswith("unnamed.") for o in p.observations)


def recorded_summary(p: ProbeRecord) -> str:
    """The summary of a record without observation ids, from its recorded values alone (never a
    lookup that would find nothing and print None): which observations erred, how many calls
    misbehaved, how many round trips were bit-exact."""
    parts = []
    erred = [o for o in p.observations if o.get("error")]
    if erred:
        first = erred[0]
        parts.append(f"{len(erred)} of {len(p.observations)} observations erred (first: {first.what}: "
                     f"`{first.get('error')}`" + (f" at {first.get('stage')}" if first.get("stage") else "") + ")")
    else:
        parts.append(f"none of {len(p.observations)} observations erred")
    judged = [o for o in p.observations if "misbehaves" in o.values]
    if judged:
        parts.append(f"{sum(bool(o.get('misbehaves')) for o in judged)} of {len(judged)} calls on the wrapper misbehave")
    exact = [o for o in p.observations if "round_trip_bit_exact" in o.values]
    if exact:
        parts.append(f"{sum(bool(o.get('round_trip_bit_exact')) for o in exact)}/{len(exact)} other round trips "
                     "bit for bit")
    texts = [o for o in p.observations if "exact_article_text" in o.values]
    if texts:
        parts.append(f"the article's exact text in {sum(bool(o.get('exact_article_text')) for o in texts)} of "
                     f"{len(texts)} cases")
    parts += [f"{o.what}: shown {o.get('shown')}x over {o.get('steps')} steps"
              for o in p.observations if "shown" in o.values and "steps" in o.values]
    parts += [f"{o.what}: {o.get('benchmark_on')}x with cudnn.benchmark on, {o.get('benchmark_off')}x off"
              for o in p.observations if "benchmark_on" in o.values and "benchmark_off" in o.values]
    return ("recorded before observation ids, summarised from the values: " + "; ".join(parts)
            + "; each observation in the evidence")


def probe_finding(ev, cid: str, summarise: Callable[[ProbeRecord], str]) -> Finding:
    probe: ProbeRecord | None = ev.probes.get(cid)
    if probe is None:
        msg = f"{NOT_RUN}: no probe record claims/{cid}.json (python -m dpbench.claims.probe {cid})"
        return Finding(verdict=NOT_RUN, summary=msg, not_run=msg)
    lines = [observation_line(o) for o in probe.observations]
    lines += [f"{NOT_RUN}: {part}" for part in probe.parts_not_run]
    not_run = f"{NOT_RUN}: {probe.not_run}" if probe.not_run else None
    summary = not_run or (recorded_summary(probe) if without_ids(probe) else summarise(probe))
    return Finding(verdict=probe.verdict, summary=summary, evidence=lines,
                   data={"probe": probe.to_json()}, measured_on=[ev.measured_on_probe(cid)], not_run=not_run)


def multi_gpu(ev, groups: list[str]) -> int:
    return min((n for g in groups for n in ev.groups[g]["gpus"] if n > 1), default=2)


def runs_not_run(ev, groups: list[str]) -> Finding:
    return Finding(verdict=NOT_RUN, not_run=ev.not_run(multi_gpu(ev, groups), groups),
                   measured_on=[ev.measured_on_runs()])


def with_training(ev, f: Finding, verdict: str, text: str) -> Finding:
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


def fmt_batch(b: float) -> str:
    return f"{b:,.0f}"


def about(b: float) -> str:
    """An interpolated batch to two significant figures: "about 4,100", not "about 4,095"."""
    return f"{float(f'{b:.2g}'):,.0f}"
