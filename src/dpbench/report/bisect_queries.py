"""docs/bisect.md's named queries (registered with dpbench.report.docs_queries' `query`): the error
rates of `dpbench bisect` from the simulation's docs/bisect_simulation*.json, and the planted
bisection on one H200 from its reference (report.json and the launches' logs archived beside it).
Torch-free."""
from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pandas as pd

from dpbench.report import bisect_report
from dpbench.report.docs_queries import query

# -- the simulation: tools/bisect_simulation.py's JSON, kept in docs/ beside the page --------------

SIM, SIM_SMALL = "bisect_simulation.json", "bisect_simulation_small.json"
OUTCOMES = ("right", "wrong", "none", "inconclusive")


def _sim(ref: Path, name: str = SIM) -> dict:
    # The simulation's JSON lives in docs/ of the repository whose results/reference `ref` is.
    return json.loads((ref.parents[1] / "docs" / name).read_text())


def _pct(v: float) -> str:
    """A rate as the simulation tool prints it: 98.9%."""
    return f"{100 * v:.1f}%"


def _change(key: str | float) -> str:
    """A planted change (a JSON key, "0.02") as a percentage: 2%."""
    return f"{100 * float(key):g}%"


def _pct_range(values: list[float]) -> str:
    lo, hi = _pct(min(values)), _pct(max(values))
    return lo if lo == hi else f"{lo[:-1]}–{hi}"


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _per_k(d: dict, outcome: str, change: str | None = None) -> list[float]:
    """`outcome`'s rate in every row of one planted change (every change where None), k by k."""
    return [v[outcome] for c, by_k in d["planted"].items() if change is None or float(c) == float(change)
            for v in by_k.values()]


def _all_k(d: dict, change: str) -> dict:
    return next(v for c, v in d["planted_all_k"].items() if float(c) == float(change))


