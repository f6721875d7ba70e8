"""One bare loop as its own process (`python -m dpbench.bench.bare_main --config JSON --json OUT`,
under torchrun for the distributed variants): the launched half of the parity benchmark."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from dpbench.bench import bare
from dpbench.plan.config import RunConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    cfg = RunConfig.from_dict(json.loads(args.config))
    res = bare.run(cfg)
    timed = res.step_ms[cfg.warmup_steps - 1:] if cfg.warmup_steps else res.step_ms
    if int(os.environ.get("RANK", 0)) == 0:
        args.json.write_text(json.dumps({"step_ms": statistics.median(timed), "host_ms": res.host_ms,
                                         "losses": res.losses}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
