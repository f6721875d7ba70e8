"""C9's bench on GPUs: the probe's sweep, its table, and C9's section as the claims ledger writes
it from those rows (the probe itself never calls the ledger).

    python -m dpbench.claims.c9.bench --variants ddp zero1 fsdp --gpus 1 --cap-gib 12 \\
        --sizes 256x4 1024x16 --ledger OUT_DIR

takes the probe's arguments (claims.c9.probe) and prints the table, C9's ledger section from a
result set written under OUT_DIR, and last the rows as one JSON line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpbench import results
from dpbench.claims.c9 import probe
from dpbench.claims.ledger import write_ledger
from dpbench.plan.matrix import Plan
from dpbench.plan.pipeline import load_experiment


def ledger_section(rows: list[dict[str, Any]], cap_gib: float, out: Path) -> str:
    """C9's section as the claims ledger writes it from these rows: the record under a result set
    `out`/c9, the claims experiment planned for the GPUs visible, the ledger run on it."""
    rs = results.ResultSet(out, "c9")
    results.write_json(rs.probe_path("C9"), probe.probe_record(rows, cap_gib).to_json())
    results.write_json(rs.plan_path, Plan(load_experiment({"experiment": "claims"}, Path.cwd()),
                                          probe.cuda_devices()).document())
    md, _ = write_ledger(out, "c9", rs.plan_path)
    return "## C9:" + md.read_text().split("## C9:", 1)[1]


def main(argv: list[str] | None = None) -> int:
    ap = probe.arguments()
    ap.add_argument("--ledger", metavar="DIR", required=True,
                    help="the result set C9's ledger section is written from")
    args = ap.parse_args(argv)
    rows = probe.sweep_of(args)
    print(probe.table(rows))
    print("\n" + ledger_section(rows, args.cap_gib, Path(args.ledger)))
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
