"""docs/advise.md's named queries (registered with dpbench.report.docs_queries' `query`): the
error table of advise.error over the rehearsal and sharding references, DeepSpeed's and
accelerate's estimates read from advise/estimates.json (so the page renders the same where they
are not installed). Torch-free."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from dpbench.advise import error
from dpbench.report.docs_queries import query


@cache   # every query of the page reads the same cells: computed once a render
def _rows(ref: Path) -> list[dict]:
    return error.cells([ref / name for name in error.REFERENCES], error.cached_estimates())


@query("advise_error_summary")
def advise_error_summary(ref: Path) -> str:
    return error.summary_markdown(_rows(ref), error.cached_versions())


@query("advise_error_cells")
def advise_error_cells(ref: Path) -> str:
    return error.cells_markdown(_rows(ref))


@query("advise_error_references")
def advise_error_references(ref: Path) -> str:
    return ", ".join(f"[{name}](../results/reference/{name})" for name in error.REFERENCES)


@query("advise_estimator_versions")
def advise_estimator_versions(ref: Path) -> str:
    v = error.cached_versions()
    return f"DeepSpeed {v['deepspeed']}, accelerate {v['accelerate']}"


@query("advise_error_verdict")
def advise_error_verdict(ref: Path) -> str:
    """Each quantity's share within its target, and whether that meets the issue's 90%."""
    parts = []
    for s in error.summary(_rows(ref)):
        share = s["within_target"]
        met = "met" if share is not None and share >= error.SHARE else "missed"
        parts.append(f"{s['quantity'].replace('_', ' ')} {share:.0%} of {s['cells']} cells ({met})")
    return "; ".join(parts)


@query("advise_nvml_misses")
def advise_nvml_misses(ref: Path) -> str:
    """The NVML cells beyond their target (the probe's own left out): which, and by how much."""
    misses = [r for r in _rows(ref) if r["quantity"] == "nvml" and not r.get("probe")
              and r.get("error") is not None and abs(r["error"]) > error.TARGETS["nvml"]]
    if not misses:
        return "none"
    where = sorted({f"{r['model']} {r['setup']} on {r['gpus']} ({r['source']})" for r in misses})
    low, high = min(r["error"] for r in misses), max(r["error"] for r in misses)
    return f"{len(misses)}: {', '.join(where)}, {low:+.1%} to {high:+.1%}"
