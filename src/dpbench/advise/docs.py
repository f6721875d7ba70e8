"""docs/advise.md's named queries (registered with dpbench.report.docs_queries' `query`): the
error table of advise.error over the rehearsal and sharding references, DeepSpeed's and
accelerate's estimates read from advise/estimates.json (so the page renders the same where they
are not installed). Torch-free."""
from __future__ import annotations

from pathlib import Path

from dpbench.advise import error
from dpbench.report.docs_queries import query


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
