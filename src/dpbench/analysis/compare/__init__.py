"""Regression check between two result sets (e.g. the same benchmark on two PyTorch versions).

    python -m dpbench.compare_cli --results-dir results --baseline A --candidate B \\
        [--fail-on-regression] [--fail-on new-warnings,diverged-curves]

writes results/compare/A_vs_B.{md,json}. Every row of the report carries a `severity`:
"regression", "finding" (a human should look) or "info".

Exit status: 0 when the comparison ran (whatever it found), 1 only when something of a kind
named by --fail-on was found (--fail-on-regression is --fail-on regressions), 2 when an input
is missing or damaged, with one line naming the file (and column). A broken input is never 1,
so a nightly job cannot read it as "regression found".

A change counts only beyond the noise measured for it:

- Throughput, per cell, one rate (the workload's unit) per ok repeat:
      change = geometric mean(candidate) / geometric mean(baseline) - 1
      |change| <= max(threshold, noise_floor)                   -> "no change"
      |change| <= k_spread x pooled CV of the repeats, or
        Welch's p on log images/s (Holm over all cells) >= alpha -> "too noisy to tell"
      otherwise                                                 -> "regression" / "improvement"
  (report format 1, reports without `format`: medians and Welch on raw values.)
  The repeats of one launch do not see the shift between two launches (another day, another
  boot, another neighbour on the node); the noise floor stands for it. With A/A launches
  (--noise-from, dpbench.analysis.noise) that floor is learned instead: the comparison's common shift
  must exceed what launches of the same code showed, or a cell must depart from the other cells
  by more than cells did there; Welch's test is then reported but not needed. Two environments
  in one launch are compared by compare.paired instead (no launch shift enters).
- Loss curves: deterministic runs with the same seed, config, software and hardware must be
  bit-identical; the first differing step is reported, a finding when the software changed and
  a regression when nothing did. After a software change their bits may move, but the curve
  must still pass the curve test; a step missing or not finite on one side is a divergence.
  Otherwise the curve test (compare.curves): each run's mean loss after the first tenth, a
  pooled t-test between sides, Holm over cells; fewer than two runs a side: noise unknown. Where
  both sides' runs carry seeds and two or more match (format 3), seed-paired instead: the mean
  of the seed-matched differences, its noise from the A/A launches' seed-matched differences
  (the candidate left out) or else from the differences themselves. The
  per-step band of the baseline's spread is reported as a picture, not a verdict.
- Final accuracy: Welch's test over repeats, Holm-adjusted over cells.

Every aspect matches cells by the cell_id the sets' plans gave them where every set compared
carries it (runs.csv), else by (variant, gpus, options label) (loading.key_cells); a row shows
the cell's variant, gpus and options either way.

The command line is dpbench.compare_cli, the markdown dpbench.report.compare_report; this
package is numbers and verdicts only: loading, stats, throughput, loss, aspects, provenance,
verdict, thresholds. The report's `sets` says when the two sides are one result set (the same
folder, or identical records) and when they ran different experiments (other cells), with the
number of cells they share. Neither changes the exit status by itself, but between different
experiments the runs of a cell only one side has are "not in the other experiment" (info), not
runs missing in the candidate (a regression within one experiment).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dpbench.analysis.cells import cell_fields
from dpbench.analysis.compare.mechanisms import compare_mechanisms
from dpbench.analysis.compare.aspects import compare_accuracy, compare_memory, compare_status, compare_warnings
from dpbench.analysis.compare.loading import InputError, MissingInput, key_cells, load_set, shown
from dpbench.analysis.compare.loss import compare_loss, curves_of
from dpbench.analysis.compare.provenance import compare_provenance, compare_sets
from dpbench.analysis.compare.stats import envelope_check, exact_check, holm, pooled_cv, welch_p
from dpbench.analysis.compare.thresholds import FAIL_ON, Thresholds
from dpbench.analysis.compare.throughput import load_launch_noise, throughput_verdicts, compare_throughput
from dpbench.analysis.compare.verdict import exit_code, failing, verdict_of


# The rules a report was made by. 1 (reports without `format`): throughput change a ratio of
# medians, Welch on raw images/s. 2: the ratio of geometric means, Welch on log images/s; loss
# curves by the curve test. 3: the curve test seed-paired where both sides' runs carry seeds and
# two or more match (noise from the A/A launches' seed-matched differences where given). 4: the
# seed-paired test's standard error keeps a launch offset as one unit (A/A summaries split into
# launch offset and residual), not the seed-matched sd over sqrt(n). A committed report is
# remade by its own format's rules.
REPORT_FORMAT = 4


def compare(results_dir: Path | str, baseline: str, candidate: str,
            thresholds: Thresholds | None = None, noise_from: list[str] | None = None,
            report_format: int = REPORT_FORMAT, **overrides: float) -> dict[str, Any]:
    """The comparison as a JSON-ready dict; raises InputError when an input is missing or damaged.

    noise_from: tags of A/A launches (the same experiment launched more than once on the
    baseline's machine) to learn the launch-to-launch noise from, instead of the fixed floor."""
    th = dataclasses.replace(thresholds or Thresholds(), **overrides)
    base = load_set(results_dir, baseline, "baseline")
    cand = load_set(results_dir, candidate, "candidate")
    prov = compare_provenance(base, cand)
    # Each A/A launch read once, for the throughput's launch noise and the curves' pool alike.
    launches = {t: {baseline: base, candidate: cand}.get(t) or load_set(results_dir, t, "A/A launch")
                for t in dict.fromkeys(noise_from or [])}
    aa_sides = {t: s for t, s in launches.items() if t != candidate}
    key_cells(base, cand, *[s for s in launches.values() if s is not base and s is not cand])
    model, fitted = load_launch_noise(results_dir, noise_from, base, launches) if noise_from else (None, {})
    throughput, judged = compare_throughput(base, cand, th, model, fitted.get("fitted_cells"), report_format)
    sets = compare_sets(results_dir, baseline, candidate, base, cand)
    noise_row = None if model is None else {
        **model.to_dict(), **fitted, **{k: v for k, v in (judged or {}).items() if k != "cells"}}
    return assemble(baseline, candidate, base, cand, th, sets, prov,
                    [{**cell_fields(shown(k, base, cand)), **v.to_dict()} for k, v in throughput.items()], noise_row,
                    aa_curves=_aa_curves(aa_sides, baseline), aa_sides=list(aa_sides.values()),
                    report_format=report_format, noise_from=list(dict.fromkeys(noise_from or [])),
                    **({"noise_unfitted": fitted["unfitted"]} if "unfitted" in fitted else {}))


def throughput_unit(base: dict, cand: dict) -> str:
    """The unit the throughput rows are in: the workloads' (images/s, tokens/s), or, where the
    sets mix workloads of different units, each cell its own."""
    units = set()
    for side in (base, cand):
        units |= set(side["tables"]["ok_summary"].get("rate_unit", pd.Series(["images/s"])).dropna())
    return units.pop() if len(units) == 1 else "each workload's unit"


def assemble(baseline: str, candidate: str, base: dict, cand: dict, th: Thresholds, sets: dict,
             prov: dict, throughput: list[dict], noise_row: dict | None, aa_curves: dict | None = None,
             report_format: int = REPORT_FORMAT, aa_sides: list[dict] | None = None,
             **extra: Any) -> dict[str, Any]:
    """The report of two loaded sides, every aspect compared the same way whichever design
    judged their throughput (two launches, or one paired launch: `extra` says which). aa_curves:
    the A/A launches' curves for the curve test's pool (_aa_curves); aa_sides: the loaded A/A
    launches (the candidate left out) for the seed-paired test's noise."""
    report: dict[str, Any] = {
        "baseline": baseline, "candidate": candidate, "format": report_format, **extra,
        "thresholds": dataclasses.asdict(th),
        "runs": {"baseline": len(base["tables"]["summary"]), "candidate": len(cand["tables"]["summary"])},
        "sets": sets,
        "provenance": prov,
        "status": [asdict(r) for r in compare_status(base, cand, sets)],
        "noise": noise_row,
        "throughput": throughput,
        "throughput_unit": throughput_unit(base, cand),
        "memory": [asdict(r) for r in compare_memory(base, cand, th)],
        "warnings": {kind: [asdict(r) for r in rows] for kind, rows in compare_warnings(base, cand).items()},
        "loss": compare_loss(base, cand, th, prov, aa_curves, aa_sides, seed_paired=report_format >= 3,
                             offset_once=report_format >= 4),
        "accuracy": [asdict(r) for r in compare_accuracy(base, cand, th)],
        "mechanisms": [asdict(r) for r in compare_mechanisms(base, cand)],
    }
    report["verdict"] = asdict(verdict_of(report))
    return _finite(report)


def _aa_curves(aa_sides: dict[str, dict], baseline: str) -> dict | None:
    """cell -> the A/A launches' curves (repeat -> Series each), for the unpaired test's pool; the
    compared sets themselves are left out, their runs are in the pool already."""
    out: dict = {}
    for tag, side in aa_sides.items():
        if tag == baseline:
            continue
        for cell, runs in curves_of(side["tables"]["steps"]).items():
            out.setdefault(cell, []).append(runs)
    return out or None


def _finite(obj: Any) -> Any:
    """NaN/inf are not JSON; the json twin and compare() return the same, clean, object."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, np.generic):
        return _finite(obj.item())
    return obj


__all__ = ["FAIL_ON", "REPORT_FORMAT", "assemble", "InputError", "MissingInput", "Thresholds", "compare", "envelope_check",
           "exact_check", "exit_code", "failing", "holm", "load_set", "pooled_cv", "throughput_verdicts",
           "welch_p"]
