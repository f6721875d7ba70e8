"""Regression check between two result sets (e.g. the same benchmark on two PyTorch versions).

    python -m dpbench.compare --results-dir results --baseline A --candidate B [--fail-on-regression]

writes results/compare/A_vs_B.{md,json}. Every row of the report carries a `severity`:
"regression" (counts for --fail-on-regression), "finding" (a human should look) or "info".

Noise rule for throughput, per (variant, gpus, options) group, one images_per_s per ok repeat:
    change = median(candidate) / median(baseline) - 1
    floor  = max(threshold, 2 x pooled coefficient of variation of the repeats)
    |change| <= threshold                      -> "no change"
    |change| <= floor, or Welch p >= 0.05      -> "too noisy to tell"
    otherwise                                  -> "regression" / "improvement"
With a single repeat on either side there is neither a spread nor a test: beyond the threshold
the verdict is "too noisy to tell", within it "no change" with a note saying the spread is unknown.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dpbench.markdown import md_table

from dpbench.results import (STATUS_OK, compare_paths, iter_runs, read_json, read_table,
                             table_path, tag_dir, write_atomic, write_json)

GROUP = ["variant", "gpus", "options"]
REQUIRED_TABLES = ("summary", "memory", "warnings", "steps")
PROVENANCE_FILE = "provenance.json"
PROVENANCE_KEYS = ["torch", "torch_git", "cuda", "cudnn", "nccl", "driver", "gpu_names",
                   "python", "hostname", "device_type"]
HARDWARE_KEYS = ("gpu_names", "device_type", "hostname")
K_SPREAD = 2.0  # 3 vs 3 repeats: the relative SE of a difference of means is ~0.8 CV; 2 CV ~ 2.5 SE
ALPHA = 0.05
HARDWARE_WARNING = "hardware differs ({keys}): timings are not comparable"


class MissingInput(FileNotFoundError):
    """An input result set (folder, table or provenance.json) is not there."""


# -- statistics (no scipy: Welch's t with the exact Student-t tail via the incomplete beta) ----

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def welch_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value of Welch's t-test on the means (needs >= 2 values per side)."""
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = y.mean() - x.mean()
    if va + vb == 0.0:  # identical repeats: any difference is resolved exactly
        return 0.0 if diff != 0 else 1.0
    df = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1))
    return t_two_sided_p(diff / math.sqrt(va + vb), df)


def pooled_cv(x: np.ndarray, y: np.ndarray) -> float:
    cvs = [(v.std(ddof=1) / v.mean()) ** 2 * (len(v) - 1) for v in (x, y)]
    return math.sqrt(sum(cvs) / (len(x) + len(y) - 2))


# -- loading -----------------------------------------------------------------------------

def load_set(root: Path | str, tag: str, role: str) -> dict[str, Any]:
    folder = tag_dir(root, tag)
    if not folder.is_dir():
        raise MissingInput(f"{role} result set {tag!r} not found: folder {folder} does not exist")
    paths = [table_path(root, tag, n) for n in REQUIRED_TABLES] + [folder / PROVENANCE_FILE]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise MissingInput(f"{role} result set {tag!r} is incomplete, missing: {', '.join(missing)}")
    tables = {n: read_table(root, tag, n) for n in REQUIRED_TABLES}
    # Memory, warnings and curves of runs that did not finish are partial: status reports those.
    summary = tables["summary"]
    ok_ids = set(summary.loc[summary["status"] == STATUS_OK, "run_id"])
    for name in ("memory", "warnings", "steps"):
        tables[name] = tables[name][tables[name]["run_id"].isin(ok_ids)]
    tables["ok_summary"] = summary[summary["run_id"].isin(ok_ids)]
    return {"tables": tables, "provenance": read_json(folder / PROVENANCE_FILE),
            "configs": {r["run_id"]: r.get("config") or {} for r, _ in iter_runs(folder / "runs")}}


