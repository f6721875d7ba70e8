"""The knobs' mechanisms across two result sets: a check that held in the baseline and fails in
the candidate is a regression with no statistical noise to weigh (a count of collectives, bytes
on a device: the knob stopped doing what it claims); one that failed and now holds is fixed."""
from __future__ import annotations

from dataclasses import dataclass

from dpbench.analysis.mechanisms import rows, state


@dataclass(frozen=True)
class MechanismChange:
    """One run's check on both sides (held / failed / not counted) and the candidate's words."""
    run_id: str
    variant: str
    gpus: int
    options: str
    knob: str
    check: str
    baseline: str
    candidate: str
    expected: object
    counted: object
    text: str
    change: str
    severity: str


def _by_check(side: dict) -> dict[tuple[str, str, str], dict]:
    return {(r["run_id"], r["knob"], r["check"]): r for r in rows((side.get("records") or {}).values())}


def compare_mechanisms(base: dict, cand: dict) -> list[MechanismChange]:
    """Every check either side judged: regression where it held and now fails (or is gone from
    a run that is still ok), info otherwise."""
    a, b = _by_check(base), _by_check(cand)
    out = []
    for key in sorted(a.keys() | b.keys()):
        before, after = a.get(key), b.get(key)
        row = after or before
        was, now = state(before["held"]) if before else "absent", state(after["held"]) if after else "absent"
        if was == "held" and now == "failed":
            change, severity = "stopped holding", "regression"
        elif was == "failed" and now == "held":
            change, severity = "holds again (fixed)", "info"
        elif was == now:
            change, severity = "unchanged", "info"
        else:
            change, severity = f"{was} → {now}", "info"
        out.append(MechanismChange(run_id=key[0], variant=row["variant"], gpus=int(row["gpus"]),
                                   options=row["options"], knob=key[1], check=key[2], baseline=was,
                                   candidate=now, expected=row["expected"], counted=row["counted"],
                                   text=row["text"], change=change, severity=severity))
    return out
