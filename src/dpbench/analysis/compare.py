"""Regression check between two result sets (e.g. the same benchmark on two PyTorch versions).

    python -m dpbench.analysis.compare --results-dir results --baseline A --candidate B \\
        [--fail-on-regression] [--fail-on new-warnings,diverged-curves]

writes results/compare/A_vs_B.{md,json}. Every row of the report carries a `severity`:
"regression", "finding" (a human should look) or "info".

Exit status: 0 when the comparison ran (whatever it found), 1 only when something of a kind
named by --fail-on was found (--fail-on-regression is --fail-on regressions), 2 when an input
is missing or damaged, with one line naming the file (and column). A broken input is never 1,
so a nightly job cannot read it as "regression found".

A change counts only beyond the noise measured for it:

- Throughput, per (variant, gpus, options) cell, one images_per_s per ok repeat:
      change = median(candidate) / median(baseline) - 1
      |change| <= max(threshold, noise_floor)                   -> "no change"
      |change| <= k_spread x pooled CV of the repeats, or
        Welch's p (Holm-adjusted over all cells) >= alpha       -> "too noisy to tell"
      otherwise                                                 -> "regression" / "improvement"
  The repeats of one launch do not see the shift between two launches (another day, another
  boot, another neighbour on the node); the noise floor stands for it. With A/A launches
  (--noise-from, dpbench.analysis.noise) that floor is learned instead: the comparison's common shift
  must exceed what launches of the same code showed, or a cell must depart from the other cells
  by more than cells did there; Welch's test is then reported but not needed.
- Loss curves: deterministic runs with the same seed, config, software and hardware must be
  bit-identical; the first differing step is reported, a finding when the software changed and
  a regression when nothing did. After a software change their bits may move, but the curve
  must still pass the envelope check below; a step missing or not finite on one side is a
  divergence. Otherwise the candidate's mean curve is held against the
  baseline's repeat-to-repeat spread, step by step (a band of envelope_k standard errors, never
  narrower than loss_tolerance); the curve has diverged when more than envelope_fraction of the
  steps leave the band, or when the final loss differs by Welch's test (Holm over cells). With
  one distinct baseline curve the noise is unknown and no divergence is called.
- Final accuracy: Welch's test over repeats, Holm-adjusted over cells.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpbench import results as R
from dpbench.analysis import noise
from dpbench.report.markdown import md_table
from dpbench.results.errors import error_text

GROUP = ["variant", "gpus", "options"]
PROVENANCE_KEYS = ["torch", "torch_git", "cuda", "cudnn", "nccl", "driver", "gpu_names",
                   "python", "hostname", "device_type", "git_sha"]
HARDWARE_KEYS = ("gpu_names", "device_type", "hostname")
# What must match for deterministic runs to be bit-identical: the hostname need not.
EXACT_HARDWARE_KEYS = ("gpu_names", "device_type")
# Software whose change explains changed bits in deterministic runs (git_sha: dpbench's own code).
SOFTWARE_KEYS = ("torch", "torch_git", "cuda", "cudnn", "nccl", "driver", "git_sha")
# Config keys that cannot change a single bit of the training.
INERT_CONFIG_KEYS = {"data_root", "download", "log_every", "save_checkpoint"}
HARDWARE_WARNING = "hardware differs ({keys}): timings are not comparable"

FAIL_ON = ("regressions", "new-warnings", "diverged-curves", "findings")


@dataclass(frozen=True)
class Thresholds:
    """Every knob of the comparison, with its default: the one source (schema.yaml mirrors it)."""

    # About what a user would act on. Without A/A data the noise floor below decides; with it
    # (--noise-from) a cell's own departure from the other cells is resolved to ~0.5% on
    # one H200, so this is what then stops verdicts on changes nobody would act on.
    threshold: float = 0.02
    """Smallest relative throughput change worth a verdict."""
    # Day-to-day noise between launches, which repeats of one launch cannot see: on 2x H200 the
    # same cells rerun a day later moved by +0.4%, +0.6% and +4.1% while repeats within each
    # launch agreed far closer (single GPU: 0.04%). 5% sits above the largest such shift.
    noise_floor: float = 0.05
    """Relative throughput change that two launches of the same code can show (A/A)."""
    # 3 vs 3 repeats: the relative SE of a difference of means is about 0.8 CV, so 2 CV ~ 2.5 SE.
    k_spread: float = 2.0
    """A throughput change must also exceed this many pooled coefficients of variation."""
    alpha: float = 0.05
    """Family-wise error rate per aspect (Holm over the cells)."""
    mem_threshold_mib: float = 64.0
    mem_threshold_pct: float = 5.0
    loss_tolerance: float = 1e-3
    """Absolute loss difference that never counts (the narrowest curve band)."""
    # Simulated A/A pairs of 3 vs 3 repeats, modelled on the 2x H200 reference's repeats (a
    # per-run level that persists over the whole run, as chaotic early training leaves, plus
    # per-step noise; or a slow random drift) leave a 3 SE band on more than 30% of the steps in
    # at most ~4% of the pairs; a shift of 3 run-to-run sd is found in 86-99% of them.
    envelope_k: float = 3.0
    """Half-width of the per-step band in standard errors of the difference of mean curves."""
    envelope_fraction: float = 0.3
    """Share of the steps outside the band that calls a curve diverged."""


# The baseline's variance per step is averaged over a window of neighbouring steps (a tenth of
# the curve, at least 9): the variance of 2-3 repeats at one step is itself very noisy, and the
# differences between GPU repeats decorrelate within a few steps (lag-20 autocorrelation ~0 in
# the 2x H200 reference), so neighbours are nearly independent draws of the same spread.
ENVELOPE_WINDOW = (9, 0.1)


class InputError(Exception):
    """An input is missing or damaged; the message names the file (and column)."""


class MissingInput(InputError, FileNotFoundError):
    """An input result set (folder, table or provenance.json) is not there."""


# -- statistics --------------------------------------------------------------------------

def welch_p(x: np.ndarray, y: np.ndarray) -> float | None:
    """Two-sided p of Welch's t-test on the means (None with fewer than 2 values a side)."""
    from scipy import stats

    x, y = np.asarray(x, float), np.asarray(y, float)
    if min(len(x), len(y)) < 2:
        return None
    if x.var(ddof=1) == 0.0 and y.var(ddof=1) == 0.0:  # identical repeats resolve any difference
        return 0.0 if x.mean() != y.mean() else 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-identical samples: precision note
        return float(stats.ttest_ind(x, y, equal_var=False).pvalue)


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm's step-down adjustment (family-wise error); None entries are not tests."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    out = list(pvalues)
    if not idx:
        return out
    p = np.array([pvalues[i] for i in idx], float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    for rank, j in enumerate(order):
        out[idx[j]] = float(adjusted[rank])
    return out


def pooled_cv(x: np.ndarray, y: np.ndarray) -> float:
    cvs = [(v.std(ddof=1) / v.mean()) ** 2 * (len(v) - 1) for v in (x, y)]
    return math.sqrt(sum(cvs) / (len(x) + len(y) - 2))


# -- loading (every failure names its file and column) -----------------------------------

# The columns compare reads from each table; numeric ones must hold numbers (or nothing).
COLUMNS = {
    "summary": (["run_id", *GROUP, "repeat", "status", "reason", "device_type"],
                ["gpus", "repeat", "images_per_s", "final_loss", "test_acc"]),
    "memory": (["run_id", *GROUP, "device"], ["gpus", "device", "allocated_mib"]),
    "warnings": (["run_id", *GROUP, "category", "message"], ["gpus", "count"]),
    "steps": (["run_id", *GROUP, "repeat", "epoch", "step"], ["gpus", "repeat", "epoch", "step", "loss_global"]),
}

def _read_table(root: Path | str, tag: str, name: str):
    text, numeric = COLUMNS[name]
    try:
        return R.read_table(root, tag, name, require=text + numeric)
    except R.TableError as exc:
        raise InputError(str(exc)) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _read_json(path: Path, what: str) -> dict:
    try:
        obj = R.read_json(path)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno})") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise InputError(f"{path} cannot be read ({_first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path} is not a JSON object ({what} expected)")
    return obj


def _records(root: Path | str, tag: str) -> dict[str, R.RunRecord]:
    """Per finished run, its record (RunRecord supplies the defaults of older records)."""
    out: dict[str, R.RunRecord] = {}
    folder = R.runs_dir(root, tag)
    if not folder.is_dir():
        return out
    for rdir in sorted(p for p in folder.iterdir() if p.is_dir()):
        path = rdir / R.METRICS
        if not path.exists():
            continue  # unfinished run: metrics.json is written last
        data = _read_json(path, "a run record")
        try:
            rec = R.RunRecord.from_json(data)
        except (ValueError, TypeError, AttributeError) as exc:   # e.g. a config that is no object
            raise InputError(f"{path} is not a readable run record ({error_text(exc)})") from None
        out[str(rec.run_id)] = rec
    return out


def load_set(root: Path | str, tag: str, role: str) -> dict[str, Any]:
    folder = R.tag_dir(root, tag)
    if not folder.is_dir():
        raise MissingInput(f"{role} result set {tag!r} not found: folder {folder} does not exist")
    prov_path = R.provenance_path(root, tag)
    paths = [R.table_path(root, tag, n) for n in COLUMNS] + [prov_path]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise MissingInput(f"{role} result set {tag!r} is incomplete, missing: {', '.join(missing)}")
    tables = {n: _read_table(root, tag, n) for n in COLUMNS}
    summary = tables["summary"]
    if summary.empty:
        raise InputError(f"{R.table_path(root, tag, 'summary')} has a header but no runs")
    # Memory, warnings and curves of runs that did not finish are partial: status reports those.
    ok_ids = set(summary.loc[summary["status"] == R.STATUS_OK, "run_id"])
    for name in ("memory", "warnings", "steps"):
        tables[name] = tables[name][tables[name]["run_id"].isin(ok_ids)]
    tables["ok_summary"] = summary[summary["run_id"].isin(ok_ids)]
    return {"tables": tables, "provenance": _read_json(prov_path, "the result set's provenance"),
            "records": _records(root, tag)}


def _group(key: tuple) -> dict[str, Any]:
    return {"variant": str(key[0]), "gpus": int(key[1]), "options": str(key[2])}


def _ok_values(summary, column: str) -> dict[tuple, np.ndarray]:
    ok = summary[(summary["status"] == R.STATUS_OK) & summary[column].notna()]
    return {k: g[column].to_numpy(float) for k, g in ok.groupby(GROUP)}


# -- throughput --------------------------------------------------------------------------

def _change(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.median(y) / np.median(x) - 1.0)


def throughput_verdicts(cells: dict[Any, tuple[np.ndarray, np.ndarray]], th: Thresholds,
                        launch_noise: noise.LaunchNoise | None = None) -> tuple[dict[Any, dict], dict | None]:
    """Verdict per cell from (baseline, candidate) images/s, and the launch-noise judgement of
    the comparison as a whole (None without A/A data); Holm runs over all tested cells."""
    keys = list(cells)
    raw = [welch_p(*cells[k]) for k in keys]
    adjusted = holm(raw)
    judged = (noise.verdicts({k: _change(*cells[k]) for k in keys}, launch_noise, th.alpha)
              if launch_noise is not None else None)
    out = {k: _throughput_verdict(*cells[k], p, q, th, judged and {**judged, **judged["cells"][k]})
           for k, p, q in zip(keys, raw, adjusted)}
    return out, judged


def _signs_agree(a: float, b: float) -> bool:
    return a * b > 0


def _throughput_verdict(x: np.ndarray, y: np.ndarray, p: float | None, p_holm: float | None,
                        th: Thresholds, launch: dict | None = None) -> dict[str, Any]:
    x, y = np.asarray(x, float), np.asarray(y, float)
    change = _change(x, y)
    no_change = max(th.threshold, th.noise_floor)
    row: dict[str, Any] = {"n_baseline": len(x), "n_candidate": len(y),
                           "median_baseline": float(np.median(x)),
                           "median_candidate": float(np.median(y)), "change": change,
                           "pooled_cv": None, "floor": no_change, "p_value": p, "p_holm": p_holm,
                           "note": ""}
    if launch is not None:
        verdict = _launch_noise_verdict(row, x, y, th, launch)
    elif p is None:
        verdict = "no change" if abs(change) <= no_change else "too noisy to tell"
        row["note"] = "single repeat: spread unknown, no significance test"
    else:
        row["pooled_cv"] = pooled_cv(x, y)
        row["floor"] = max(no_change, th.k_spread * row["pooled_cv"])
        if abs(change) <= no_change:
            verdict = "no change"
            if th.threshold < abs(change):
                row["note"] = "within the noise floor between launches"
        elif abs(change) <= row["floor"]:
            verdict, row["note"] = "too noisy to tell", "inside the repeats' own spread"
        elif p_holm >= th.alpha:
            verdict, row["note"] = "too noisy to tell", "not significant after Holm's correction"
        else:
            verdict = "regression" if change < 0 else "improvement"
    severity = {"regression": "regression", "too noisy to tell": "finding"}.get(verdict, "info")
    return {**row, "verdict": verdict, "severity": severity}


def _launch_noise_verdict(row: dict, x: np.ndarray, y: np.ndarray, th: Thresholds, launch: dict) -> str:
    """The verdict against noise learned from A/A launches (dpbench.analysis.noise): a change counts when
    the whole comparison shifted beyond what launches of the same code do, or when this cell
    departs from the other cells by more than cells did between those launches."""
    change = row["change"]
    row["departure"], row["floor"] = launch["departure"], launch["cell_floor"]
    if min(len(x), len(y)) > 1:
        row["pooled_cv"] = pooled_cv(x, y)
    if abs(change) <= th.threshold:
        return "no change"
    if row["pooled_cv"] is not None and abs(change) <= th.k_spread * row["pooled_cv"]:
        row["note"] = "inside the repeats' own spread"
        return "too noisy to tell"
    departs = f"departs from the other cells by {100 * launch['departure']:+.1f}%"
    if launch["departure_beyond"] and _signs_agree(launch["departure"], change):
        row["note"] = departs
    elif launch["shift_beyond"] and _signs_agree(launch["shift"], change):
        row["note"] = "the common shift is beyond the launch-to-launch noise"
    else:
        row["note"] = (f"{departs}, the other way from its own change; the rest is launch noise"
                       if launch["departure_beyond"] else "within the launch-to-launch noise (A/A)")
        return "no change"
    return "regression" if change < 0 else "improvement"


def compare_throughput(base: dict, cand: dict, th: Thresholds, launch_noise: noise.LaunchNoise | None = None,
                       fitted: list[dict] | None = None) -> tuple[list[dict], dict | None]:
    a = _ok_values(base["tables"]["summary"], "images_per_s")
    b = _ok_values(cand["tables"]["summary"], "images_per_s")
    verdicts, judged = throughput_verdicts({k: (a[k], b[k]) for k in sorted(a.keys() & b.keys())}, th,
                                           launch_noise)
    rows = [{**_group(k), **v} for k, v in verdicts.items()]
    if launch_noise is not None:
        # The pooled wobble may not hold for a cell the A/A launches never ran (or not in all).
        for r in rows:
            if _group((r["variant"], r["gpus"], r["options"])) not in (fitted or []):
                r["note"] = "; ".join(filter(None, [r["note"], "not in every A/A launch"]))
    return rows, judged


# -- launch noise from A/A launches ------------------------------------------------------

def _comparable(key: str, value: Any) -> str:
    """A provenance value as compared between launches; a commit by its first 7 hex digits, so a
    short and a full sha of one commit agree."""
    if key == "git_sha" and isinstance(value, str):
        return value[:7]
    return json.dumps(value, sort_keys=True)


def load_launch_noise(root: Path | str, tags: list[str], baseline: dict) -> tuple[noise.LaunchNoise, dict]:
    """The launch-noise model from result sets of the same experiment launched several times;
    InputError when they cannot give one or were made on other hardware than the baseline."""
    tags = list(dict.fromkeys(tags))
    if len(tags) < 2:
        raise InputError(f"--noise-from needs at least 2 launches of the same experiment (A/A), got "
                         f"{len(tags)}: {', '.join(tags) or 'none'}")
    sets = {t: load_set(root, t, "A/A launch") for t in tags}
    for t, s in sets.items():
        for k in EXACT_HARDWARE_KEYS:
            if _prov_value(s, k) != _prov_value(baseline, k):
                raise InputError(f"A/A launch {t!r} ran on other hardware than the baseline ({k}: "
                                 f"{_prov_value(s, k)} vs {_prov_value(baseline, k)}); its noise says "
                                 f"nothing here: pass launches made on the baseline's machine")
    medians = {t: {k: float(np.median(v)) for k, v in _ok_values(s["tables"]["summary"], "images_per_s").items()}
               for t, s in sets.items()}
    cells = sorted(set.intersection(*(set(m) for m in medians.values())))
    try:
        model = noise.fit(np.log([[medians[t][c] for t in tags] for c in cells]).reshape(len(cells), len(tags)),
                          tags)
    except noise.NotEnoughLaunches as exc:
        raise InputError(str(exc)) from None
    differs = [k for k in SOFTWARE_KEYS if len({_comparable(k, _prov_value(s, k)) for s in sets.values()}) > 1]
    return model, {"fitted_cells": [_group(c) for c in cells], "software_differs": differs}


# -- memory, warnings --------------------------------------------------------------------

def compare_memory(base: dict, cand: dict, th: Thresholds) -> list[dict]:
    def peaks(rs: dict) -> dict[tuple, float]:
        mem = rs["tables"]["memory"]
        return mem[mem["allocated_mib"].notna()].groupby(GROUP + ["device"])["allocated_mib"].max().to_dict()

    a, b = peaks(base), peaks(cand)
    rows = []
    for k in sorted(a.keys() & b.keys()):
        delta = float(b[k] - a[k])
        rel = 100.0 * delta / a[k] if a[k] > 0 else math.inf
        # Both limits must be exceeded: small absolute noise on small tensors is not a regression.
        mib, pct = th.mem_threshold_mib, th.mem_threshold_pct
        verdict = ("regression" if delta > mib and rel > pct else
                   "improvement" if -delta > mib and -rel > pct else "no change")
        rows.append({**_group(k), "device": int(k[3]), "baseline_mib": float(a[k]),
                     "candidate_mib": float(b[k]), "delta_mib": delta, "delta_pct": rel,
                     "verdict": verdict, "severity": "regression" if verdict == "regression" else "info"})
    return rows


def compare_warnings(base: dict, cand: dict) -> dict[str, list[dict]]:
    runs_a = base["tables"]["ok_summary"].groupby(GROUP).size().to_dict()
    runs_b = cand["tables"]["ok_summary"].groupby(GROUP).size().to_dict()
    shared = runs_a.keys() & runs_b.keys()  # a missing group is reported under status, not here

    def per_run(rs: dict, runs: dict) -> dict[tuple, float]:
        w = rs["tables"]["warnings"]
        totals = w[w["count"].notna()].groupby(GROUP + ["category", "message"])["count"].sum()
        return {k: float(v) / runs[k[:3]] for k, v in totals.items() if k[:3] in shared}

    a, b = per_run(base, runs_a), per_run(cand, runs_b)

    def row(k: tuple, severity: str) -> dict:
        return {**_group(k), "category": k[3], "message": k[4], "count_per_run_baseline": a.get(k),
                "count_per_run_candidate": b.get(k), "severity": severity}

    return {"new": [row(k, "finding") for k in sorted(b.keys() - a.keys())],
            "vanished": [row(k, "info") for k in sorted(a.keys() - b.keys())],
            "changed": [row(k, "info") for k in sorted(a.keys() & b.keys()) if not math.isclose(a[k], b[k])]}


# -- loss curves -------------------------------------------------------------------------

def _curves(steps) -> dict[tuple, dict[int, Any]]:
    """(variant, gpus, options) -> repeat -> loss_global as a Series indexed by (epoch, step)."""
    import pandas as pd

    out: dict[tuple, dict[int, Any]] = {}
    for (*key, repeat), g in steps.groupby(GROUP + ["repeat"]):
        index = pd.MultiIndex.from_arrays([g["epoch"].to_numpy(int), g["step"].to_numpy(int)],
                                          names=["epoch", "step"])
        out.setdefault(tuple(key), {})[int(repeat)] = pd.Series(
            g["loss_global"].to_numpy(float), index=index).sort_index()
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a == b) | (np.isnan(a) & np.isnan(b))


