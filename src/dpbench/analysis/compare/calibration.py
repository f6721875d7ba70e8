"""Error rates of compare's rules measured by resampling the committed references, not a model
(tools/compare_calibration.py runs them and prints the tables).

Loss curves: per machine, the fast (not deterministic) curves of one cell from every launch of
the same experiment are taken as exchangeable runs (same code, config and seed: what differs is
the GPU's non-determinism). An A/A draws 2n distinct runs of a cell and splits them n vs n; a
comparison draws every cell of the design so, with Holm over the cells. Between launches, as a
user compares: every pair of the one-H200 launches and every n of the seeds both ran, exhaustively. Power: the candidate's
curves shifted by 3 or 4 sd of a run's summary (the pool's), or a ramp growing from 0 to 4 sd at
the last step, in one cell. The old per-step band rule is measured on the same draws.

Throughput: the between-launch rule (fixed noise floor, Welch, Holm; default thresholds) on
pairs of distinct launches, n repeats a side drawn from each launch's runs of the cell. The
paired within-launch test (analysis.compare.paired) draws both sides from one launch: a launch
holds 2-3 runs of a cell, too few for 2 vs 2, so its runs' log samples/s residuals from their
cell's mean (rescaled by sqrt(k / (k - 1)) for the mean they lost) are pooled over the launch's
cells and each cell's sides are drawn from that pool without replacement (assumes one
within-launch sd for all cells: stated, not hidden). The same on the paired one-H200 launches of
the upgrade experiment (their A/A environments, base and same: residuals from each cell's and
environment's mean). Curves repeated bit for bit across launches count once. Power: a 1% slowdown
of one cell, and of every cell.

Seed-paired curves (report format 3): the one-H200 launches ran the same seeds by repeat (checked:
a launch whose fast runs' seeds are not its repeats stops the script). A draw picks two distinct
launches as baseline and candidate and n of the seeds, the same in every cell; the test is on the
seed-matched differences, its noise from the differences themselves ("own"), or from A/A launches
restricted to the drawn seeds: the baseline and two other launches ("A/A incl. baseline", as
`--noise-from` naming the baseline: the candidate is never among them), or two launches apart from
both sides ("A/A apart"). Power: the same shifts, in the same unit (a run's summary sd, the
unpaired pool's), plus 1 sd; the smallest detectable change (median, Holm's first level) in that unit.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd

from dpbench import results
from dpbench.host.source import PROJECT
from dpbench.analysis.compare import curves, one_launch, paired
from dpbench.analysis.compare.loading import load_set
from dpbench.analysis.compare.loss import common_steps, curve_matrix, curves_of
from dpbench.analysis.compare.stats import envelope_check, holm
from dpbench.analysis.compare.thresholds import Thresholds
from dpbench.analysis.compare.throughput import throughput_verdicts

REFERENCE = PROJECT / "results" / "reference"
T211 = "torch-2.11.0+cu130"
# Launches of one experiment on one kind of machine (A/A sets; the commits between them did not
# touch the training or the timing of the default experiment).
DESIGNS = {
    "1x H200": [f"h200-{t}{T211}" for t in ("", "aa2-", "92a6737-", "92a6737-aa2-", "1178c54-", "2951eab-",
                                             "67dd99a-")],
    "2x H200": [f"h200x2-{T211}"],
    "CPU": [f"cpu_check-aa{i}-torch-2.14.1+cu130" for i in (1, 2, 3)],
}
# One-H200 launches of the upgrade experiment, each with two environments of one torch (base and
# same: a paired A/A) beside a third carrying a planted slowdown, left out here.
PAIRED_LAUNCHES = ["h200-paired-9302adf", "h200-paired-slow-all-d5e46b6", "h200-paired-slow-ddp-d5e46b6"]
AA_ENVIRONMENTS = ("base", "same")
REPEATS = (2, 3, 4)
ALPHA = 0.05


def fast_pools(tags: list[str]) -> dict[tuple, np.ndarray]:
    """cell -> all runs' curves (runs x common steps) over the launches, fast cells only."""
    per_cell: dict[tuple, list] = {}
    for tag in tags:
        for key, runs in curves_of(results.ResultSet(REFERENCE, tag).table("steps")).items():
            if "deterministic" not in key[2]:
                per_cell.setdefault(key, []).extend(runs.values())
    out = {}
    for k, v in sorted(per_cell.items()):
        m = curve_matrix(dict(enumerate(v)), common_steps(v))
        # A curve repeated bit for bit (CPU runs of one seed in every launch) is one draw, not several.
        out[k] = m[sorted({row.tobytes(): i for i, row in enumerate(m)}.values())]
    return out


