"""What the launcher and the engine both write: the run's log line and its checkpoint's name
(a leaf module, so that neither has to import the other for them)."""
from __future__ import annotations

import os
import time

CHECKPOINT = "model.pt"


def log(msg: str) -> None:
    """One line of the run's log, tagged with the rank under torchrun."""
    rank = f" rank {os.environ['RANK']}" if "RANK" in os.environ else ""
    print(f"[dpbench {time.strftime('%H:%M:%S')}{rank}] {msg}", flush=True)