def _group(key: tuple) -> dict[str, Any]:
    return {"variant": str(key[0]), "gpus": int(key[1]), "options": str(key[2])}


def _ok_values(summary, column: str) -> dict[tuple, np.ndarray]:
    ok = summary[(summary["status"] == STATUS_OK) & summary[column].notna()]
    return {k: g[column].to_numpy(float) for k, g in ok.groupby(GROUP)}


# -- aspects -----------------------------------------------------------------------------

def throughput_verdict(x: np.ndarray, y: np.ndarray, threshold: float) -> dict[str, Any]:
    change = float(np.median(y) / np.median(x) - 1.0)
    row: dict[str, Any] = {"n_baseline": len(x), "n_candidate": len(y),
                           "median_baseline": float(np.median(x)),
                           "median_candidate": float(np.median(y)), "change": change,
                           "pooled_cv": None, "floor": threshold, "p_value": None, "note": ""}
    if min(len(x), len(y)) < 2:
        row["note"] = "single repeat: spread unknown, no significance test"
        verdict = "no change" if abs(change) <= threshold else "too noisy to tell"
    else:
        row["pooled_cv"] = pooled_cv(x, y)
        row["floor"] = max(threshold, K_SPREAD * row["pooled_cv"])
        row["p_value"] = welch_p(x, y)
        if abs(change) <= threshold:
            verdict = "no change"
        elif abs(change) <= row["floor"] or row["p_value"] >= ALPHA:
            verdict = "too noisy to tell"
            row["note"] = "change beyond threshold but inside the repeats' spread"
        else:
            verdict = "regression" if change < 0 else "improvement"
    severity = {"regression": "regression", "too noisy to tell": "finding"}.get(verdict, "info")
    return {**row, "verdict": verdict, "severity": severity}


def compare_throughput(base: dict, cand: dict, threshold: float) -> list[dict]:
    a = _ok_values(base["tables"]["summary"], "images_per_s")
    b = _ok_values(cand["tables"]["summary"], "images_per_s")
    return [{**_group(k), **throughput_verdict(a[k], b[k], threshold)} for k in sorted(a.keys() & b.keys())]


def compare_memory(base: dict, cand: dict, mib: float, pct: float) -> list[dict]:
    def peaks(rs: dict) -> dict[tuple, float]:
        mem = rs["tables"]["memory"]
        return mem[mem["allocated_mib"].notna()].groupby(GROUP + ["device"])["allocated_mib"].max().to_dict()

    a, b = peaks(base), peaks(cand)
    rows = []
    for k in sorted(a.keys() & b.keys()):
        delta = float(b[k] - a[k])
        rel = 100.0 * delta / a[k] if a[k] > 0 else math.inf
        # Both limits must be exceeded: small absolute noise on small tensors is not a regression.
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
        totals = rs["tables"]["warnings"].groupby(GROUP + ["category", "message"])["count"].sum()
        return {k: float(v) / runs[k[:3]] for k, v in totals.items() if k[:3] in shared}

    a, b = per_run(base, runs_a), per_run(cand, runs_b)

    def row(k: tuple, severity: str) -> dict:
        return {**_group(k), "category": k[3], "message": k[4], "count_per_run_baseline": a.get(k),
                "count_per_run_candidate": b.get(k), "severity": severity}

    return {"new": [row(k, "finding") for k in sorted(b.keys() - a.keys())],
            "vanished": [row(k, "info") for k in sorted(a.keys() - b.keys())],
            "changed": [row(k, "info") for k in sorted(a.keys() & b.keys()) if not math.isclose(a[k], b[k])]}


