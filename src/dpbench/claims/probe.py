"""Run one claim's probe in this (fresh) process and write its record.

    python -m dpbench.claims.probe C3 --out results/<tag>/claims/C3.json
"""
from __future__ import annotations

import argparse
import importlib

from dpbench.results import write_json

MODULES = {
    "C1": "c1_max_batch",
    "C2": "c2_device_ids",
    "C3": "c3_wrap_optimizer",
    "C4": "c4_save_load",
    "C5": "c5_gather_warning",
    "C6": "c6_reduction",
    "C7": "c7_cudnn_threads",
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("claim", choices=sorted(MODULES))
    ap.add_argument("--out", required=True, help="where to write the probe's JSON record")
    args = ap.parse_args(argv)
    rec = importlib.import_module(f"dpbench.claims.{MODULES[args.claim]}").run()
    write_json(args.out, rec.to_json())
    print(f"{args.claim}: {rec.verdict}" + (f" ({rec.not_run})" if rec.not_run else ""))


if __name__ == "__main__":
    main()
