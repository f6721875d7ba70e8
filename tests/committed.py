"""The committed evidence as tests read it: the reference folder, the experiment groups each
committed claims ledger was made with (fixtures/archive/), and a ledger rebuilt by today's code
from its committed set."""
from __future__ import annotations

from pathlib import Path

from dpbench import results
from dpbench.claims import ledger
from dpbench.plan import pipeline

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
ARCHIVE_GROUPS = Path(__file__).resolve().parent / "fixtures" / "archive"


def planned_gpus(name: str) -> int:
    """The GPUs a set was planned for: those its runs saw (a CPU set: none)."""
    names = results.ResultSet(REFERENCE, name).provenance().get("gpu_names") or []
    return len(names) if isinstance(names, list) else 1


def committed_sections(name: str) -> list:
    """Today's ledger sections of the committed set `name`, with the groups it was made with."""
    plan = pipeline.plan_of_file(ARCHIVE_GROUPS / f"{name}.claims.yaml", tag=name,
                                 gpus_available=planned_gpus(name))
    return ledger.build_sections(ledger.Evidence(REFERENCE, name, plan))
