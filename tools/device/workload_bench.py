#!/usr/bin/env python3
"""Each built-in workload on one GPU beside a bare loop of the same model: dpbench.bench.workloads.

    python3 tools/device/workload_bench.py --out DIR [--tiny] [...]   (the module's options)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
from dpbench.bench.workloads import main  # noqa: E402  (a copied tree: dpbench from its src/)

if __name__ == "__main__":
    sys.exit(main())
