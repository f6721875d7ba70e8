"""The launch-noise model's error rates on simulated A/A data (dpbench.analysis.noise.simulate).

    python tools/noise_simulation.py [--runs 2000] [--seed 20261201]

Modelled on the one-H200 launches of the default experiment (10 cells, a launch shift of sd
0.7%, a cell's own wobble of sd 0.1%), fitted on 4 launches, then a new pair of launches judged:
the share of A/A pairs with any alarm, and of pairs in which one cell, slowed by 1% or 2% beyond
the rest, is found. This is the noise test alone: compare also asks a change to exceed its
`threshold` (2% by default).
"""
from __future__ import annotations

import argparse

import numpy as np

from dpbench.analysis import noise


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=20261201)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    alarms = sum(bool(noise.flagged(noise.simulate(rng, fitted=4))) for _ in range(args.runs))
    print(f"A/A pairs with an alarm: {alarms / args.runs:.1%} of {args.runs} (nominal 5%)")
    for slowdown in (0.01, 0.02):
        found = sum(3 in noise.flagged(noise.simulate(rng, fitted=4, changed={3: -slowdown}))
                    for _ in range(args.runs))
        print(f"one cell {slowdown:.0%} slower than the rest, found: {found / args.runs:.1%}")


if __name__ == "__main__":
    main()
