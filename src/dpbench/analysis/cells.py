"""What a cell is: the runs of one result set that differ only by their repeat.

Within a result set a cell is the plan's `cell_id` (results.identity: the run id less its
repeat), which runs.csv and cells.csv carry; the summary, the figures and the perf targets
find a cell by it, and compare pairs two sets' cells by it where both carry it. CELL_KEY
(variant, gpus, options label) is the same cell spelled by its settings: what a row shows of its
cell, compare's key for sets collected before runs.csv (compare.loading.key_cells), and the
cell statistics' grouping (tables.cells): the options label holds every
swept setting and the workload wherever the experiment set it, so across sets two models are
never one cell. CELL_FACTS follow from that key (the setup, how the batch was planned, the
batch sizes); cells.csv carries them as columns.
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