def simulation_table(d: dict) -> str:
    """A row per planted change and first bad k, its all-k mean, and the row with nothing planted."""
    lines = ["| planted | first bad k | right | wrong | none | inconclusive | steps (mean) |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for change, by_k in d["planted"].items():
        for k, v in [*by_k.items(), ("all k", d["planted_all_k"][change])]:
            lines.append(f"| {_change(change)} in one cell | {k} | " + " | ".join(_pct(v[o]) for o in OUTCOMES)
                         + f" | {v['steps_mean']:.2f} |")
    if v := d.get("nothing"):
        lines.append(f"| nothing | – | – | {_pct(v['wrong'])} (any named) | {_pct(v['none'])} | "
                     f"{_pct(v['inconclusive'])} | {v['steps_mean']:.2f} |")
    return "\n".join(lines)


@query("bisect_sim_table")
def bisect_sim_table(ref: Path) -> str:
    return simulation_table(_sim(ref))


@query("bisect_sim_small_table")
def bisect_sim_small_table(ref: Path) -> str:
    return simulation_table(_sim(ref, SIM_SMALL))


@query("bisect_sim_draws")
def bisect_sim_draws(ref: Path) -> str:
    return str(_sim(ref)["draws"])


@query("bisect_sim_repeats")
def bisect_sim_repeats(ref: Path) -> str:
    return str(_sim(ref)["repeats"])


@query("bisect_sim_changes")
def bisect_sim_changes(ref: Path) -> str:
    return " or ".join(_change(c) for c in _sim(ref)["planted"])


@query("bisect_sim_launches")
def bisect_sim_launches(ref: Path) -> str:
    return _and([f"`{name}`" for name in _sim(ref)["launches"]])


@query("bisect_sim_pools")
def bisect_sim_pools(ref: Path) -> str:
    return _and([str(n) for n in _sim(ref)["pool_sizes"]])


@query("bisect_sim_residuals")
def bisect_sim_residuals(ref: Path) -> str:
    return str(sum(_sim(ref)["pool_sizes"]))


@query("bisect_sim_alpha")
def bisect_sim_alpha(ref: Path) -> str:
    return _change(_sim(ref)["rule"]["alpha"])


@query("bisect_sim_margin")
def bisect_sim_margin(ref: Path) -> str:
    return _change(_sim(ref)["rule"]["margin"])


@query("bisect_sim_right")
def bisect_sim_right(ref: Path) -> str:
    """Each planted change's share of bisections naming the right environment, over all k."""
    d = _sim(ref)
    rates = [f"{_pct(_all_k(d, c)['right'])} at {_change(c)}" for c in d["planted"]]
    return _and([rates[0].replace(" at ", " of bisections at ", 1), *rates[1:]])


@query("bisect_sim_wrong_range")
def bisect_sim_wrong_range(ref: Path) -> str:
    return _pct_range(_per_k(_sim(ref), "wrong"))


@query("bisect_sim_inconclusive_range")
def bisect_sim_inconclusive_range(ref: Path) -> str:
    return _pct_range(_per_k(_sim(ref), "inconclusive"))


@query("bisect_sim_nothing")
def bisect_sim_nothing(ref: Path) -> str:
    v = _sim(ref)["nothing"]
    return (f"{_pct(v['wrong'])} of bisections named an environment and {_pct(v['inconclusive'])} stopped "
            f"inconclusive; {_pct(v['none'])} named none, in {v['steps_mean']:.2f} steps on average")


# The small simulation's rows the page discusses by their planted change (a KeyError if one goes).
MARGIN_CHANGE, BELOW_MARGIN = "0.01", "0.005"


@query("bisect_small_margin_right")
def bisect_small_margin_right(ref: Path) -> str:
    return _pct(_all_k(_sim(ref, SIM_SMALL), MARGIN_CHANGE)["right"])


@query("bisect_small_margin_inconclusive")
def bisect_small_margin_inconclusive(ref: Path) -> str:
    return _pct(_all_k(_sim(ref, SIM_SMALL), MARGIN_CHANGE)["inconclusive"])


@query("bisect_small_margin_wrong_range")
def bisect_small_margin_wrong_range(ref: Path) -> str:
    return _pct_range(_per_k(_sim(ref, SIM_SMALL), "wrong", MARGIN_CHANGE))


@query("bisect_small_below_right")
def bisect_small_below_right(ref: Path) -> str:
    return _pct(_all_k(_sim(ref, SIM_SMALL), BELOW_MARGIN)["right"])


@query("bisect_small_below_wrong_max")
def bisect_small_below_wrong_max(ref: Path) -> str:
    """The largest share of wrong environments at the change below the margin, and where."""
    by_k = next(v for c, v in _sim(ref, SIM_SMALL)["planted"].items() if float(c) == float(BELOW_MARGIN))
    k, v = max(by_k.items(), key=lambda kv: kv[1]["wrong"])
    return f"{_pct(v['wrong'])} of bisections (first bad k = {k})"


# -- the planted bisection on one H200 ------------------------------------------------------------

H200 = "h200-bisect-032c2c6"
LAUNCHES = "bisect-planted-h200-call1.tgz"   # call 1 ran the three launches (call 2 resumed them)


def _report(ref: Path) -> dict:
    return json.loads((ref / H200 / "report.json").read_text())


def _archived(ref: Path, suffix: str) -> str:
    """The text of the one member of call 1's archive whose name ends with `suffix`."""
    with tarfile.open(ref / H200 / LAUNCHES) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(suffix) and m.isfile())
        f = tar.extractfile(member)
        assert f is not None   # a regular file always has contents to read
        return f.read().decode(errors="replace")


def _minus(text: str) -> str:
    return text.replace("-", "−")


@query("bisect_h200_result", H200)
def bisect_h200_result(ref: Path) -> str:
    d = _report(ref)
    r, names = d["result"], [e["name"] for e in d["environments"]]
    if r["status"] != "found":
        return f"{r['status']} in {len(d['steps'])} steps"
    return f"**{names[r['first_bad']]}** in **{len(d['steps'])} steps**, after {names[r['last_good']]} (the last good)"


