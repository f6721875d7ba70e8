"""The error rates of compare's rules (dpbench.analysis.compare.calibration) as markdown tables.

    python tools/compare_calibration.py [--draws 2000] [--seed 20261203] [--json docs/compare_calibration.json]

Prints markdown tables; --json writes the frozen result docs/compare.md quotes.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from dpbench.analysis.compare.calibration import (
    ALPHA,
    DESIGNS,
    PAIRED_LAUNCHES,
    REPEATS,
    SEED_PAIRED_SHARE,
    SEEDED_DESIGN,
    between_launch_curve_rates,
    between_launch_rates,
    curve_rates,
    fast_pools,
    launch_residuals,
    paired_launch_samples,
    paired_rates,
    seed_paired,
    seeded_summaries,
    throughput_samples,
)


def _pct(v: float | None) -> str:
    return "too few runs" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"


def seed_paired_markdown(sp: dict) -> list[str]:
    lines = [f"Loss curves, seed-paired ({sp['design']}, {sp['launches']} launches of seeds "
             f"{', '.join(map(str, sp['seeds']))}): false alarms per cell and per comparison (all "
             f"{sp['cells']} cells, Holm), power in one cell, shifts and the smallest detectable change "
             "(median) in a run's summary sd (the unit of the table above).", "",
             "| noise from | n a side | FA cell | FA comparison | power 1 sd | power 3 sd | power 4 sd | power ramp "
             "| detectable (run sd) |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for mode, by_n in sp["by_noise"].items():
        for n, v in by_n.items():
            if not v:
                lines.append(f"| {mode} | {n} | " + " | ".join(["too few seeds"] * 7) + " |")
                continue
            d = v.get("detectable")
            lines.append(f"| {mode} | {n} | " + " | ".join(
                _pct(v.get(k)) for k in ("fa_cell", "fa_comparison", "power_1sd", "power_3sd", "power_4sd",
                                         "power_ramp")) + f" | {'–' if d is None else f'{d:.2f}'} |")
    return lines


def markdown(res: dict) -> str:
    lines = ["Loss curves: the curve test (and the old per-step band), false alarms per cell and per "
             "comparison (all cells of the design, Holm), power in one cell of a comparison.", "",
             "| design | cells | runs/cell | n a side | FA cell | FA comparison | power 3 sd | power 4 sd | power ramp "
             "| band FA cell | band FA comparison |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for d, r in res["curves"].items():
        for n, v in r["by_n"].items():
            v = v or {}
            lines.append(f"| {d} | {r['cells']} | {r['runs_per_cell']} | {n} | " + " | ".join(
                _pct(v.get(k)) for k in ("fa_cell", "fa_comparison", "power_3sd", "power_4sd", "power_ramp",
                                         "band_fa_cell", "band_fa_comparison")) + " |")
    bl = res.get("curves_between_launches")
    if bl:
        lines += ["", f"Loss curves, the curve test between two distinct launches ({bl['design']}, every pair of "
                  f"its {bl['launches']} launches and every n of the seeds they share, exhaustively): false "
                  "alarms, and power for a 4 sd shift of one cell.", "",
                  "| n a side | comparisons | FA cell | FA comparison | power 4 sd |", "|--:|--:|--:|--:|--:|"]
        for n, v in bl["by_n"].items():
            lines.append(f"| {n} | " + (" | ".join([str(v["comparisons"])] + [_pct(v[k]) for k in (
                "fa_cell", "fa_comparison", "power_4sd")]) if v else " | ".join(["too few seeds"] * 4)) + " |")
    if res.get("seed_paired"):
        lines += ["", *seed_paired_markdown(res["seed_paired"])]
    lines += ["", "Throughput: false alarms (a regression or improvement called in an A/A) and the paired "
              "test's power and smallest detectable change (median over draws).", "",
              "| design | rule | cells | n a side | FA cell | FA comparison | power 1% one cell | power 1% every cell "
              "| detectable cell | detectable launch |", "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for d, r in res["throughput"].items():
        for rule in ("between launches", "paired"):
            for n, v in r.get(rule, {}).items():
                v = v or {}
                lines.append(f"| {d} | {rule} | {v.get('cells', '–')} | {n} | " + " | ".join(
                    (_pct(v.get(k)) if k in v else "–") if v else "too few runs" for k in
                    ("fa_cell", "fa_comparison", "power_one_cell", "power_every_cell", "detectable_cell",
                     "detectable_launch")) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seed", type=int, default=20261203)
    p.add_argument("--json", type=Path, help="write the frozen result here")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    res: dict = {"draws": args.draws, "seed": args.seed, "alpha": ALPHA, "designs": DESIGNS,
                 "curves": {}, "throughput": {}}
    for design, tags in DESIGNS.items():
        pools = fast_pools(tags)
        res["curves"][design] = {"cells": len(pools), "runs_per_cell": min(len(v) for v in pools.values()),
                                 "by_n": {n: curve_rates(pools, n, args.draws, rng) for n in REPEATS}}
        df = throughput_samples(tags)
        res["throughput"][design] = {
            "between launches": {n: between_launch_rates(df, n, args.draws // 4, rng) for n in REPEATS},
            "paired": {n: paired_rates(launch_residuals(df), df["cell"].nunique(), n, args.draws // 4, rng)
                       for n in REPEATS}}
    df = paired_launch_samples(PAIRED_LAUNCHES)
    res["throughput"]["1x H200, paired launches"] = {
        "paired": {n: paired_rates(launch_residuals(df), df["cell"].nunique(), n, args.draws // 4, rng)
                   for n in REPEATS}}
    summ, _ = seeded_summaries(DESIGNS[SEEDED_DESIGN])
    res["curves_between_launches"] = {"design": SEEDED_DESIGN, "launches": len(DESIGNS[SEEDED_DESIGN]),
                                      "by_n": {n: between_launch_curve_rates(summ, n) for n in REPEATS}}
    res["seed_paired"] = seed_paired(args.draws // SEED_PAIRED_SHARE, args.seed)
    text = markdown(res)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({**res, "markdown": text}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