def exact_check(pairs: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """Bitwise comparison of paired curves (repeat -> (baseline, candidate) Series)."""
    first, worst, n = None, 0.0, 0
    for repeat, (b, c) in sorted(pairs.items()):
        both = b.index.union(c.index)
        bv, cv = b.reindex(both).to_numpy(float), c.reindex(both).to_numpy(float)
        n += len(both)
        # A step that one side has and the other lacks is a difference too.
        same = _same_bits(bv, cv) & both.isin(b.index) & both.isin(c.index)
        if same.all():
            continue
        i = int(np.flatnonzero(~same)[0])
        with np.errstate(invalid="ignore"):
            d = np.abs(cv - bv)
        d = np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))
        worst = max(worst, float(d.max()))
        at = (int(both[i][0]), int(both[i][1]))
        if first is None or at < first["at"]:
            first = {"at": at, "repeat": repeat, "diff": float(d[i])}
    return {"steps_matched": n, "first": first, "max_abs_diff": worst}


def _rolling_mean(v: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(v) < 2:
        return v
    k = np.ones(min(window, len(v)))
    return np.convolve(v, k, "same") / np.convolve(np.ones_like(v), k, "same")


def envelope_check(base: np.ndarray, cand: np.ndarray, th: Thresholds) -> dict[str, Any]:
    """The candidate's mean curve against the baseline's spread (arrays: repeats x steps)."""
    base, cand = np.atleast_2d(np.asarray(base, float)), np.atleast_2d(np.asarray(cand, float))
    fin_b, fin_c = np.isfinite(base).all(0), np.isfinite(cand).all(0)
    out: dict[str, Any] = {"steps_matched": int(base.shape[1]), "outside_fraction": None,
                           "max_abs_diff": None, "at_index": None, "first_outside": None,
                           "distinct_baseline_curves": 0}
    one_sided = fin_b != fin_c
    if one_sided.any():
        i = int(np.flatnonzero(one_sided)[0])
        return {**out, "max_abs_diff": math.inf, "at_index": i, "first_outside": i,
                "verdict": "diverged", "note": "loss not finite on one side"}
    keep = fin_b & fin_c  # steps where both sides blew up alike carry no signal
    base, cand = base[:, keep], cand[:, keep]
    index = np.flatnonzero(keep)
    if base.shape[1] == 0:
        return {**out, "verdict": "noise unknown", "note": "no finite step in common"}
    diff = cand.mean(0) - base.mean(0)
    j = int(np.argmax(np.abs(diff)))
    out.update(max_abs_diff=float(abs(diff[j])), at_index=int(index[j]),
               distinct_baseline_curves=len({row.tobytes() for row in base}))
    if out["distinct_baseline_curves"] < 2:
        note = ("one baseline repeat" if len(base) < 2 else "the baseline repeats are identical")
        return {**out, "verdict": "noise unknown",
                "note": f"{note}: the noise is unknown, no divergence called"}
    n_b, n_c = len(base), len(cand)
    var = _rolling_mean(base.var(0, ddof=1), max(ENVELOPE_WINDOW[0], int(ENVELOPE_WINDOW[1] * base.shape[1])))
    half = np.maximum(th.envelope_k * np.sqrt(var * (1.0 / n_b + 1.0 / n_c)), th.loss_tolerance)
    outside = np.abs(diff) > half
    out["outside_fraction"] = float(outside.mean())
    out["first_outside"] = int(index[np.flatnonzero(outside)[0]]) if outside.any() else None
    diverged = out["outside_fraction"] > th.envelope_fraction
    # Two runs say little about how far a run's whole level can wander (same seed or not).
    note = "two baseline repeats: the spread is poorly known" if n_b == 2 else ""
    return {**out, "verdict": "diverged" if diverged else "within noise", "note": note}


def _mode(base: dict, cand: dict, rids: list[str], hardware_same: bool) -> tuple[bool, str]:
    """Whether the group's curves must be bit-identical, and if not, why not."""
    ra, rb = base["records"], cand["records"]
    if not rids or any(r not in ra or r not in rb for r in rids):
        return False, "no run records to check determinism"
    if not all(ra[r].deterministic and rb[r].deterministic for r in rids):
        return False, "not deterministic on both sides"
    if any(ra[r].seed != rb[r].seed for r in rids):
        return False, "seeds differ"
    diffs = sorted(k for r in rids for k in _config_diff(ra[r].config, rb[r].config))
    if diffs:
        return False, f"config differs ({', '.join(dict.fromkeys(diffs))})"
    if not hardware_same:
        return False, "hardware differs"
    return True, ""


def _config_diff(a: dict, b: dict) -> list[str]:
    fa, fb = _flatten(a), _flatten(b)
    return [k for k in sorted(fa.keys() | fb.keys())
            if k.split(".")[0] not in INERT_CONFIG_KEYS and fa.get(k) != fb.get(k)]


def compare_loss(base: dict, cand: dict, th: Thresholds, prov: dict) -> list[dict]:
    sa, sb = base["tables"]["steps"], cand["tables"]["steps"]
    curves_a, curves_b = _curves(sa), _curves(sb)
    keys = sorted(curves_a.keys() & curves_b.keys())
    ids = sa.drop_duplicates(GROUP + ["repeat"])
    run_of = {(v, int(g), o, int(r)): str(rid) for v, g, o, r, rid in
              zip(ids["variant"], ids["gpus"], ids["options"], ids["repeat"], ids["run_id"])}
    hardware_same = not any(prov["keys"][k]["differs"] for k in EXACT_HARDWARE_KEYS)
    software = [k for k in SOFTWARE_KEYS if prov["keys"][k]["differs"]]
    fa = _ok_values(base["tables"]["summary"], "final_loss")
    fb = _ok_values(cand["tables"]["summary"], "final_loss")
    raw = [welch_p(fa[k], fb[k]) if k in fa and k in fb else None for k in keys]
    adjusted = holm(raw)
    rows = []
    for key, p, q in zip(keys, raw, adjusted):
        ca, cb = curves_a[key], curves_b[key]
        rids = [run_of[(*key, r)] for r in sorted(set(ca) & set(cb))]
        exact, why = _mode(base, cand, rids, hardware_same)
        row: dict[str, Any] = {**_group(key), "mode": "exact" if exact else "envelope",
                               "repeats": f"{len(ca)}/{len(cb)}", "final_loss_p": p, "final_loss_p_holm": q,
                               "why_not_exact": why}
        final_differs = (q is not None and q < th.alpha
                         and abs(float(np.mean(fb[key]) - np.mean(fa[key]))) > th.loss_tolerance)
        if exact:
            chk = exact_check({r: (ca[r], cb[r]) for r in sorted(set(ca) & set(cb))})
            first = chk["first"]
            row.update(steps_matched=chk["steps_matched"], max_abs_diff=chk["max_abs_diff"],
                       outside_fraction=None, first_outside=None,
                       first_diff=None if first is None else
                       {"repeat": first["repeat"], "epoch": first["at"][0], "step": first["at"][1],
                        "abs_diff": first["diff"]})
            if first is None:
                row.update(verdict="identical", severity="info", note="bit-identical")
                rows.append(row)
                continue
            # Changed bits are expected after a software change, and are a regression otherwise.
            severity = "finding" if software else "regression"
            note = (f"expected after a software change ({', '.join(software)})" if software else
                    "not reproducible: same seed, config, software and hardware")
            if math.isinf(chk["max_abs_diff"]):
                row.update(verdict="diverged", severity=severity,
                           note="loss missing or not finite on one side")
            elif software:
                # New software may move the bits, not the curve: it must stay within the noise.
                env = _judged_envelope(ca, cb, th, final_differs)
                row.update(outside_fraction=env["outside_fraction"], first_outside=env["first_outside"],
                           distinct_baseline_curves=env["distinct_baseline_curves"])
                diverged = env["verdict"] == "diverged"
                row.update(verdict="diverged" if diverged else "bits changed", severity=severity,
                           note="; ".join(filter(None, [note, env["note"] if diverged else ""])))
            else:
                row.update(verdict="bits changed", severity=severity, note=note)
            rows.append(row)
            continue
        if set(ca) == set(cb) and exact_check({r: (ca[r], cb[r]) for r in ca})["first"] is None:
            # Same bits without the promise (e.g. CPU runs recorded before the deterministic
            # flag existed): nothing to judge against the noise.
            row.update(steps_matched=sum(len(c) for c in cb.values()), max_abs_diff=0.0,
                       outside_fraction=0.0, verdict="identical", severity="info",
                       note="bit-identical", at=None, first_outside=None)
            rows.append(row)
            continue
        env = _judged_envelope(ca, cb, th, final_differs)
        row.update({k: env[k] for k in ("steps_matched", "max_abs_diff", "outside_fraction",
                                         "distinct_baseline_curves", "verdict", "note", "at",
                                         "first_outside")})
        row["severity"] = "finding" if row["verdict"] == "diverged" else "info"
        rows.append(row)
    return rows


def _judged_envelope(ca: dict, cb: dict, th: Thresholds, final_differs: bool) -> dict[str, Any]:
    """The envelope check, with a final loss that differs (Welch, Holm) as a divergence too."""
    env = _envelope_of(ca, cb, th)
    if final_differs and env["verdict"] != "noise unknown":
        env = {**env, "verdict": "diverged",
               "note": "; ".join(filter(None, [env["note"], "final loss differs (Welch, Holm)"]))}
    return env


def _envelope_of(ca: dict, cb: dict, th: Thresholds) -> dict[str, Any]:
    # The steps every repeat of both sides reached (a written NaN loss stays and counts).
    steps = None
    for s in [*ca.values(), *cb.values()]:
        steps = s.index if steps is None else steps.intersection(s.index)
    if not ca or not cb or steps is None or len(steps) == 0:
        return {"steps_matched": 0, "max_abs_diff": None, "outside_fraction": None,
                "distinct_baseline_curves": len(ca), "verdict": "noise unknown",
                "note": "no step in common", "at": None, "first_outside": None}
    steps = steps.sort_values()
    env = envelope_check(np.array([ca[r].reindex(steps).to_numpy(float) for r in sorted(ca)]),
                         np.array([cb[r].reindex(steps).to_numpy(float) for r in sorted(cb)]), th)

    def at(i: int | None):
        return None if i is None else {"epoch": int(steps[i][0]), "step": int(steps[i][1])}

    return {**env, "at": at(env["at_index"]), "first_outside": at(env["first_outside"])}


def compare_accuracy(base: dict, cand: dict, th: Thresholds) -> list[dict]:
    a = _ok_values(base["tables"]["summary"], "test_acc")
    b = _ok_values(cand["tables"]["summary"], "test_acc")
    keys = sorted(a.keys() & b.keys())
    raw = [welch_p(a[k], b[k]) for k in keys]
    rows = []
    for k, p, q in zip(keys, raw, holm(raw)):
        change = float(100.0 * (np.mean(b[k]) - np.mean(a[k])))
        if q is None:
            verdict = "noise unknown" if change else "no change"
        else:
            verdict = "differs" if q < th.alpha else "no change"
        rows.append({**_group(k), "acc_baseline": float(np.mean(a[k])), "acc_candidate": float(np.mean(b[k])),
                     "change_pp": change, "p_value": p, "p_holm": q, "verdict": verdict,
                     "severity": "finding" if verdict == "differs" else "info"})
    return rows


# -- status, provenance ------------------------------------------------------------------

def _status_change(before: str | None, after: str | None) -> tuple[str | None, str]:
    if after is None:
        return "missing in candidate", "regression"
    if before is None:
        return "new in candidate", "info"
    if before == after:
        return None, "info"
    if before == R.STATUS_OK:
        return f"ok → {after}", "regression"
    return (f"{before} → ok (fixed)" if after == R.STATUS_OK else f"{before} → {after}"), "info"


def compare_status(base: dict, cand: dict) -> list[dict]:
    a = base["tables"]["summary"].drop_duplicates("run_id").set_index("run_id").to_dict("index")
    b = cand["tables"]["summary"].drop_duplicates("run_id").set_index("run_id").to_dict("index")
    rows = []
    for rid in sorted(a.keys() | b.keys()):
        before, after = a.get(rid, {}).get("status"), b.get(rid, {}).get("status")
        change, severity = _status_change(before, after)
        if change is None:
            continue
        run = b.get(rid) or a[rid]
        reason = run["reason"] if isinstance(run["reason"], str) else ""
        rows.append({"run_id": rid, **_group((run["variant"], run["gpus"], run["options"])),
                     "repeat": int(run["repeat"]), "baseline": before, "candidate": after,
                     "change": change, "reason": reason, "severity": severity})
    return rows


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def compare_configs(a: dict, b: dict) -> dict[str, dict]:
    """Config keys that differ between runs with the same run_id, with the values on each side."""
    diffs: dict[str, dict[str, set]] = {}
    for rid in a.keys() & b.keys():
        fa, fb = _flatten(a[rid].config), _flatten(b[rid].config)
        for k in fa.keys() | fb.keys():
            va, vb = json.dumps(fa.get(k), sort_keys=True), json.dumps(fb.get(k), sort_keys=True)
            if va != vb:
                d = diffs.setdefault(k, {"baseline": set(), "candidate": set()})
                d["baseline"].add(va)
                d["candidate"].add(vb)
    return {k: {side: [json.loads(v) for v in sorted(vals)] for side, vals in d.items()}
            for k, d in sorted(diffs.items())}


def _prov_value(rs: dict, key: str) -> Any:
    """One value, the list of the values the runs disagree on, or None when absent."""
    if key == "gpu_names":
        # The visible GPUs vary with each run's gpus; the models are the hardware.
        return R.gpu_models(rs["provenance"])
    if key == "device_type":   # lives in the records, not provenance.json
        values = sorted(set(rs["tables"]["summary"]["device_type"].dropna().astype(str)) - {""})
    else:
        values = R.provenance_values(rs["provenance"], key)
    return None if not values else values[0] if len(values) == 1 else values


def compare_provenance(base: dict, cand: dict) -> dict[str, Any]:
    keys = {}
    for k in PROVENANCE_KEYS:
        va, vb = _prov_value(base, k), _prov_value(cand, k)
        keys[k] = {"baseline": va, "candidate": vb, "differs": va != vb}
    hardware = [k for k in HARDWARE_KEYS if keys[k]["differs"]]
    return {"keys": keys, "differs": [k for k, v in keys.items() if v["differs"]],
            "config_differs": compare_configs(base["records"], cand["records"]),
            "hardware_differs": bool(hardware),
            "warning": HARDWARE_WARNING.format(keys=", ".join(hardware)) if hardware else None,
            "severity": "finding" if hardware else "info"}


# -- report ------------------------------------------------------------------------------

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


def failing(report: dict) -> dict[str, int]:
    """How many findings of each --fail-on kind the report holds."""
    rows = [report["provenance"], *report["status"], *report["throughput"], *report["memory"],
            *[r for rs in report["warnings"].values() for r in rs], *report["loss"], *report["accuracy"]]
    return {"regressions": sum(r["severity"] == "regression" for r in rows),
            "new-warnings": len(report["warnings"]["new"]),
            # Changed bits are a divergence only where nothing explains them (severity regression).
            "diverged-curves": sum(r["verdict"] == "diverged"
                                   or (r["verdict"] == "bits changed" and r["severity"] == "regression")
                                   for r in report["loss"]),
            "findings": sum(r["severity"] != "info" for r in rows)}


def exit_code(report: dict, fail_on: list[str]) -> int:
    """1 when the report holds something of a kind in fail_on, else 0 (2 is for bad input)."""
    return int(any(report["verdict"]["counts"][k] for k in fail_on))


def compare(results_dir: Path | str, baseline: str, candidate: str,
            thresholds: Thresholds | None = None, noise_from: list[str] | None = None,
            **overrides: float) -> dict[str, Any]:
    """The comparison as a JSON-ready dict; raises InputError when an input is missing or damaged.

    noise_from: tags of A/A launches (the same experiment launched more than once on the
    baseline's machine) to learn the launch-to-launch noise from, instead of the fixed floor."""
    th = dataclasses.replace(thresholds or Thresholds(), **overrides)
    base = load_set(results_dir, baseline, "baseline")
    cand = load_set(results_dir, candidate, "candidate")
    prov = compare_provenance(base, cand)
    model, fitted = load_launch_noise(results_dir, noise_from, base) if noise_from else (None, {})
    throughput, judged = compare_throughput(base, cand, th, model, fitted.get("fitted_cells"))
    report: dict[str, Any] = {
        "baseline": baseline, "candidate": candidate,
        "thresholds": dataclasses.asdict(th),
        "runs": {"baseline": len(base["tables"]["summary"]), "candidate": len(cand["tables"]["summary"])},
        "provenance": prov,
        "status": compare_status(base, cand),
        "noise": None if model is None else {
            **model.to_dict(), **fitted, **{k: v for k, v in (judged or {}).items() if k != "cells"}},
        "throughput": throughput,
        "memory": compare_memory(base, cand, th),
        "warnings": compare_warnings(base, cand),
        "loss": compare_loss(base, cand, th, prov),
        "accuracy": compare_accuracy(base, cand, th),
    }
    counts = failing(report)
    n, m = counts["regressions"], counts["findings"] - counts["regressions"]
    report["verdict"] = {"regressions": n, "findings": m, "counts": counts,
                         "line": f"{_count(n, 'regression')}, {_count(m, 'finding')}" if n or m
                         else "no regression beyond noise"}
    return _finite(report)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


# -- markdown ----------------------------------------------------------------------------


def _signed(v: float | None, unit: str = "", scale: float = 1.0) -> str:
    return "–" if v is None else f"{scale * v:+.1f}{unit}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _run_group(r: dict) -> str:
    return f"{r['variant']} g{r['gpus']}" + (f" {r['options']}" if r["options"] else "")


def _mark(r: dict, text: str) -> str:
    """Bold what counts (regressions and findings) so it stands out in a long table."""
    return text if r["severity"] == "info" else f"**{text}**"


def _where(at: dict | None, repeat: int | None = None) -> str:
    if not at:
        return "–"
    return (f"r{repeat} " if repeat is not None else "") + f"epoch {at['epoch']}, step {at['step']}"


def _provenance_md(p: dict) -> list[str]:
    out = [f"> **WARNING: {p['warning']}.**", ""] if p["warning"] else []
    out += ["## Provenance", "", md_table(["key", "baseline", "candidate", "differs"], [
        [k, v["baseline"], v["candidate"], "**yes**" if v["differs"] else ""] for k, v in p["keys"].items()])]
    if p["config_differs"]:
        out += ["", "Run config differences (runs with the same run_id):", "",
                md_table(["config key", "baseline", "candidate"],
                       [[k, v["baseline"], v["candidate"]] for k, v in p["config_differs"].items()])]
    return out


def _loss_rows(report: dict) -> list[list[Any]]:
    rows = []
    for r in report["loss"]:
        if r["mode"] == "exact":
            f = r.get("first_diff")
            d = None if f is None else f["abs_diff"]
            # inf in the report, None in its json twin: a step one side lacks or a NaN on one side
            size = "missing or non-finite" if d is None or not math.isfinite(d) else f"{d:.3g}"
            where = "–" if f is None else f"{_where(f, f['repeat'])}: {size}"
            spread = _pct(r.get("outside_fraction"))
        else:
            where = _where(r.get("first_outside"))
            spread = "–" if r.get("outside_fraction") is None else _pct(r["outside_fraction"])
        rows.append([_run_group(r), r["repeats"], r["mode"], r["steps_matched"], r["max_abs_diff"],
                     spread, where, r.get("final_loss_p_holm") if _enveloped(r) else None,
                     _mark(r, r["verdict"]),
                     "; ".join(filter(None, [r["note"], r.get("why_not_exact") if r["mode"] != "exact" else ""]))])
    return rows


def _enveloped(r: dict) -> bool:
    """Whether the row was held against the baseline's spread (exact rows after a software change)."""
    return r["mode"] != "exact" or r.get("outside_fraction") is not None


def render_markdown(report: dict) -> str:
    """The human-readable twin of the json report (works on the json loaded back, too)."""
    th, w, counts = report["thresholds"], report["warnings"], report["verdict"]["counts"]
    fail_on = report.get("fail_on") or []
    cells = len({(r["variant"], r["gpus"], r["options"]) for r in report["throughput"] + report["loss"]})
    launch = report.get("noise")
    out = [f"# dpbench compare: `{report['baseline']}` (baseline) vs `{report['candidate']}` (candidate)", "",
           f"{_count(report['runs']['baseline'], 'baseline run')} against "
           f"{_count(report['runs']['candidate'], 'candidate run')}, "
           f"{_count(cells, 'cell')} (variant, GPU count, options) on both sides.", "",
           "**How noise is judged.** " + _throughput_rule(th, launch) + " Loss curves of "
           "deterministic runs with the same seed, config and hardware must match bit for bit (after a "
           "software change their bits may move, but they must also stay within the band below); other "
           f"curves are held against the baseline's repeat-to-repeat spread, a band of "
           f"{th['envelope_k']:g} standard errors per step (at least {th['loss_tolerance']:g}), and "
           f"diverge when more than {100 * th['envelope_fraction']:g}% of the steps leave it or the final "
           "loss differs (Welch, Holm). One baseline repeat means the noise is unknown: no divergence "
           "is called.", ""]
    out += _provenance_md(report["provenance"])
    fails = (", ".join(f"{k} ({counts[k]})" for k in fail_on) if fail_on else
             "nothing (no --fail-on given)")
    out += ["", f"**Verdict: {report['verdict']['line']}**", "",
            f"Fails the job: {fails}. Counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + "."]
    sections = [
        ("Run status", "", ["run", "baseline", "candidate", "change", "reason"], [],
         [[r["run_id"], r["baseline"], r["candidate"], _mark(r, r["change"]), r["reason"]]
          for r in report["status"]]),
        ("Throughput (images/s, median over repeats)",
         ("`vs others`: the change beyond the median change of the other cells; `floor`: the "
          "departure a verdict needs; " if launch else "`floor`: the change a verdict needs; ")
         + "`p (Holm)`: Welch's p adjusted over the cells.",
         ["run group", "repeats", "baseline", "candidate", "change"] + (["vs others"] if launch else [])
         + ["floor", "p", "p (Holm)", "verdict", "note"],
         range(1, 9 if launch else 8),
         [[_run_group(r), f"{r['n_baseline']}/{r['n_candidate']}", r["median_baseline"],
           r["median_candidate"], _signed(r["change"], "%", 100)]
          + ([_signed(r.get("departure"), "%", 100)] if launch else [])
          + [_pct(r["floor"]), r["p_value"], r["p_holm"], _mark(r, r["verdict"]), r["note"]]
          for r in report["throughput"]]),
        ("Peak memory (max allocated MiB per device)",
         f"A regression exceeds both +{th['mem_threshold_mib']:g} MiB and +{th['mem_threshold_pct']:g}%.",
         ["run group", "device", "baseline", "candidate", "change", "change %", "verdict"], range(1, 6),
         [[_run_group(r), r["device"], r["baseline_mib"], r["candidate_mib"], _signed(r["delta_mib"]),
           _signed(r["delta_pct"], "%"), _mark(r, r["verdict"])] for r in report["memory"]]),
        ("Warnings (count per run)", "A new warning is a finding even when the numbers are fine.",
         ["", "run group", "category", "message", "baseline", "candidate"], [4, 5],
         [[_mark(r, kind), _run_group(r), r["category"], r["message"], r["count_per_run_baseline"],
           r["count_per_run_candidate"]] for kind in ("new", "vanished", "changed") for r in w[kind]]),
        ("Loss curves (loss_global per step)",
         "`exact`: deterministic on both sides with the same seeds, config and hardware, compared bit "
         "for bit (where: the first differing step and its difference); `envelope`: the candidate's "
         "mean curve against the baseline's spread (outside: share of steps beyond the band; where: "
         "the first such step).",
         ["run group", "repeats", "mode", "steps", "max abs diff", "outside", "where",
          "final loss p (Holm)", "verdict", "note"], [1, 3, 4, 5, 7], _loss_rows(report)),
        ("Final accuracy (test_acc, mean over repeats)", "",
         ["run group", "baseline", "candidate", "change (pp)", "p (Holm)", "verdict"], range(1, 5),
         [[_run_group(r), r["acc_baseline"], r["acc_candidate"], _signed(r["change_pp"]), r["p_holm"],
           _mark(r, r["verdict"])] for r in report["accuracy"]]),
    ]
    # Numbers align right, text left (md_table's rule, as in the other reports).
    for title, note, headers, right, rows in sections:
        if title.startswith("Throughput") and launch:
            out += _launch_noise_md(launch)
        out += ["", f"## {title}", ""] + ([note, ""] if note else []) + [md_table(headers, rows, right)]
    return "\n".join(out) + "\n"


def _throughput_rule(th: dict, launch: dict | None) -> str:
    if not launch:
        floor = max(th["threshold"], th["noise_floor"])
        return (f"A throughput change is called only when it exceeds {100 * floor:g}% (the larger of the "
                f"threshold and the noise floor between two launches), {th['k_spread']:g} × the repeats' "
                f"pooled coefficient of variation, and Welch's t-test reaches p < {th['alpha']:g} after "
                "Holm's correction over the cells.")
    return (f"A throughput change is called only when it exceeds {100 * th['threshold']:g}% and "
            f"{th['k_spread']:g} × the repeats' pooled coefficient of variation, and is beyond the noise "
            f"between launches learned from {len(launch['launches'])} A/A launches (below): either the "
            f"comparison's common shift (the median over its cells) exceeds {_pct2(launch['shift_floor'])}, "
            f"or the cell departs from the median of the other cells by more than "
            f"{_pct2(launch['cell_floor'])} (t prediction intervals at {th['alpha'] / 2:g} each, "
            "Bonferroni over the cells).")


def _pct2(v: float) -> str:
    """Two significant digits, never in exponent form (130%, 6.5%, 0.57%)."""
    return f"{100 * v:.0f}%" if abs(v) >= 0.1 else f"{100 * v:.2g}%"


def _launch_noise_md(launch: dict) -> list[str]:
    sw = launch.get("software_differs") or []
    caveat = ([f"**Not a pure A/A:** the launches differ in {', '.join(sw)}; whatever that changed "
               "counts as noise here.", ""] if sw else [])
    rows = [[t, _signed(v, "%", 100)] for t, v in launch["shifts"].items()]
    return ["", "## Launch noise (A/A)", "",
            f"Learned from {len(launch['launches'])} launches of the same experiment on "
            f"{launch['cells']} cells that ran in all of them (`dpbench.analysis.noise`). A cell's median moves "
            f"around its launch's common shift by sd {_pct2(launch['sigma_cell'])} "
            f"({launch['df_cell']} df); a launch's mean over cells moves by sd "
            f"{_pct2(launch['launch_mean_sd'])} ({launch['df_launch']} df). This comparison's common "
            f"shift: {_signed(launch['shift'], '%', 100)} (floor {_pct2(launch['shift_floor'])}: "
            f"{'beyond' if launch['shift_beyond'] else 'within'} the launch noise).", "", *caveat,
            md_table(["launch", "mean shift vs the first"], rows, [1])]


# -- CLI ---------------------------------------------------------------------------------

def _fail_on(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAIL_ON]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown kind {unknown[0]!r}; choose from {', '.join(FAIL_ON)}")
    return kinds


def _tags(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _parser() -> argparse.ArgumentParser:
    # No prog: argparse takes sys.argv[0], which `dpbench compare` sets to its own name.
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Exit status: 0 compared; 1 a --fail-on kind was found; "
                                       "2 an input is missing or damaged.")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--baseline", required=True, help="tag of the reference result set")
    p.add_argument("--candidate", required=True, help="tag of the result set under test")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when regressions are found (same as --fail-on regressions)")
    p.add_argument("--fail-on", type=_fail_on, default=[], metavar="KIND[,KIND]",
                   help=f"exit 1 when any of these is found: {', '.join(FAIL_ON)}")
    p.add_argument("--noise-from", type=_tags, default=[], metavar="TAG,TAG[,TAG]",
                   help="learn the noise between launches from these A/A launches (the same "
                        "experiment launched several times on the baseline's machine) instead of "
                        "--noise-floor")
    for f in dataclasses.fields(Thresholds):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=float, default=f.default,
                       help=f"default {f.default:g}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    th = Thresholds(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Thresholds)})
    fail_on = list(dict.fromkeys((["regressions"] if args.fail_on_regression else []) + args.fail_on))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one line out, whatever pandas or scipy think
            report = compare(args.results_dir, args.baseline, args.candidate, th, args.noise_from)
            report["fail_on"] = fail_on
            md_path, json_path = R.compare_paths(args.results_dir, args.baseline, args.candidate)
            # Rendered before anything is written, the json last: a crash leaves no half report.
            text = render_markdown(report)
            R.write_atomic(md_path, text)
            R.write_json(json_path, report)
    except InputError as exc:
        print(f"dpbench.analysis.compare: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # never a traceback, never exit 1: the checker broke, not the code
        print(f"dpbench.analysis.compare: error: cannot compare {args.baseline!r} with {args.candidate!r}: "
              f"{error_text(exc)}", file=sys.stderr)
        return 2
    if report["provenance"]["warning"]:
        print(f"WARNING: {report['provenance']['warning']}", file=sys.stderr)
    failed = [k for k in fail_on if report["verdict"]["counts"][k]]
    print(f"{report['verdict']['line']}  ->  {md_path}"
          + (f"  (fails on: {', '.join(failed)})" if failed else ""))
    return exit_code(report, fail_on)


if __name__ == "__main__":
    sys.exit(main())