def _rate(hits: list[bool]) -> float:
    return float(np.mean(hits)) if hits else math.nan


def curve_rates(pools: dict[tuple, np.ndarray], n: int, draws: int, rng) -> dict | None:
    """False alarms and power of the curve test (and the old band's false alarms) at n vs n."""
    if min(len(p) for p in pools.values()) < 2 * n:
        return None
    th = Thresholds()
    summaries = {k: curves.curve_summary(p) for k, p in pools.items()}
    sd = {k: float(s.std(ddof=1)) for k, s in summaries.items()}
    # A ramp from 0 to 4 sd at the last step, as each run's summary sees it.
    ramp = {k: float(np.mean(np.linspace(0, 4, p.shape[1])[int(math.ceil(curves.BURN_IN * p.shape[1])):]))
            for k, p in pools.items()}
    keys = list(pools)
    out: dict[str, list] = {"fa_cell": [], "fa_comparison": [], "band_fa_cell": [], "band_fa_comparison": [],
                            **{f"power_{w}": [] for w in ("3sd", "4sd", "ramp")}}

    def p_of(b: np.ndarray, c: np.ndarray) -> float:
        # Runs with identical curves leave the noise unknown: no alarm, as compare says.
        p = curves.curve_summary_test(b[:, None], c[:, None]).p_value
        return 1.0 if p is None else p

    for i in range(draws):
        picks = {k: rng.permutation(len(pools[k]))[: 2 * n] for k in keys}
        ps = {k: p_of(summaries[k][picks[k][:n]], summaries[k][picks[k][n:]]) for k in keys}
        out["fa_cell"] += [ps[k] < ALPHA for k in keys]
        out["fa_comparison"].append(any(q < ALPHA for q in holm([ps[k] for k in keys])))
        if i < draws // 4:  # the band is slower to compute; a quarter of the draws measure it
            band = [envelope_check(pools[k][picks[k][:n]], pools[k][picks[k][n:]], th)["verdict"] == "diverged"
                    for k in keys]
            out["band_fa_cell"] += band
            out["band_fa_comparison"].append(any(band))
        target = keys[i % len(keys)]
        for what, shift in (("3sd", 3.0), ("4sd", 4.0), ("ramp", ramp[target])):
            moved = {**ps, target: p_of(summaries[target][picks[target][:n]],
                                        summaries[target][picks[target][n:]] + shift * sd[target])}
            adjusted = dict(zip(keys, holm([moved[k] for k in keys])))
            out[f"power_{what}"].append(adjusted[target] < ALPHA)
    return {k: _rate(v) for k, v in out.items()}


def between_launch_curve_rates(summ: dict[tuple, np.ndarray], n: int) -> dict | None:
    """The curve test as a user meets it: baseline and candidate are two distinct launches with
    the same seeds (summ: cell -> launches x seeds); every pair of launches and every n of the
    seeds, exhaustively. Power: a 4 sd shift of one cell, in turn."""
    keys = list(summ)
    launches, seeds = next(iter(summ.values())).shape
    if n > seeds or launches < 2:
        return None
    sd = {k: float(v.std(ddof=1)) for k, v in summ.items()}

    def p_of(b: np.ndarray, c: np.ndarray) -> float:
        p = curves.curve_summary_test(b[:, None], c[:, None]).p_value
        return 1.0 if p is None else p

    cell, comparison, power = [], [], []
    for i, j in itertools.combinations(range(launches), 2):
        for cols in itertools.combinations(range(seeds), n):
            ps = {k: p_of(summ[k][i, list(cols)], summ[k][j, list(cols)]) for k in keys}
            cell += [ps[k] < ALPHA for k in keys]
            comparison.append(any(q < ALPHA for q in holm(list(ps.values()))))
            for target in keys:
                moved = {**ps, target: p_of(summ[target][i, list(cols)], summ[target][j, list(cols)] + 4 * sd[target])}
                power.append(dict(zip(keys, holm([moved[k] for k in keys])))[target] < ALPHA)
    return {"fa_cell": _rate(cell), "fa_comparison": _rate(comparison), "power_4sd": _rate(power),
            "comparisons": len(comparison)}


SEEDED_DESIGN = "1x H200"
# Where the paired test's noise comes from: the differences themselves, or A/A launches (the
# baseline and two others, as --noise-from naming the baseline; or two apart from both sides).
AA_MODES = ("own", "A/A incl. baseline", "A/A apart")
# The seed-paired draws are the slowest; they get this share of --draws.
SEED_PAIRED_SHARE = 4


