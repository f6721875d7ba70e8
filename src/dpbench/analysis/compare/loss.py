"""Loss curves per cell: bit for bit where both sides promise determinism with the same seeds,
config and hardware, else the curve test (analysis.compare.curves: each run's mean loss after the
first tenth, pooled t-test or seed-paired where seeds match, Holm over cells). The per-step band (stats.envelope_check) is still
computed and reported, as a picture of where curves part, not as a verdict.

Its rows stay dicts: which keys a row holds depends on the way it was judged (exact, exact after
a software change, envelope), and the committed reports fix that shape and key order.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from dpbench.analysis.cells import CELL_KEY, cell_fields
from dpbench.analysis.compare.curves import CurveTest, curve_summary_tests
from dpbench.analysis.compare.loading import CELL, in_order, ok_values, shown
from dpbench.analysis.compare.provenance import EXACT_HARDWARE_KEYS, SOFTWARE_KEYS, flatten
from dpbench.analysis.compare.stats import envelope_check, exact_check, holm, welch_p
from dpbench.analysis.compare.thresholds import Thresholds

# Config keys that cannot change a single bit of the training.
INERT_CONFIG_KEYS = {"data_root", "download", "log_every", "save_checkpoint", "collective_timeout_s"}


def curves_of(steps) -> dict[Any, dict[int, Any]]:
    """cell -> repeat -> loss_global as a Series indexed by (epoch, step). The cell is a loaded
    set's CELL; a steps table read as it is on disk (the calibration's) has none: its cells are
    then its (variant, gpus, options)."""
    by = [CELL] if CELL in steps.columns else CELL_KEY
    out: dict[Any, dict[int, Any]] = {}
    for (*key, repeat), g in steps.groupby(by + ["repeat"]):
        index = pd.MultiIndex.from_arrays([g["epoch"].to_numpy(int), g["step"].to_numpy(int)],
                                          names=["epoch", "step"])
        out.setdefault(key[0] if by == [CELL] else tuple(key), {})[int(repeat)] = pd.Series(
            g["loss_global"].to_numpy(float), index=index).sort_index()
    return out


def seeds_of(side: dict) -> dict[tuple, Any]:
    """(cell, repeat) -> the seed its run record names (None: no record)."""
    ids = side["tables"]["steps"].drop_duplicates([CELL, "repeat"])
    recs = side["records"]
    return {(cell, int(r)): getattr(recs.get(str(rid)), "seed", None)
            for cell, r, rid in zip(ids[CELL], ids["repeat"], ids["run_id"])}


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
    fa, fb = flatten(a), flatten(b)
    return [k for k in sorted(fa.keys() | fb.keys())
            if k.split(".")[0] not in INERT_CONFIG_KEYS and fa.get(k) != fb.get(k)]


def common_steps(curves: list) -> Any:
    """The steps every given curve reached (a written NaN loss stays and counts), sorted."""
    steps = None
    for s in curves:
        steps = s.index if steps is None else steps.intersection(s.index)
    return None if steps is None or len(steps) == 0 else steps.sort_values()


def curve_matrix(curves: dict, steps) -> np.ndarray:
    return np.array([curves[r].reindex(steps).to_numpy(float) for r in sorted(curves)])


def curve_tests(curves_a: dict, curves_b: dict, keys: list, th: Thresholds,
                aa: dict | None = None, seeds: tuple | None = None,
                aa_seeded: list | None = None, offset_once: bool = True) -> dict[tuple, CurveTest]:
    """The curve test of every cell both sides ran (Holm over them); aa: cell -> [per A/A launch
    repeat -> curve Series], whose spread joins the pool. seeds: (seeds_of the baseline, of the
    candidate), which make a cell's test seed-paired where they match (None: unpaired);
    aa_seeded: [(curves_of, seeds_of) per A/A launch] for the paired test's noise (the candidate
    left out, the baseline in when it is one of them)."""
    cells, aa_cells, seed_cells, aa_seed_cells = {}, {}, {}, {}
    for k in keys:
        launches = [c for c in (aa or {}).get(k, []) if c]
        paired = [(c[k], sd) for c, sd in (aa_seeded or []) if c.get(k)] if seeds else []
        steps = common_steps([*curves_a[k].values(), *curves_b[k].values(),
                              *[s for c in launches for s in c.values()],
                              *[s for c, _ in paired for s in c.values()]])
        if steps is None:
            continue
        cells[k] = (curve_matrix(curves_a[k], steps), curve_matrix(curves_b[k], steps))
        aa_cells[k] = [curve_matrix(c, steps) for c in launches]
        if seeds:
            seed_cells[k] = tuple([side.get((k, r)) for r in sorted(cur[k])]
                                  for side, cur in zip(seeds, (curves_a, curves_b)))
            aa_seed_cells[k] = [(curve_matrix(c, steps), [sd.get((k, r)) for r in sorted(c)]) for c, sd in paired]
    return curve_summary_tests(cells, th.alpha, th.loss_tolerance, aa_cells, seed_cells, aa_seed_cells,
                               offset_once)


def _curve_fields(t: CurveTest | None) -> dict[str, Any]:
    if t is None:
        return {"curve_design": None, "curve_change": None, "curve_sd": None, "curve_df": 0, "curve_p": None,
                "curve_p_holm": None, "smallest_detectable": None}
    return {"curve_design": t.design, "curve_change": t.change, "curve_sd": t.sd, "curve_df": t.df,
            "curve_p": t.p_value, "curve_p_holm": t.p_holm, "smallest_detectable": t.smallest_detectable}


def compare_loss(base: dict, cand: dict, th: Thresholds, prov: dict, aa: dict | None = None,
                 aa_sides: list[dict] | None = None, seed_paired: bool = True,
                 offset_once: bool = True) -> list[dict]:
    """aa: cell -> the A/A launches' curves (the compared sets left out) for the unpaired pool;
    aa_sides: the loaded A/A launches for the seed-paired test's noise (the candidate left out,
    the baseline in when named); seed_paired False: every cell unpaired (report formats 1-2)."""
    sa, sb = base["tables"]["steps"], cand["tables"]["steps"]
    curves_a, curves_b = curves_of(sa), curves_of(sb)
    keys = in_order(curves_a.keys() & curves_b.keys(), base, cand)
    ids = sa.drop_duplicates([CELL, "repeat"])
    run_of = {(cell, int(r)): str(rid) for cell, r, rid in zip(ids[CELL], ids["repeat"], ids["run_id"])}
    hardware_same = not any(prov["keys"][k]["differs"] for k in EXACT_HARDWARE_KEYS)
    software = [k for k in SOFTWARE_KEYS if prov["keys"][k]["differs"]]
    fa = ok_values(base["tables"]["summary"], "final_loss")
    fb = ok_values(cand["tables"]["summary"], "final_loss")
    raw = [welch_p(fa[k], fb[k]) if k in fa and k in fb else None for k in keys]
    adjusted = holm(raw)
    modes = {k: _mode(base, cand, [run_of[(k, r)] for r in sorted(set(curves_a[k]) & set(curves_b[k]))],
                      hardware_same) for k in keys}
    # Holm's family: the cells the curve test judges (not those held bit for bit with nothing
    # changed, nor same-bits curves, which it never judges).
    judged = [k for k in keys if (software or not modes[k][0]) and not _same_bits_all(curves_a[k], curves_b[k])]
    seeds = (seeds_of(base), seeds_of(cand)) if seed_paired else None
    aa_seeded = [(curves_of(s["tables"]["steps"]), seeds_of(s)) for s in aa_sides or []]
    tests = curve_tests(curves_a, curves_b, judged, th, aa, seeds, aa_seeded, offset_once)
    rows = []
    for key, p, q in zip(keys, raw, adjusted):
        ca, cb = curves_a[key], curves_b[key]
        exact, why = modes[key]
        row: dict[str, Any] = {**cell_fields(shown(key, base, cand)), "mode": "exact" if exact else "envelope",
                               "repeats": f"{len(ca)}/{len(cb)}", "final_loss_p": p, "final_loss_p_holm": q,
                               "why_not_exact": why, **_curve_fields(tests.get(key))}
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
                env = _judged_envelope(ca, cb, th, tests.get(key))
                row.update(outside_fraction=env["outside_fraction"], first_outside=env["first_outside"],
                           distinct_baseline_curves=env["distinct_baseline_curves"])
                diverged = env["verdict"] == "diverged"
                row.update(verdict="diverged" if diverged else "bits changed", severity=severity,
                           note="; ".join(filter(None, [note, env["note"] if diverged else ""])))
            else:
                row.update(verdict="bits changed", severity=severity, note=note)
            rows.append(row)
            continue
        if _same_bits_all(ca, cb):
            # Same bits without the promise (e.g. CPU runs recorded before the deterministic
            # flag existed): nothing to judge against the noise.
            row.update(steps_matched=sum(len(c) for c in cb.values()), max_abs_diff=0.0,
                       outside_fraction=0.0, verdict="identical", severity="info",
                       note="bit-identical", at=None, first_outside=None)
            rows.append(row)
            continue
        env = _judged_envelope(ca, cb, th, tests.get(key))
        row.update({k: env[k] for k in ("steps_matched", "max_abs_diff", "outside_fraction",
                                         "distinct_baseline_curves", "verdict", "note", "at",
                                         "first_outside")})
        row["severity"] = "finding" if row["verdict"] == "diverged" else "info"
        rows.append(row)
    return rows


def _same_bits_all(ca: dict, cb: dict) -> bool:
    """Every repeat's curve the same to the bit on both sides."""
    return set(ca) == set(cb) and exact_check({r: (ca[r], cb[r]) for r in ca})["first"] is None