def compare_loss(base: dict, cand: dict, tolerance: float) -> list[dict]:
    keys = GROUP + ["repeat", "epoch", "step"]
    m = base["tables"]["steps"][keys + ["loss_global"]].merge(
        cand["tables"]["steps"][keys + ["loss_global"]], on=keys, suffixes=("_b", "_c"))
    if m.empty:
        return []
    lb, lc = m["loss_global_b"].to_numpy(float), m["loss_global_c"].to_numpy(float)
    # A loss that became NaN/inf on one side only is the worst divergence, not a missing value.
    one_sided = np.isfinite(lb) != np.isfinite(lc)
    m["diff"] = np.where(one_sided, np.inf, np.abs(lc - lb))
    m = m[m["diff"].notna()]
    rows = []
    for k, g in m.groupby(GROUP):
        worst = g.loc[g["diff"].idxmax()]
        diverged = bool(worst["diff"] > tolerance)
        rows.append({**_group(k), "steps_matched": len(g), "max_abs_diff": float(worst["diff"]),
                     "at_repeat": int(worst["repeat"]), "at_epoch": int(worst["epoch"]),
                     "at_step": int(worst["step"]),
                     "note": "loss not finite on one side" if math.isinf(worst["diff"]) else "",
                     "verdict": "diverged" if diverged else "matches",
                     "severity": "finding" if diverged else "info"})
    return rows


def compare_accuracy(base: dict, cand: dict) -> list[dict]:
    a = _ok_values(base["tables"]["summary"], "test_acc")
    b = _ok_values(cand["tables"]["summary"], "test_acc")
    return [{**_group(k), "acc_baseline": float(np.median(a[k])), "acc_candidate": float(np.median(b[k])),
             "change_pp": float(100.0 * (np.median(b[k]) - np.median(a[k]))), "severity": "info"}
            for k in sorted(a.keys() & b.keys())]


def _status_change(before: str | None, after: str | None) -> tuple[str | None, str]:
    if after is None:
        return "missing in candidate", "regression"
    if before is None:
        return "new in candidate", "info"
    if before == after:
        return None, "info"
    if before == STATUS_OK:
        return f"ok → {after}", "regression"
    return (f"{before} → ok (fixed)" if after == STATUS_OK else f"{before} → {after}"), "info"


def compare_status(base: dict, cand: dict) -> list[dict]:
    a = base["tables"]["summary"].set_index("run_id").to_dict("index")
    b = cand["tables"]["summary"].set_index("run_id").to_dict("index")
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
        fa, fb = _flatten(a[rid]), _flatten(b[rid])
        for k in fa.keys() | fb.keys():
            va, vb = json.dumps(fa.get(k), sort_keys=True), json.dumps(fb.get(k), sort_keys=True)
            if va != vb:
                d = diffs.setdefault(k, {"baseline": set(), "candidate": set()})
                d["baseline"].add(va)
                d["candidate"].add(vb)
    return {k: {side: [json.loads(v) for v in sorted(vals)] for side, vals in d.items()}
            for k, d in sorted(diffs.items())}


def _flat_names(value: Any) -> list[str]:
    return [n for v in value for n in _flat_names(v)] if isinstance(value, list) else [str(value)]


def _prov_value(rs: dict, key: str) -> Any:
    if key == "gpu_names":
        # The visible GPUs vary with each run's gpus (a list of lists); the models are the hardware.
        return sorted(set(_flat_names(rs["provenance"].get(key) or [])))
    if key != "device_type":
        return rs["provenance"].get(key)
    # device_type lives in the records, not provenance.json; same convention: one value or a list
    values = sorted(set(rs["tables"]["summary"]["device_type"].dropna().astype(str)))
    return values[0] if len(values) == 1 else values