@query("bisect_h200_repeats", H200)
def bisect_h200_repeats(ref: Path) -> str:
    return str(_report(ref)["repeats"])


@query("bisect_h200_steps", H200)
def bisect_h200_steps(ref: Path) -> str:
    return "\n".join(bisect_report.step_table(_report(ref)))


@query("bisect_h200_detectable", H200)
def bisect_h200_detectable(ref: Path) -> str:
    """The range of the steps' smallest detectable changes."""
    x = [c["smallest_detectable"] for s in _report(ref)["steps"] for c in s["cells"]]
    lo, hi = f"{100 * min(x):.2f}", f"{100 * max(x):.2f}%"
    return f"{lo}–{hi}"


@query("bisect_h200_bad_changes", H200)
def bisect_h200_bad_changes(ref: Path) -> str:
    """The watched cell's change in each bad step."""
    return _and([_minus(f"{100 * c['change']:+.2f}%") for s in _report(ref)["steps"] if s["verdict"] == "bad"
                 for c in s["cells"]])


@query("bisect_h200_launch_times", H200)
def bisect_h200_launch_times(ref: Path) -> str:
    """Snakemake's elapsed time of each step's launch, from the step logs of call 1."""
    times = []
    for s in _report(ref)["steps"]:
        h, m, sec = re.findall(r"Elapsed time: (\d+):(\d+):([\d.]+)", _archived(ref, f"/step{s['number']}.log"))[-1]
        total = round(3600 * int(h) + 60 * int(m) + float(sec))
        times.append(f"{total // 60} min {total % 60} s")
    return _and(times)


@query("bisect_h200_timed_step", H200)
def bisect_h200_timed_step(ref: Path) -> str:
    """The last good environment's median step in the deciding launch, its host issue and regime."""
    d = _report(ref)
    last = d["steps"][-1]
    good = d["environments"][d["result"]["last_good"]]["name"]
    s = pd.read_csv(io.StringIO(_archived(ref, f"/{last['tag']}/summary.csv")))
    s = s[s["options"] == f"environment={good}"]
    return (f"{s['step_ms_p50'].median():.1f} ms with {s['host_step_ms'].median():.1f} ms of host issue, "
            f"{_and(sorted(set(s['bound'])))}-bound (the median of {good}'s runs in `{last['tag']}`)")


def _where(ref: Path) -> dict:
    return _report(ref)["where_the_time_went"]


def _kernel(ref: Path, name_part: str) -> str:
    w = _where(ref)
    k = next(k for k in w["kernels"] if name_part in k["name"])
    return f"{k['delta_ms']:+.3f} ms a step ({w['good']} {k['good_ms']:.3f} ms, {w['bad']} {k['bad_ms']:.3f} ms)"


@query("bisect_h200_spin_kernel", H200)
def bisect_h200_spin_kernel(ref: Path) -> str:
    return _kernel(ref, "spin_kernel")


@query("bisect_h200_optimizer_range", H200)
def bisect_h200_optimizer_range(ref: Path) -> str:
    return _kernel(ref, "Optimizer.step#")


@query("bisect_h200_phases", H200)
def bisect_h200_phases(ref: Path) -> str:
    """The profiled step's phases, from the last good to the first bad environment."""
    ch = _where(ref)["change_ms"]
    parts = [f"{name} {ch[key]:+.2f} ms" for key, name in
             (("forward", "forward"), ("backward", "backward"), ("optimizer", "optimizer"), ("step", "the step"))]
    return _minus(_and(parts))


@query("bisect_h200_profiled_step", H200)
def bisect_h200_profiled_step(ref: Path) -> str:
    """The last good environment's profiled step."""
    w = _where(ref)
    return f"{next(r for r in w['phases'] if r['environment'] == w['good'])['step']:.2f} ms"