def _judged_envelope(ca: dict, cb: dict, th: Thresholds, test: CurveTest | None) -> dict[str, Any]:
    """The band as a picture, with the curve test's verdict and note."""
    env = _envelope_of(ca, cb, th)
    if env["note"] == "loss not finite on one side":  # a blow-up anywhere, first tenth included
        return env
    if test is None:
        return {**env, "verdict": "noise unknown", "note": "no step in common"}
    note = test.note
    if test.verdict == "diverged" and test.change is not None and math.isfinite(test.change):
        note = f"mean loss after the first tenth moved by {test.change:+.3g} (curve test, Holm)"
    return {**env, "verdict": test.verdict, "note": note}


def _envelope_of(ca: dict, cb: dict, th: Thresholds) -> dict[str, Any]:
    steps = common_steps([*ca.values(), *cb.values()])
    if not ca or not cb or steps is None:
        return {"steps_matched": 0, "max_abs_diff": None, "outside_fraction": None,
                "distinct_baseline_curves": len(ca), "verdict": "noise unknown",
                "note": "no step in common", "at": None, "first_outside": None}
    env = envelope_check(curve_matrix(ca, steps), curve_matrix(cb, steps), th)

    def at(i: int | None):
        return None if i is None else {"epoch": int(steps[i][0]), "step": int(steps[i][1])}

    return {**env, "at": at(env["at_index"]), "first_outside": at(env["first_outside"])}
