"""Run one claim's probe in this (fresh) process and write its record.

    python -m dpbench.claims.probe C3 --out results/<tag>/claims/C3.json [--experiment experiments/claims.yaml]

A probe that measures at the runs' settings (C1, C7) reads them from the experiment's groups
(dpbench.claims.settings); the pipeline passes the groups as it planned them.
"""
from __future__ import annotations

import argparse
import importlib

from dpbench.claims.registry import REGISTRY
from dpbench.claims.settings import experiment_groups, probe_settings
from dpbench.results import write_json

MODULES = {cid: claim.probe for cid, claim in REGISTRY.items() if claim.probe}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("claim", choices=sorted(MODULES))
    ap.add_argument("--out", required=True, help="where to write the probe's JSON record")
    ap.add_argument("--experiment", default="experiments/claims.yaml",
                    help="the experiment file, or its groups as inline JSON, that C1 and C7 take their settings from")
    args = ap.parse_args(argv)
    settings = probe_settings(args.claim, experiment_groups(args.experiment))
    rec = importlib.import_module(f"dpbench.claims.{MODULES[args.claim]}").run(**settings)
    write_json(args.out, rec.to_json())
    print(f"{args.claim}: {rec.verdict}" + (f" ({rec.not_run})" if rec.not_run else ""))


if __name__ == "__main__":
    main()
