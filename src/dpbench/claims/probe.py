"""Run one claim's probe in this (fresh) process and write its record.

    python -m dpbench.claims.probe C3 --out results/<tag>/claims/C3.json
    python -m dpbench.claims.probe C1 --out results/<tag>/claims/C1.json --plan results/<tag>/plan.json

A probe that measures at the runs' settings (C1, C7) reads them from the experiment's groups as
planned (dpbench.claims.settings); `snakemake results/<tag>/plan.json` writes that file alone.
"""
from __future__ import annotations

import argparse
import importlib

from dpbench.claims.registry import REGISTRY
from dpbench.claims.settings import NEEDS_PLAN, probe_settings
from dpbench.plan.matrix import read_plan
from dpbench.results import write_json

MODULES = {cid: claim.probe for cid, claim in REGISTRY.items() if claim.probe}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("claim", choices=sorted(MODULES))
    ap.add_argument("--out", required=True, help="where to write the probe's JSON record")
    ap.add_argument("--plan", help=f"plan.json, which {' and '.join(NEEDS_PLAN)} take their settings from")
    args = ap.parse_args(argv)
    if args.claim in NEEDS_PLAN and not args.plan:
        ap.error(f"{args.claim} measures at its groups' settings: give --plan results/<tag>/plan.json")
    settings = probe_settings(args.claim, read_plan(args.plan)) if args.claim in NEEDS_PLAN else {}
    rec = importlib.import_module(f"dpbench.claims.{MODULES[args.claim]}").run(**settings)
    write_json(args.out, rec.to_json())
    print(f"{args.claim}: {rec.verdict}" + (f" ({rec.not_run})" if rec.not_run else ""))


if __name__ == "__main__":
    main()