def compare_provenance(base: dict, cand: dict) -> dict[str, Any]:
    keys = {}
    for k in PROVENANCE_KEYS:
        va, vb = _prov_value(base, k), _prov_value(cand, k)
        keys[k] = {"baseline": va, "candidate": vb, "differs": va != vb}
    hardware = [k for k in HARDWARE_KEYS if keys[k]["differs"]]
    return {"keys": keys, "differs": [k for k, v in keys.items() if v["differs"]],
            "config_differs": compare_configs(base["configs"], cand["configs"]),
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
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def compare(results_dir: Path | str, baseline: str, candidate: str, *, threshold: float = 0.05,
            mem_threshold_mib: float = 64.0, mem_threshold_pct: float = 5.0,
            loss_tolerance: float = 1e-3) -> dict[str, Any]:
    """The comparison as a JSON-ready dict; raises MissingInput when an input set is absent."""
    base = load_set(results_dir, baseline, "baseline")
    cand = load_set(results_dir, candidate, "candidate")
    report: dict[str, Any] = {
        "baseline": baseline, "candidate": candidate,
        "thresholds": {"threshold": threshold, "mem_threshold_mib": mem_threshold_mib,
                       "mem_threshold_pct": mem_threshold_pct, "loss_tolerance": loss_tolerance,
                       "k_spread": K_SPREAD, "alpha": ALPHA},
        "provenance": compare_provenance(base, cand),
        "status": compare_status(base, cand),
        "throughput": compare_throughput(base, cand, threshold),
        "memory": compare_memory(base, cand, mem_threshold_mib, mem_threshold_pct),
        "warnings": compare_warnings(base, cand),
        "loss": compare_loss(base, cand, loss_tolerance),
        "accuracy": compare_accuracy(base, cand),
    }
    rows = [report["provenance"], *report["status"], *report["throughput"], *report["memory"],
            *[r for rs in report["warnings"].values() for r in rs], *report["loss"], *report["accuracy"]]
    severities = [r["severity"] for r in rows]
    n, m = severities.count("regression"), severities.count("finding")
    report["verdict"] = {"regressions": n, "findings": m,
                         "line": f"{n} regressions, {m} findings" if n or m else "no regression beyond noise"}
    return _finite(report)


# -- markdown ----------------------------------------------------------------------------

def _signed(v: float | None, unit: str = "", scale: float = 1.0) -> str:
    return "–" if v is None else f"{scale * v:+.1f}{unit}"


def _run_group(r: dict) -> str:
    return f"{r['variant']} g{r['gpus']}" + (f" {r['options']}" if r["options"] else "")


def _mark(r: dict, text: str) -> str:
    """Bold what counts (regressions and findings) so it stands out in a long table."""
    return text if r["severity"] == "info" else f"**{text}**"


def _provenance_md(p: dict) -> list[str]:
    out = [f"> **WARNING: {p['warning']}.**", ""] if p["warning"] else []
    out += ["## Provenance", "", md_table(["key", "baseline", "candidate", "differs"], [
        [k, v["baseline"], v["candidate"], "**yes**" if v["differs"] else ""] for k, v in p["keys"].items()])]
    if p["config_differs"]:
        out += ["", "Run config differences (runs with the same run_id):", "",
                md_table(["config key", "baseline", "candidate"],
                         [[k, v["baseline"], v["candidate"]] for k, v in p["config_differs"].items()])]
    return out


def render_markdown(report: dict) -> str:
    """The human-readable twin of the json report (works on the json loaded back, too)."""
    th, w = report["thresholds"], report["warnings"]
    sections = [
        ("Run status", "", ["run", "baseline", "candidate", "change", "reason"],
         [[r["run_id"], r["baseline"], r["candidate"], _mark(r, r["change"]), r["reason"]]
          for r in report["status"]]),
        ("Throughput (images/s, median over repeats)",
         f"Threshold {100 * th['threshold']:g}%, raised to the floor {th['k_spread']:g} x the pooled "
         f"coefficient of variation of the repeats when that is larger; beyond it, Welch's t-test "
         f"must reach p < {th['alpha']:g}.",
         ["run group", "repeats", "baseline", "candidate", "change", "floor", "p", "verdict", "note"],
         [[_run_group(r), f"{r['n_baseline']}/{r['n_candidate']}", r["median_baseline"],
           r["median_candidate"], _signed(r["change"], "%", 100), f"{100 * r['floor']:.1f}%",
           r["p_value"], _mark(r, r["verdict"]), r["note"]] for r in report["throughput"]]),
        ("Peak memory (max allocated MiB per device)",
         f"A regression exceeds both +{th['mem_threshold_mib']:g} MiB and +{th['mem_threshold_pct']:g}%.",
         ["run group", "device", "baseline", "candidate", "change", "change %", "verdict"],
         [[_run_group(r), r["device"], r["baseline_mib"], r["candidate_mib"], _signed(r["delta_mib"]),
           _signed(r["delta_pct"], "%"), _mark(r, r["verdict"])] for r in report["memory"]]),
        ("Warnings (count per run)", "A new warning is a finding even when the numbers are fine.",
         ["", "run group", "category", "message", "baseline", "candidate"],
         [[_mark(r, kind), _run_group(r), r["category"], r["message"], r["count_per_run_baseline"],
           r["count_per_run_candidate"]] for kind in ("new", "vanished", "changed") for r in w[kind]]),
        ("Loss curves (loss_global at matching repeat/epoch/step)",
         f"Diverged when the largest absolute difference exceeds {th['loss_tolerance']:g}.",
         ["run group", "steps", "max abs diff", "at (repeat, epoch, step)", "verdict", "note"],
         [[_run_group(r), r["steps_matched"], r["max_abs_diff"],
           f"({r['at_repeat']}, {r['at_epoch']}, {r['at_step']})", _mark(r, r["verdict"]), r["note"]]
          for r in report["loss"]]),
        ("Final accuracy (test_acc, median over repeats)", "",
         ["run group", "baseline", "candidate", "change (pp)"],
         [[_run_group(r), r["acc_baseline"], r["acc_candidate"], _signed(r["change_pp"])]
          for r in report["accuracy"]]),
    ]
    out = [f"# dpbench compare: `{report['baseline']}` (baseline) vs `{report['candidate']}` (candidate)", ""]
    out += _provenance_md(report["provenance"]) + ["", f"**Verdict: {report['verdict']['line']}**"]
    for title, note, headers, rows in sections:
        out += ["", f"## {title}", ""] + ([note, ""] if note else []) + [md_table(headers, rows)]
    return "\n".join(out) + "\n"


# -- CLI ---------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dpbench.compare", description=__doc__.split("\n")[0])
    p.add_argument("--results-dir", default="results")
    p.add_argument("--baseline", required=True, help="tag of the reference result set")
    p.add_argument("--candidate", required=True, help="tag of the result set under test")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 1 when regressions are found")
    p.add_argument("--threshold", type=float, default=0.05, help="relative throughput threshold")
    p.add_argument("--mem-threshold-mib", type=float, default=64.0)
    p.add_argument("--mem-threshold-pct", type=float, default=5.0)
    p.add_argument("--loss-tolerance", type=float, default=1e-3)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        report = compare(args.results_dir, args.baseline, args.candidate, threshold=args.threshold,
                         mem_threshold_mib=args.mem_threshold_mib, mem_threshold_pct=args.mem_threshold_pct,
                         loss_tolerance=args.loss_tolerance)
    except MissingInput as exc:
        print(f"dpbench.compare: error: {exc}", file=sys.stderr)
        return 2
    md_path, json_path = compare_paths(args.results_dir, args.baseline, args.candidate)
    write_json(json_path, report)
    write_atomic(md_path, render_markdown(report))
    if report["provenance"]["warning"]:
        print(f"WARNING: {report['provenance']['warning']}", file=sys.stderr)
    print(f"{report['verdict']['line']}  ->  {md_path}")
    return 1 if args.fail_on_regression and report["verdict"]["regressions"] else 0


if __name__ == "__main__":
    sys.exit(main())
