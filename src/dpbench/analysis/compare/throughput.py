"""Throughput per cell: the change of images/s (the ratio of geometric means, the quantity
Welch's test on log images/s is about) and its verdict against the noise (the repeats' spread and
Welch/Holm, or the launch-to-launch noise learned from A/A launches)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpbench.analysis import noise
from dpbench.analysis.cells import cell_fields
from dpbench.analysis.compare.loading import InputError, in_order, key_cells, load_set, ok_values, shown
from dpbench.analysis.compare.provenance import EXACT_HARDWARE_KEYS, SOFTWARE_KEYS, prov_value
from dpbench.analysis.compare.stats import holm, pooled_cv, welch_p
from dpbench.analysis.compare.thresholds import Thresholds

def _geomean(x: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(x))))


def _change(x: np.ndarray, y: np.ndarray) -> float:
    """The ratio of geometric means - 1: throughput changes multiply, and Welch's test on the log
    values tests exactly this (a ratio of medians would test one number and report another)."""
    return float(np.expm1(np.mean(np.log(y)) - np.mean(np.log(x))))


def _median_change(x: np.ndarray, y: np.ndarray) -> float:
    """Report format 1's change (a ratio of medians, beside Welch on raw images/s)."""
    return float(np.median(y) / np.median(x) - 1.0)


def throughput_verdicts(cells: dict[Any, tuple[np.ndarray, np.ndarray]], th: Thresholds,
                        launch_noise: noise.LaunchNoise | None = None,
                        report_format: int = 2) -> tuple[dict[Any, ThroughputVerdict], dict | None]:
    """Verdict per cell from (baseline, candidate) images/s, and the launch-noise judgement of
    the comparison as a whole (None without A/A data); Holm runs over all tested cells.
    report_format 1 remakes older reports' verdicts (medians, Welch on raw values)."""
    keys = list(cells)
    change = _median_change if report_format < 2 else _change
    scale = (lambda v: v) if report_format < 2 else np.log
    raw = [welch_p(scale(cells[k][0]), scale(cells[k][1])) for k in keys]
    adjusted = holm(raw)
    judged = (noise.verdicts({k: change(*cells[k]) for k in keys}, launch_noise, th.alpha)
              if launch_noise is not None else None)
    out = {k: _throughput_verdict(*cells[k], p, q, th, judged and {**judged, **judged["cells"][k]}, change)
           for k, p, q in zip(keys, raw, adjusted)}
    return out, judged


def _signs_agree(a: float, b: float) -> bool:
    return a * b > 0


@dataclass
class ThroughputVerdict:
    """One cell's throughput change and what it means (severity: regression, finding or info)."""
    n_baseline: int
    n_candidate: int
    median_baseline: float
    median_candidate: float
    change: float
    pooled_cv: float | None
    floor: float
    p_value: float | None
    p_holm: float | None
    note: str = ""
    geomean_baseline: float | None = None
    geomean_candidate: float | None = None
    departure: float | None = None
    """The change beyond the other cells' median change; only when judged by A/A launch noise."""
    verdict: str = ""
    severity: str = "info"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.departure is None:   # the report's rows carry it only when it was judged
            del d["departure"]
        return d


def _throughput_verdict(x: np.ndarray, y: np.ndarray, p: float | None, p_holm: float | None,
                        th: Thresholds, launch: dict | None = None, change_of=_change) -> ThroughputVerdict:
    x, y = np.asarray(x, float), np.asarray(y, float)
    change = change_of(x, y)
    no_change = max(th.threshold, th.noise_floor)
    v = ThroughputVerdict(len(x), len(y), float(np.median(x)), float(np.median(y)), change,
                          None, no_change, p, p_holm, geomean_baseline=_geomean(x), geomean_candidate=_geomean(y))
    if launch is not None:
        v.verdict = _launch_noise_verdict(v, x, y, th, launch)
    elif p is None:
        v.verdict = "no change" if abs(change) <= no_change else "too noisy to tell"
        v.note = "single repeat: spread unknown, no significance test"
    else:
        v.pooled_cv = pooled_cv(x, y)
        v.floor = max(no_change, th.k_spread * v.pooled_cv)
        if abs(change) <= no_change:
            v.verdict = "no change"
            if th.threshold < abs(change):
                v.note = "within the noise floor between launches"
        elif abs(change) <= v.floor:
            v.verdict, v.note = "too noisy to tell", "inside the repeats' own spread"
        elif p_holm >= th.alpha:
            v.verdict, v.note = "too noisy to tell", "not significant after Holm's correction"
        else:
            v.verdict = "regression" if change < 0 else "improvement"
    v.severity = {"regression": "regression", "too noisy to tell": "finding"}.get(v.verdict, "info")
    return v


