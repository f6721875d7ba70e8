"""The words of a bisection's report (dpbench bisect's report.json -> report.md)."""
from __future__ import annotations

from typing import Any


def _pct(v: float | None, sign: bool = True) -> str:
    return "–" if v is None else (f"{100 * v:+.2f}%" if sign else f"{100 * v:.2f}%")


def _p(v: float | None) -> str:
    return "–" if v is None else f"{v:.2g}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def _cell(c: Any) -> str:
    v, g, o = (list(c) + ["", 0, ""])[:3] if isinstance(c, (list, tuple)) else (str(c), "", "")
    return f"{v} g{g}" + (f" ({o})" if o else "")


def _env(doc: dict, i: int | None) -> str:
    if i is None:
        return "none"
    e = doc["environments"][i]
    return f"{e['name']} (#{i}, torch {e['torch']})"


def summary_line(doc: dict) -> str:
    r = doc["result"]
    steps = len(doc["steps"])
    if r["status"] == "found":
        return (f"first bad: {_env(doc, r['first_bad'])}, after {_env(doc, r['last_good'])}; "
                f"{steps} step(s)")
    if r["status"] == "none":
        return (f"none: {_env(doc, doc['bad'])} was not slower than {_env(doc, r['last_good'])}; "
                f"{steps} step(s)")
    last = doc["steps"][-1] if doc["steps"] else {}
    more = last.get("more_runs")
    lo, hi = r["open_range"]
    return (f"inconclusive at step {steps}: the first bad, if any, is after {_env(doc, lo)} and at or "
            f"before {_env(doc, hi)}; " + (f"{more} more run(s) a side would settle the step" if more is not None
                                            else "more runs would not settle the step at this spread"))


def step_table(doc: dict) -> list[str]:
    lines = ["| step | base | cand | cell | runs | change | smallest detectable | lower bound | p (Holm) | cell verdict | step |",
             "|--:|---|---|---|--:|--:|--:|--:|--:|---|---|"]
    names = [e["name"] for e in doc["environments"]]
    for s in doc["steps"]:
        for k, c in enumerate(s["cells"]):
            verdict = c["verdict"] + (f" (+{c['more_runs']} runs a side)" if c.get("more_runs") is not None else "")
            lines.append(f"| {s['number'] if k == 0 else ''} | {names[s['base']] if k == 0 else ''} | "
                         f"{names[s['cand']] if k == 0 else ''} | {_cell(c['cell'])} | {c['n_base']}/{c['n_cand']} | "
                         f"{_pct(c['change'])} | {_pct(c['smallest_detectable'], False)} | {_pct(c['lower_bound'])} | "
                         f"{_p(c['p_holm'])} | {verdict} | {s['verdict'] if k == 0 else ''} |")
    return lines


def where_section(w: dict) -> list[str]:
    lines = ["## Where the time went", "",
             f"One profiled step (torch.profiler, after a warm-up; the median of the profiled steps) of "
             f"{_cell(w['cell'])} in each environment, ms per step; exposed communication is the "
             "communication no computation overlaps (inside backward for DDP). A profiled step is "
             "slower than a timed one: read the shares and the changes.", ""]
    if w.get("error"):
        lines += [f"Note: {w['error']}.", ""]
    lines += ["| environment | forward | backward | optimizer | exposed comm | step |", "|---|--:|--:|--:|--:|--:|"]
    for r in w["phases"]:
        lines.append(f"| {r['environment']} | {_ms(r['forward'])} | {_ms(r['backward'])} | {_ms(r['optimizer'])} | "
                     f"{_ms(r['exposed_comm'])} | {_ms(r['step'])} |")
    if "change_ms" in w:
        ch = w["change_ms"]
        lines += ["", f"From {w['good']} to {w['bad']}: forward {ch['forward']:+.2f} ms, backward "
                  f"{ch['backward']:+.2f} ms, optimizer {ch['optimizer']:+.2f} ms, exposed communication "
                  f"{ch['exposed_comm']:+.2f} ms, the step {ch['step']:+.2f} ms; grew most: **{w['grew_most']}**.",
                  "", "The kernels (CPU: operators, self time) whose time per step moved most:", "",
                  f"| kernel | {w['good']} ms | {w['bad']} ms | change ms |", "|---|--:|--:|--:|"]
        for k in w["kernels"]:
            name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
            lines.append(f"| `{name}` | {k['good_ms']:.3f} | {k['bad_ms']:.3f} | {k['delta_ms']:+.3f} |")
    return lines


def markdown(doc: dict) -> str:
    rule = doc["rule"]
    lines = [f"# Bisection {doc['name']}", "", f"**{summary_line(doc)}**", "",
             f"Experiment `{doc['experiment']}`, watched: variants {', '.join(doc['variants']) or 'the experiment’s'}, "
             f"GPUs {', '.join(map(str, doc['gpus'])) or 'the experiment’s'}, "
             f"{doc['repeats'] or 'the experiment’s'} runs a side a step; {doc['seconds']:.0f} s in all.", "",
             f"Rule, fixed before the first step: a step is one paired launch (last good vs midpoint, "
             f"interleaved ABBA); a cell is slower at p < {rule['alpha']} after Holm over the cells (the "
             f"step's false-alarm rate), not slower when its one-sided {1 - rule['alpha']:.0%} lower bound "
             f"is above −{rule['margin']:.1%}, and otherwise inconclusive, with the runs a side that "
             f"would settle it at {rule['power']:.0%} power from the observed spread. A step is bad when "
             f"a cell is slower, good when every cell is not slower; an inconclusive step stops the "
             f"bisection.", "", "## Environments", "", "| # | name | torch | python |", "|--:|---|---|---|"]
    for e in doc["environments"]:
        mark = " (good end)" if e["index"] == doc["good"] else " (bad end)" if e["index"] == doc["bad"] else ""
        lines.append(f"| {e['index']} | {e['name']}{mark} | {e['torch']} | `{e['python']}` |")
    lines += ["", "## Steps", "", *step_table(doc), "",
              "Change: the candidate's geometric mean samples/s over the base's; smallest detectable: "
              "the change the step's test finds at 80% power (Holm's first level); lower bound: of the "
              "change, one-sided. Each step's launch: "
              + ", ".join(f"`{s['tag']}` ({s['seconds']:.0f} s)" for s in doc["steps"]) + "."]
    if doc.get("provenance"):
        lines += ["", "## What differs between the last good and the first bad", "",
                  "| key | last good | first bad | |", "|---|---|---|---|"]
        for row in doc["provenance"]:
            lines.append(f"| {row['key']} | {row['good']} | {row['bad']} | {'**differs**' if row['differs'] else ''} |")
    if doc.get("where_the_time_went"):
        lines += ["", *where_section(doc["where_the_time_went"])]
    return "\n".join(lines) + "\n"
