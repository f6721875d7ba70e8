"""Where the time went: profiled steps (run.step_breakdown's documents) of one cell in several
environments, compared with the last good one: the phases (forward, backward, optimizer,
exposed communication) and the kernels or operators whose time per step moved most."""
from __future__ import annotations

from typing import Any

PHASES = ("forward", "backward", "optimizer")
TOP = 10


def phase_rows(profiles: dict[str, dict], order: list[str]) -> list[dict[str, Any]]:
    """One row per environment profiled: its phases' ms, exposed communication and step."""
    rows = []
    for name in order:
        doc = profiles.get(name)
        if not doc:
            continue
        rows.append({"environment": name, **{p: doc["phases_ms"].get(p) for p in PHASES},
                     "exposed_comm": doc.get("exposed_comm_ms"), "step": doc.get("step_ms"),
                     "device": doc.get("device")})
    return rows


def moved(good: dict, bad: dict, top: int = TOP) -> list[dict[str, Any]]:
    """The kernels (or CPU operators) whose time per step moved most from `good` to `bad`, by
    the size of the move (ms per step; absent on one side counts 0)."""
    a, b = good.get("kernels_ms", {}), bad.get("kernels_ms", {})
    rows = [{"name": k, "good_ms": a.get(k, 0.0), "bad_ms": b.get(k, 0.0), "delta_ms": b.get(k, 0.0) - a.get(k, 0.0)}
            for k in set(a) | set(b)]
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["name"]))
    return rows[:top]


def phase_changes(good: dict, bad: dict) -> dict[str, float | None]:
    """Each phase's change (ms per step) from good to bad, with exposed communication and the step."""
    out = {p: bad["phases_ms"][p] - good["phases_ms"][p] for p in PHASES}
    out["exposed_comm"] = bad.get("exposed_comm_ms", 0.0) - good.get("exposed_comm_ms", 0.0)
    out["step"] = bad["step_ms"] - good["step_ms"]
    return out


def where_the_time_went(profiles: dict[str, dict], order: list[str], good: str, bad: str,
                        cell: Any) -> dict[str, Any]:
    """The report's section: phases by environment, the change from good to bad, the phase that
    grew most (what a slowdown is made of; a phase that shrank is the profile's noise or a
    trade), and the kernels that moved most."""
    out: dict[str, Any] = {"cell": cell, "good": good, "bad": bad, "phases": phase_rows(profiles, order)}
    if profiles.get(good) and profiles.get(bad):
        changes = phase_changes(profiles[good], profiles[bad])
        out["change_ms"] = changes
        out["grew_most"] = max(("forward", "backward", "optimizer", "exposed_comm"), key=lambda p: changes[p])
        out["kernels"] = moved(profiles[good], profiles[bad])
    return out