def _launch_noise_verdict(v: ThroughputVerdict, x: np.ndarray, y: np.ndarray, th: Thresholds,
                          launch: dict) -> str:
    """The verdict against noise learned from A/A launches (dpbench.analysis.noise): a change counts when
    the whole comparison shifted beyond what launches of the same code do, or when this cell
    departs from the other cells by more than cells did between those launches."""
    change = v.change
    v.departure, v.floor = launch["departure"], launch["cell_floor"]
    if min(len(x), len(y)) > 1:
        v.pooled_cv = pooled_cv(x, y)
    if abs(change) <= th.threshold:
        return "no change"
    if v.pooled_cv is not None and abs(change) <= th.k_spread * v.pooled_cv:
        v.note = "inside the repeats' own spread"
        return "too noisy to tell"
    departs = f"departs from the other cells by {100 * launch['departure']:+.1f}%"
    if launch["departure_beyond"] and _signs_agree(launch["departure"], change):
        v.note = departs
    elif launch["shift_beyond"] and _signs_agree(launch["shift"], change):
        v.note = "the common shift is beyond the launch-to-launch noise"
    else:
        v.note = (f"{departs}, the other way from its own change; the rest is launch noise"
                  if launch["departure_beyond"] else "within the launch-to-launch noise (A/A)")
        return "no change"
    return "regression" if change < 0 else "improvement"


def compare_throughput(base: dict, cand: dict, th: Thresholds, launch_noise: noise.LaunchNoise | None = None,
                       fitted: list[dict] | None = None,
                       report_format: int = 2) -> tuple[dict[Any, ThroughputVerdict], dict | None]:
    """Per cell (its CELL key) in both sets, its verdict; and the launch-noise judgement (as
    throughput_verdicts)."""
    # throughput in the workload's unit (images/s, tokens/s): the same ratio either way
    a = ok_values(base["tables"]["summary"], "rate")
    b = ok_values(cand["tables"]["summary"], "rate")
    verdicts, judged = throughput_verdicts({k: (a[k], b[k]) for k in in_order(a.keys() & b.keys(), base, cand)}, th,
                                           launch_noise, report_format)
    if launch_noise is not None:
        # The pooled wobble may not hold for a cell the A/A launches never ran (or not in all).
        for k, v in verdicts.items():
            if cell_fields(shown(k, base, cand)) not in (fitted or []):
                v.note = "; ".join(filter(None, [v.note, "not in every A/A launch"]))
    return verdicts, judged


# -- launch noise from A/A launches ------------------------------------------------------

def _comparable(key: str, value: Any) -> str:
    """A provenance value as compared between launches; a commit by its first 7 hex digits, so a
    short and a full sha of one commit agree."""
    if key == "git_sha" and isinstance(value, str):
        return value[:7]
    return json.dumps(value, sort_keys=True)


def load_launch_noise(root: Path | str, tags: list[str], baseline: dict,
                      loaded: dict[str, dict] | None = None) -> tuple[noise.LaunchNoise | None, dict]:
    """The launch-noise model from result sets of the same experiment launched several times;
    InputError when they were made on other hardware than the baseline. An experiment of one cell
    cannot split a launch's shift from its cells' wobble: no model then, and `unfitted` says why
    (throughput keeps the fixed floor; the loss curves still learn from the launches). loaded:
    sets the caller has read already, by tag (read again otherwise)."""
    tags = list(dict.fromkeys(tags))
    if len(tags) < 2:
        raise InputError(f"--noise-from needs at least 2 launches of the same experiment (A/A), got "
                         f"{len(tags)}: {', '.join(tags) or 'none'}")
    sets = {t: (loaded or {}).get(t) or load_set(root, t, "A/A launch") for t in tags}
    key_cells(baseline, *[s for s in sets.values() if s is not baseline])   # one key for all, as compare's
    for t, s in sets.items():
        for k in EXACT_HARDWARE_KEYS:
            if prov_value(s, k) != prov_value(baseline, k):
                raise InputError(f"A/A launch {t!r} ran on other hardware than the baseline ({k}: "
                                 f"{prov_value(s, k)} vs {prov_value(baseline, k)}); its noise says "
                                 f"nothing here: pass launches made on the baseline's machine")
    medians = {t: {k: float(np.median(v)) for k, v in ok_values(s["tables"]["summary"], "rate").items()}
               for t, s in sets.items()}
    cells = in_order(set.intersection(*(set(m) for m in medians.values())), baseline, *sets.values())
    try:
        model = noise.fit(np.log([[medians[t][c] for t in tags] for c in cells]).reshape(len(cells), len(tags)),
                          tags)
    except noise.NotEnoughLaunches as exc:
        if len(cells) >= 2:
            raise InputError(str(exc)) from None
        return None, {"unfitted": f"{exc}: throughput keeps the fixed noise floor"}
    differs = [k for k in SOFTWARE_KEYS if len({_comparable(k, prov_value(s, k)) for s in sets.values()}) > 1]
    return model, {"fitted_cells": [cell_fields(shown(c, baseline, *sets.values())) for c in cells],
                   "software_differs": differs}


