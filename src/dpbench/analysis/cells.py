"""What a cell is: the runs of one result set that differ only by their repeat.

A cell is keyed by (variant, gpus, options): the options label holds every swept setting, and
the workload wherever the experiment set it (the plan puts a `train` workload there too;
results.upgrade does for older records, and compare takes each run's label from its record),
so within one result set it fixes the run's config but the seed, and across sets two models
are never one cell. CELL_FACTS follow from that key
(the setup, how the batch was planned, the batch sizes); the cell table carries them as columns,
so tables groups by the key and its facts at once. results.RunId.cell spells the same key the
way run ids do; it stays in results, which may not import analysis. compare, tables and the
perf targets key cells with CELL_KEY (a row's key: cell_key).
"""
from __future__ import annotations

from typing import Any, Mapping

CELL_KEY = ["variant", "gpus", "options"]
CELL_FACTS = ["setup", "scaling", "global_batch", "per_gpu_batch"]


def cell_key(row: Mapping[str, Any]) -> tuple[str, int, str]:
    """A row's (variant, gpus, options), typed the same way whichever table it came from."""
    return str(row["variant"]), int(row["gpus"]), str(row["options"])


def cell_fields(key: tuple) -> dict[str, Any]:
    """A cell key as the named fields a report row starts with."""
    return dict(zip(CELL_KEY, (str(key[0]), int(key[1]), str(key[2]))))
