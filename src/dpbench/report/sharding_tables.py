"""sharding.md: the memory model and the traffic formulas against what the runs measured, as two
markdown tables (docs/sharding.md says what each column means).

    python -m dpbench.report.sharding_tables --results-dir results --tag TAG     # prints it
    python -m dpbench.report.sharding_tables --results-dir results --tag TAG --out results/TAG/sharding.md
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from dpbench import results
from dpbench.analysis import memory_model, traffic_model
from dpbench.report.markdown import md_table


def memory_section(mc: pd.DataFrame) -> str:
    """One row per run and device: each component as measured, its difference from the closed
    form, and a mark (!) beyond 5%."""
    by_device: dict[tuple, dict[str, str]] = {}
    for r in memory_model.comparison(mc.to_dict("records")):
        mark = " !" if r["beyond_tolerance"] else ""
        by_device.setdefault((r["run_id"], r["device"]), {})[r["component"]] = \
            f"{r['measured_mib']:,.1f} ({r['relative_difference']:+.1%}){mark}"
    body = [[rid, device] + [cells.get(c, "–") for c in memory_model.COMPARED]
            for (rid, device), cells in by_device.items()]
    return ("## Memory per device: measured MiB (difference from the closed form; ! beyond 5%)\n\n"
            + md_table(["run", "device", *memory_model.COMPARED], body, right=(1, 2, 3, 4, 5)))


def traffic_section(coll: pd.DataFrame) -> str:
    rows = traffic_model.comparison(coll.to_dict("records"))
    wire = {(r["run_id"], r["collective"]): r["predicted_wire_bytes"] for r in coll.to_dict("records")}
    body = [[r["run_id"], r["collective"], r["count"], r["bytes"] / 2**20, r["predicted_bytes"] / 2**20,
             f"{r['relative_difference']:+.1%}" + (" !" if r["beyond_tolerance"] else ""),
             wire[(r["run_id"], r["collective"])] / 2**20]
            for r in rows]
    return ("## Collectives per step on rank 0: counted against the formulas (MiB; ! beyond 5%)\n\n"
            + md_table(["run", "collective", "count", "payload", "predicted", "difference",
                        "predicted wire"], body, right=(2, 3, 4, 5, 6)))


def sharding_md(results_dir: Path | str, tag: str) -> str:
    rs = results.ResultSet(results_dir, tag)
    mc, coll = rs.table("memory_components"), rs.table("collectives")
    return (f"# Sharded variants: models against measurements ({tag})\n\n"
            + memory_section(mc) + "\n\n" + traffic_section(coll) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--out", type=Path, help="write it here instead of printing it")
    args = parser.parse_args(argv)
    text = sharding_md(args.results_dir, args.tag)
    if args.out:
        results.write_atomic(args.out, text.encode())
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