def seeded_summaries(tags: list[str]) -> tuple[dict[tuple, np.ndarray], list]:
    """cell -> launches x seeds of run summaries (fast cells; each cell's common steps over all the
    launches), and the seeds; every launch must have run the same seeds as its repeats."""
    per: dict[tuple, list] = {}
    seeds = None
    for tag in tags:
        rs = results.ResultSet(REFERENCE, tag)
        summary = rs.table("summary")
        seed_of = {(v, int(g), o, int(r)): int(sd) for v, g, o, r, sd in
                   zip(summary["variant"], summary["gpus"], summary["options"], summary["repeat"], summary["seed"])}
        for key, runs in curves_of(rs.table("steps")).items():
            if "deterministic" in key[2]:
                continue
            got = [seed_of[(*key, r)] for r in sorted(runs)]
            if seeds is None:
                seeds = got
            if got != seeds:
                raise SystemExit(f"{tag} {key}: seeds {got}, not {seeds} as in the other launches")
            per.setdefault(key, []).append(runs)
    out = {}
    for k, launches in sorted(per.items()):
        steps = common_steps([c for runs in launches for c in runs.values()])
        out[k] = np.array([curves.curve_summary(curve_matrix(runs, steps)) for runs in launches])
    return out, seeds or []


def seed_paired_rates(summ: dict[tuple, np.ndarray], seeds: list, n: int, mode: str, draws: int,
                      rng) -> dict | None:
    """False alarms, power and detectable change of the seed-paired test at n seeds a side."""
    keys = list(summ)
    launches = min(len(v) for v in summ.values())
    if n > len(seeds) or launches < (2 if mode == "own" else 4):
        return None
    run_sd = {k: float(v.std(ddof=1)) for k, v in summ.items()}
    ramp = 4 * (1 + curves.BURN_IN) / 2  # a ramp 0 -> 4 sd as a run's summary (from 0.1 T on) sees it
    out: dict[str, list] = {"fa_cell": [], "fa_comparison": [], "detectable": [],
                            **{f"power_{w}": [] for w in ("1sd", "3sd", "4sd", "ramp")}}
    for i in range(draws):
        order = rng.permutation(launches)
        base, cand = order[0], order[1]
        aa = {"own": [], "A/A incl. baseline": [base, *order[2:4]], "A/A apart": list(order[2:4])}[mode]
        cols = np.sort(rng.choice(len(seeds), n, replace=False))
        sd_of = [seeds[j] for j in cols]

        def tests(shift: dict) -> dict:
            cells = {k: (summ[k][base, cols][:, None], summ[k][cand, cols][:, None] + shift.get(k, 0.0))
                     for k in keys}
            return curves.curve_summary_tests(
                cells, ALPHA, seeds={k: (sd_of, sd_of) for k in keys},
                aa_seeded={k: [(summ[k][a, cols][:, None], sd_of) for a in aa] for k in keys})

        null = tests({})
        out["fa_cell"] += [null[k].p_value is not None and null[k].p_value < ALPHA for k in keys]
        out["fa_comparison"].append(any(t.verdict == "diverged" for t in null.values()))
        target = keys[i % len(keys)]
        if null[target].smallest_detectable is not None:
            out["detectable"].append(null[target].smallest_detectable / run_sd[target])
        for what, shift in (("1sd", 1.0), ("3sd", 3.0), ("4sd", 4.0), ("ramp", ramp)):
            out[f"power_{what}"].append(tests({target: shift * run_sd[target]})[target].verdict == "diverged")
    return {k: (float(np.median(v)) if k == "detectable" and v else _rate(v)) for k, v in out.items()}


def seed_paired(draws: int, seed: int) -> dict:
    """The seed-paired part, on its own random stream."""
    rng = np.random.default_rng([seed, 3])
    summ, seeds = seeded_summaries(DESIGNS[SEEDED_DESIGN])
    res = {"design": SEEDED_DESIGN, "cells": len(summ), "launches": min(len(v) for v in summ.values()),
           "seeds": seeds, "by_noise": {}}
    for mode in AA_MODES:
        res["by_noise"][mode] = {n: seed_paired_rates(summ, seeds, n, mode, draws, rng) for n in REPEATS}
    return res


