"""The smallest detectable change of each cell of the committed one-H200 paired launches, as a
range across the launches' A/A comparisons (base vs same) and pooled over them:
    python tools/detectable_ranges.py
prints the markdown table docs/compare.md quotes."""
from __future__ import annotations

import sys
from pathlib import Path

from dpbench.analysis.compare import one_launch, paired

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = ["h200-paired-9302adf", "h200-paired-slow-all-d5e46b6", "h200-paired-slow-ddp-d5e46b6"]


def spreads(results_dir: Path = ROOT / "results" / "reference", launches=LAUNCHES, cand: str = "same"):
    verdicts = []
    for tag in launches:
        rs = one_launch.load_paired(results_dir, tag)
        base = one_launch.environments(rs)[0]
        verdicts.append(paired.paired_throughput(one_launch.samples(rs, base, cand), base, cand))
    return paired.detectable_spread(verdicts)


def table(rows) -> str:
    out = ["| cell | A/A launches | detectable, range over launches | detectable, sd pooled (df) |",
           "|---|--:|--:|--:|"]
    for s in sorted(rows, key=lambda s: str(s.cell)):
        variant, gpus, options = s.cell
        name = f"{variant} g{gpus}" + (f" {options}" if options else "")
        out.append(f"| {name} | {s.launches} | {100 * s.low:.2f}–{100 * s.high:.2f}% | "
                   f"{100 * s.pooled:.2f}% ({s.pooled_df}) |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(table(spreads()) + "\n")
