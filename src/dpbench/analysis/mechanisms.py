"""The knobs' mechanism verdicts of a result set (each record's `mechanisms`, run.mechanisms),
as rows: one per run and check, with the run's cell. Numbers and flags only; the summary and
compare's report render them."""
from __future__ import annotations

from typing import Any, Iterable

from dpbench import results as R


def state(held: Any) -> str:
    """held / failed / not counted: a verdict's `held` in a word."""
    return "held" if held is True else "failed" if held is False else "not counted"


def rows(records: Iterable[R.RunRecord]) -> list[dict[str, Any]]:
    """Every ok run's verdicts, in run order."""
    out = []
    for rec in sorted(records, key=lambda r: r.run_id):
        if not rec.ok:
            continue
        for m in rec.raw.get("mechanisms") or []:
            out.append({"run_id": rec.run_id, "variant": rec.variant, "gpus": rec.gpus,
                        "options": R.options_label(rec.options), "knob": m.get("knob"), "check": m.get("check"),
                        "expected": m.get("expected"), "counted": m.get("counted"), "held": m.get("held"),
                        "state": state(m.get("held")), "text": m.get("text", "")})
    return out
