"""The verdict of a comparison: how many findings of each --fail-on kind its report holds, and
the exit status that follows. Works on the report as compare() returns it or as its json reads back."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """Regressions, the other findings, the count per --fail-on kind, and the one-line summary
    the report and the command print (kept here: the json report holds it)."""
    regressions: int
    findings: int
    counts: dict[str, int]
    line: str


def failing(report: dict) -> dict[str, int]:
    """How many findings of each --fail-on kind the report holds."""
    launch = [report["paired"]["launch"]] if report.get("paired") else []   # a paired launch's whole-launch test
    rows = [report["provenance"], *report["status"], *report["throughput"], *launch, *report["memory"],
            *[r for rs in report["warnings"].values() for r in rs], *report["loss"], *report["accuracy"],
            *report.get("mechanisms", [])]   # absent from reports written before the knobs' checks
    return {"regressions": sum(r["severity"] == "regression" for r in rows),
            "new-warnings": len(report["warnings"]["new"]),
            # Changed bits are a divergence only where nothing explains them (severity regression).
            "diverged-curves": sum(r["verdict"] == "diverged"
                                   or (r["verdict"] == "bits changed" and r["severity"] == "regression")
                                   for r in report["loss"]),
            "findings": sum(r["severity"] != "info" for r in rows)}


def exit_code(report: dict, fail_on: list[str]) -> int:
    """1 when the report holds something of a kind in fail_on, else 0 (2 is for bad input)."""
    return int(any(report["verdict"]["counts"][k] for k in fail_on))


def verdict_of(report: dict) -> Verdict:
    counts = failing(report)
    n, m = counts["regressions"], counts["findings"] - counts["regressions"]
    return Verdict(n, m, counts, f"{counted(n, 'regression')}, {counted(m, 'finding')}" if n or m
                   else "no regression beyond noise")


def counted(n: int, noun: str) -> str:
    """'1 regression', '2 findings'."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