def throughput_samples(tags: list[str]) -> pd.DataFrame:
    """One row per ok run: launch, cell, samples_per_s."""
    rows = []
    for tag in tags:
        s = results.ResultSet(REFERENCE, tag).table("summary")
        s = s[s["status"] == results.STATUS_OK]
        rows += [{"launch": tag, "cell": (v, int(g), o), "samples_per_s": float(x)}
                 for v, g, o, x in zip(s["variant"], s["gpus"], s["options"], s["images_per_s"])]
    return pd.DataFrame(rows)


def between_launch_rates(df: pd.DataFrame, n: int, draws: int, rng) -> dict | None:
    """The fixed-floor rule's alarms (regression or improvement) between two distinct launches."""
    launches = sorted(df["launch"].unique())
    runs = {(t, c): g["samples_per_s"].to_numpy() for (t, c), g in df.groupby(["launch", "cell"])}
    # The cells with n runs in every launch (a launch holds 2 deterministic and 3 fast runs a cell).
    cells = sorted(c for c in {c for _, c in runs} if all(len(runs.get((t, c), ())) >= n for t in launches))
    if len(launches) < 2 or not cells:
        return None
    cell_alarm, comparison_alarm = [], []
    for _ in range(draws):
        a, b = rng.choice(len(launches), 2, replace=False)
        pick = {c: (rng.permutation(runs[(launches[a], c)])[:n], rng.permutation(runs[(launches[b], c)])[:n])
                for c in cells}
        alarms = [v.verdict in ("regression", "improvement") for v in throughput_verdicts(pick, Thresholds())[0].values()]
        cell_alarm += alarms
        comparison_alarm.append(any(alarms))
    return {"fa_cell": _rate(cell_alarm), "fa_comparison": _rate(comparison_alarm), "cells": len(cells)}


def paired_launch_samples(tags: list[str]) -> pd.DataFrame:
    """One row per ok run of the A/A environments of paired launches: launch, cell, environment,
    samples_per_s (compare --paired's own reading of a launch)."""
    return pd.concat([one_launch.samples(load_set(REFERENCE, t, "paired launch"), *AA_ENVIRONMENTS).assign(launch=t)
                      for t in tags], ignore_index=True)


def launch_residuals(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """launch -> its runs' log samples/s residuals from their group's mean (groups: cell, or cell
    and environment in a paired launch), rescaled by sqrt(k / (k - 1)) for the mean they lost."""
    out = {}
    group = df["cell"].astype(str) + "|" + df.get("environment", pd.Series("", index=df.index)).astype(str)
    for t, g in df.groupby("launch"):
        logs = np.log(g["samples_per_s"].to_numpy())
        by = group.loc[g.index]
        k = g.groupby(by)["samples_per_s"].transform("size").to_numpy()
        mean = np.log(g["samples_per_s"]).groupby(by).transform("mean").to_numpy()
        out[t] = ((logs - mean) * np.sqrt(k / np.maximum(k - 1, 1)))[k > 1]
    return out


def paired_rates(residuals: dict[str, np.ndarray], cells: int, n: int, draws: int, rng) -> dict | None:
    """The paired test's A/A alarms and power (1% slower: one cell, every cell) in a launch of
    `cells` cells, n runs a side, each draw's noise from one pool of residuals (in turn)."""
    pools = [r for r in residuals.values() if len(r) >= 2 * n]
    if not pools:
        return None
    out: dict[str, list] = {"fa_cell": [], "fa_comparison": [], "power_one_cell": [], "power_every_cell": [],
                            "detectable_cell": [], "detectable_launch": []}
    for i in range(draws):
        r = pools[i % len(pools)]
        noise = [rng.choice(r, 2 * n, replace=False) for _ in range(cells)]

        def verdict(slow: dict) -> paired.PairedVerdict:
            return paired.paired_logs({c: (noise[c][:n], noise[c][n:] + math.log1p(slow.get(c, 0.0)))
                                       for c in range(cells)}, ALPHA)

        aa = verdict({})
        alarms = [c.verdict in ("faster", "slower") for c in aa.cells]
        out["fa_cell"] += alarms
        out["fa_comparison"].append(any(alarms) or aa.launch.verdict != "no change")
        target = i % cells
        one = verdict({target: -0.01})
        out["power_one_cell"].append(one.cells[target].verdict == "slower")
        out["power_every_cell"].append(verdict({c: -0.01 for c in range(cells)}).launch.verdict == "slower")
        out["detectable_cell"].append(np.median([c.smallest_detectable for c in aa.cells]))
        out["detectable_launch"].append(aa.launch.smallest_detectable)
    return {**{k: (float(np.median(v)) if k.startswith("detectable") else _rate(v)) for k, v in out.items()},
            "cells": cells}
