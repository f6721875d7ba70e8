"""Error rates of `dpbench bisect` by simulation on the committed paired launches' noise.

    python tools/bisect_simulation.py [--draws 500] [--seed 20261204] [--repeats 3] \
        [--changes 0.02,0.05] [--no-null] [--json docs/bisect_simulation.json] [--md FILE]

Eight environments, the good end first and the bad end last; a change of 2% or 5% (slower) in
one cell of two, from position k on (k = 1..7: environments k..7 carry it), or nothing planted.
Each bisection step is one simulated paired launch of (last good, midpoint): every cell's runs,
`--repeats` a side, are drawn without replacement from one launch's pool of log samples/s
residuals (the A/A environments base and same of the one-H200 paired launches
results/reference/h200-paired-*, read as dpbench.analysis.compare.calibration reads them: residuals from
each cell's and environment's mean, rescaled for the mean they lost), a new launch's pool for
every step in turn, plus each side's planted level; the step is judged by the rule frozen in
dpbench.analysis.bisect.search (RULE) and the bisection is the one `dpbench bisect` runs. A
bisection names the right environment, a wrong one, none (it saw nothing slower), or stops
inconclusive. Assumes one within-launch sd for the cells of a launch (as the calibration does).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from dpbench.analysis.bisect import search
from dpbench.analysis.compare import calibration as cc
from dpbench.report.bisect_queries import OUTCOMES, simulation_table   # the table docs/bisect.md renders

ENVS, CELLS = 8, 2
CHANGES = (0.02, 0.05)


def pools() -> list[np.ndarray]:
    res = cc.launch_residuals(cc.paired_launch_samples(cc.PAIRED_LAUNCHES))
    return [res[t] for t in sorted(res)]


def one_bisection(pool_list: list[np.ndarray], n: int, change: float, k: int | None, planted_cell: int,
                  rng, start: int) -> tuple[str, int]:
    """(outcome, steps) of one bisection with `change` planted in one cell from environment k on."""
    level = lambda env, cell: math.log1p(-change) if k is not None and env >= k and cell == planted_cell else 0.0
    usable = [p for p in pool_list if len(p) >= 2 * n]
    counter = [start]

    def judge(base: int, cand: int) -> search.StepJudgement:
        pool = usable[counter[0] % len(usable)]   # each step a launch of its own
        counter[0] += 1
        logs = {}
        for c in range(CELLS):
            r = rng.choice(pool, 2 * n, replace=False)
            logs[c] = (r[:n] + level(base, c), r[n:] + level(cand, c))
        return search.judge_logs(logs, search.RULE)

    res = search.bisect(ENVS, judge)
    if res.status == "found":
        return ("right" if res.first_bad == k else "wrong"), len(res.steps)
    return res.status, len(res.steps)


def rates(pool_list, n: int, change: float, k: int | None, draws: int, rng) -> dict:
    got = [one_bisection(pool_list, n, change, k, i % CELLS, rng, i) for i in range(draws)]
    out = {o: float(np.mean([g[0] == o for g in got])) for o in OUTCOMES}
    out["steps_mean"] = float(np.mean([g[1] for g in got]))
    out["draws"] = draws
    return out


def markdown(res: dict) -> str:
    return (f"Rule: alpha {res['rule']['alpha']} a step (Holm over the cells), margin "
            f"{100 * res['rule']['margin']:g}%, {res['repeats']} runs a side; {res['draws']} bisections a row, "
            f"8 environments, 2 cells, noise from {', '.join(res['launches'])}.\n\n" + simulation_table(res))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--draws", type=int, default=500, help="bisections per row")
    p.add_argument("--seed", type=int, default=20261204)
    p.add_argument("--repeats", type=int, default=3, help="runs a side in every step")
    p.add_argument("--json", type=Path)
    p.add_argument("--md", type=Path)
    p.add_argument("--changes", default=",".join(map(str, CHANGES)),
                   help="the planted slowdowns, comma-separated (default 0.02,0.05)")
    p.add_argument("--no-null", action="store_true", help="leave out the rows with nothing planted")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    pool_list = pools()
    res: dict = {"draws": args.draws, "seed": args.seed, "repeats": args.repeats,
                 "rule": {"alpha": search.RULE.alpha, "margin": search.RULE.margin, "power": search.RULE.power},
                 "launches": cc.PAIRED_LAUNCHES, "pool_sizes": [len(x) for x in pool_list],
                 "planted": {}, "planted_all_k": {}}
    for change in [float(c) for c in args.changes.split(",") if c.strip()]:
        by_k = {k: rates(pool_list, args.repeats, change, k, args.draws, rng) for k in range(1, ENVS)}
        res["planted"][str(change)] = by_k
        res["planted_all_k"][str(change)] = {o: float(np.mean([v[o] for v in by_k.values()]))
                                             for o in (*OUTCOMES, "steps_mean")}
    if not args.no_null:
        nothing = rates(pool_list, args.repeats, 0.0, None, args.draws, rng)
        # With nothing planted any environment named is a wrong one.
        res["nothing"] = {**nothing, "wrong": nothing["wrong"] + nothing["right"], "right": 0.0}
    text = markdown(res)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    if args.md:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
