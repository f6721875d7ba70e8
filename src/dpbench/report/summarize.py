"""results/<tag>/summary.md: provenance, headline ratios with their confidence intervals, strong
and weak scaling, medians over repeats, start-up times (from the run records), skipped and failed
runs, and warnings, all from the tidy tables and provenance.json. A cell's statistics are
cells.csv's (collect computes them once, by the plan's cell_id); a run's row is runs.csv's.

    python -m dpbench.report.summarize --results-dir results --tag TAG
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from statistics import median
from typing import Any

import pandas as pd

from dpbench import DP_VARIANTS, results
from dpbench.analysis import mechanisms, noise
from dpbench.analysis.collect import read_cells
from dpbench.analysis.compare.loading import load_set
from dpbench.analysis.compare.throughput import load_launch_noise
from dpbench.analysis.cell_table import cell_estimate
from dpbench.analysis.intervals import (
    CONFIDENCE,
    NO_INTERVAL,
    Estimate,
    interval_text,
    level_text,
    range_coverage,
    ratio_repeats_for,
    repeats_for,
)
from dpbench.analysis.options import STRONG, WEAK, gpus_label, variant_order
from dpbench.analysis.tables import load_table, ok_runs, speed_runs
from dpbench.report.option_words import label, label_order, labels
from dpbench.report.markdown import md_table

PROVENANCE_KEYS = [("torch", "torch"), ("cuda", "CUDA"), ("cudnn", "cuDNN"), ("nccl", "NCCL"),
                   ("driver", "driver"), ("gpu_names", "GPUs"), ("python", "Python"),
                   ("hostname", "host"), ("git_sha", "git"), ("n_runs", "runs")]

# (cell column, header, format) for the medians table.
MEDIAN_COLUMNS = [
    ("rate", "throughput", "{:,.0f}"),
    ("speedup_strong", "× single", "{:.2f}"),
    ("efficiency_strong", "strong eff.", "{:.0%}"),
    ("efficiency_weak", "weak eff.", "{:.0%}"),
    ("step_ms_p50", "step ms p50", "{:.1f}"),
    ("peak_mem_mib", "peak MiB", "{:,.0f}"),
    ("mem_dev0_over_mean_others", "dev0 / others", "{:.2f}"),
    ("final_loss", "final loss", "{:.3f}"),
    ("test_acc", "test acc", "{:.3f}"),
    ("n_warnings", "warnings", "{:.0f}"),
]


# -- markdown -------------------------------------------------------------------------------

def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def fmt(value: Any, spec: str = "{}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return spec.format(value)


def _fmt_gpus(prov: dict[str, Any]) -> str:
    """gpu_names is a list per run (the GPUs it could see); runs on 1 and on 2 GPUs disagree.
    Show the models and the most GPUs any run saw: '2 × NVIDIA H200'."""
    widest = [str(m) for m in results.widest_gpu_names(prov)]
    return ", ".join(f"{widest.count(m)} × {m}" for m in sorted(set(widest))) or "none"


def _fmt_provenance(prov: dict[str, Any], key: str) -> str:
    """A key's value, or its values joined by '; ' where the runs disagreed."""
    values = results.provenance_values(prov, key)
    return "; ".join("n/a" if v in (None, "") else str(v) for v in values) or "n/a"


# -- sections -------------------------------------------------------------------------------

def provenance_section(rs: results.ResultSet) -> str:
    if not rs.provenance_path.exists():
        return "## Provenance\n\nNo provenance.json was written (no finished runs?).\n"
    prov = rs.provenance()
    rows = [[label, _fmt_gpus(prov) if key == "gpu_names" else _fmt_provenance(prov, key)]
            for key, label in PROVENANCE_KEYS]
    return "## Provenance\n\n" + md_table(["", "value"], rows) + "\n"


def ips_spec(value: float) -> str:
    """Whole images/s for GPU rates, three significant digits for slow (CPU) ones."""
    return "{:,.0f}" if not value or math.isnan(value) or value >= 100 else "{:.3g}"


def with_interval(est: Estimate, spec: str, n: int) -> str:
    """'1.77 (95% CI 1.74–1.80)', '1.34 (75% CI rounds to it)' or '1.77 (n=1, no interval)'."""
    if n >= 2 and fmt(est.low, spec) == fmt(est.high, spec) == fmt(est.value, spec):
        return f"{fmt(est.value, spec)} ({level_text(est.level, est.at_least)} CI rounds to it)"
    return f"{fmt(est.value, spec)} ({interval_text(est, spec, n)})"


def scaling_phrase(c: pd.Series, kind: str) -> str:
    """'strong scaling: 1.77× single at global batch 512, efficiency 88% (56% CI 87–90%)'."""
    ref, eff = c[f"{kind}_reference"], f"efficiency_{kind}"
    if not ref or math.isnan(c[eff]):
        return ""
    n = min(c["n_ok"], c[f"{kind}_reference_n"])
    return (f"{kind} scaling: {c[f'speedup_{kind}']:.2f}× {ref}, efficiency "
            f"{with_interval(cell_estimate(c, eff), '{:.0%}', n)}")


def speed_text(c: pd.Series, launch: noise.LaunchNoise | None = None) -> str:
    """'17,700 images/s (75% CI of this launch 17,650–17,720)', or with A/A launches the interval
    widened by their launch-to-launch noise, '(75% CI across launches 17,500–17,900)'."""
    est, spec, unit = cell_estimate(c, "rate"), ips_spec(c["rate"]), rate_unit(c)
    if launch is not None and c["n_ok"] >= 2 and not math.isnan(est.low):
        low, high = noise.across_launches(est.low, est.high, est.level, launch)
        return (f"{fmt(est.value, spec)} {unit} ({level_text(est.level)} CI across "
                f"{len(launch.launches)} A/A launches {spec.format(low)}–{spec.format(high)})")
    # Without A/A launches it leaves out the launch-to-launch shift: it says so where it stands.
    return with_interval(est, spec, c["n_ok"]).replace(" (", f" {unit} (", 1).replace(
        " CI ", " CI of this launch ", 1)


def rate_unit(c: pd.Series) -> str:
    """The cell's throughput unit: images/s, tokens/s (the workload's)."""
    unit = c.get("rate_unit")
    return unit if isinstance(unit, str) and unit else "images/s"


def headline_line(c: pd.Series, launch: noise.LaunchNoise | None = None) -> str:
    """e.g. 'ddp on 2 GPUs: 17,700 images/s (75% CI ...); strong scaling: 1.77× single at
    global batch 512, efficiency 88% (...); weak scaling: ...'."""
    where = f"{c['variant']} on {gpus_label(c['gpus'])}"
    speed = speed_text(c, launch)
    bound = c.get("bound")
    if isinstance(bound, str) and bound:   # a wrapper's host work shows only where the host sets the pace
        speed += f", {bound}-bound" if bound != "mixed" else ", host- and device-bound runs"
    if c["variant"] == "single":
        return f"- {where}: {speed} (baseline)"
    # On one GPU the per-GPU batch is the global batch: weak is strong, said once.
    parts = [scaling_phrase(c, kind) for kind in ((STRONG,) if c["gpus"] == 1 else (STRONG, WEAK))]
    parts = [p for p in parts if p] or [
        f"no single run at global batch {fmt(c['global_batch'], '{:g}')} (strong) or "
        f"{fmt(c['per_gpu_batch'], '{:g}')} (weak) to compare with"]
    text = f"{where}: {speed}; " + "; ".join(parts)
    ratio = c["mem_dev0_over_mean_others"]
    if c["variant"] in DP_VARIANTS and c["gpus"] > 1 and not math.isnan(ratio):
        text += ("; device 0 holds " + with_interval(cell_estimate(c, "mem_dev0_over_mean_others"),
                                                     "{:.2f}", c["n_ok"]).replace(" (", "× (", 1)
                 + " the mean of the other devices' memory")
    return f"- {text}"


def intervals_note() -> str:
    """What the intervals are and why few repeats give less than the usual 95%."""
    a, b = ratio_repeats_for(CONFIDENCE)
    return (f"Intervals are distribution-free, from the order of the repeats alone: the range of n "
            f"repeats holds the median with confidence 1 − 2^(1−n) ({level_text(range_coverage(2))} "
            f"for 2, {level_text(range_coverage(3))} for 3). A ratio of two medians spans both "
            f"ranges; its confidence is at least the product of theirs, written with ≥ "
            f"({level_text(range_coverage(3) ** 2, True)} for 3 and 3). Each interval states its own; "
            f"{CONFIDENCE:.0%} takes {repeats_for(CONFIDENCE)} repeats for a median and {a} and {b} "
            f"for a ratio. They are this launch's: another launch on the same machine moves a "
            f"median by more (on one H200, sd about 0.7%, seven times a cell's spread within a "
            f"launch); to tell launches apart, compare them with A/A launches (`--noise-from`).")


def headline_section(med: pd.DataFrame, launch: noise.LaunchNoise | None = None) -> str:
    out = ["## Headline (medians over repeats, with intervals)", ""]
    if med.empty:
        return "\n".join(out + ["No successful runs.", ""])
    out += [intervals_note(), ""]
    if launch is not None:
        out += [f"throughput intervals are widened by the noise between {len(launch.launches)} A/A "
                f"launches ({', '.join(launch.launches)}): a cell's median moves between launches by sd "
                f"{100 * math.hypot(launch.sigma_launch, launch.sigma_cell):.2g}%.", ""]
    several = med["label"].nunique() > 1
    for lab in label_order(med):
        group = med[med["label"] == lab]
        if several:
            out += [f"### {lab}", ""]
        out += [headline_line(row, launch) for _, row in group.iterrows()] + [""]
    return "\n".join(out)


def scaling_section(med: pd.DataFrame, summary: pd.DataFrame) -> str:
    """Strong and weak efficiency of every cell but single's, each against its own single runs;
    on 1 GPU, where weak is strong, once. Without such cells, what happened to them instead."""
    out = ["## Strong and weak scaling", "",
           "Strong: throughput ÷ (GPUs × single's throughput at the same global batch). Weak: "
           "throughput ÷ (GPUs × single's throughput at the per-GPU batch). Both are ratios of "
           "medians, with the same options otherwise; `n/a`: no such single run.", ""]
    cells_ = med[(med["variant"] != "single")] if not med.empty else med
    if cells_.empty:
        return "\n".join(out + [no_cells_to_scale(med, summary), ""])
    if (cells_["gpus"] == 1).any():
        out[-2] += (" On 1 GPU the per-GPU batch is the global batch, so weak is strong "
                    "(`= strong`), and the efficiency is the wrapper's own cost.")
    headers = ["variant", "GPUs", "settings", "global batch", "per-GPU batch", "planned",
               "strong efficiency", "weak efficiency"]
    rows = []
    for _, c in cells_.iterrows():
        effs = []
        for kind in (STRONG, WEAK):
            q = f"efficiency_{kind}"
            n = min(c["n_ok"], c[f"{kind}_reference_n"])
            effs.append("n/a" if math.isnan(c[q]) else with_interval(cell_estimate(c, q), "{:.0%}", n))
        if c["gpus"] == 1 and effs[0] != "n/a":
            effs[1] = "= strong"
        rows.append([c["variant"], str(c["gpus"]), c["label"], fmt(c["global_batch"], "{:g}"),
                     fmt(c["per_gpu_batch"], "{:g}"), c["scaling"], *effs])
    return "\n".join(out + [md_table(headers, rows, right=[1, 3, 4]), ""])


def no_cells_to_scale(med: pd.DataFrame, summary: pd.DataFrame) -> str:
    """Why the scaling table is empty: no ok run at all, no variant but single planned, or the
    other variants' runs skipped or failed (counted by status)."""
    if med.empty:
        return "No successful runs."
    others = summary[summary["variant"] != "single"]
    if others.empty:
        return "Only single ran: no other variant to compare with it."
    counts = others["status"].value_counts().sort_index()
    return ("Only single has ok runs (the other variants' runs: "
            + ", ".join(f"{n} {status}" for status, n in counts.items())
            + "; reasons under \"Skipped and failed runs\" below).")


def medians_section(med: pd.DataFrame) -> str:
    out = ["## Summary medians (ok runs)", ""]
    if med.empty:
        return "\n".join(out + ["No successful runs.", ""])
    headers = ["variant", "gpus", "settings", "ok runs"] + [h for _, h, _ in MEDIAN_COLUMNS]
    rows = []
    for _, r in med.iterrows():
        row = [r["variant"], str(r["gpus"]), r["label"], str(r["n_ok"])]
        row += [fmt(r[c], ips_spec(r[c]) if c == "rate" else spec) + (f" {rate_unit(r)}" if c == "rate" and
                                                                          fmt(r[c]) != "n/a" else "")
                for c, _, spec in MEDIAN_COLUMNS]
        rows.append(row)
    right = [1, 3] + list(range(4, len(headers)))
    note = ("Intervals are in the headline above and in `medians.csv`; a cell with one repeat "
            f"has none ({NO_INTERVAL}).")
    return "\n".join(out + [md_table(headers, rows, right=right), "", note, ""])


def startup_phases(rec: results.RunRecord) -> list[float] | None:
    """Seconds each of results.STARTUP_PHASES took, then the rest up to the first step; None for
    a record without every phase (from before they were measured)."""
    # a phase an older record did not time took no time of its own there (it ran in the next)
    ends = [rec.startup.get(p, rec.startup.get(results.LATER_PHASES.get(p, p))) for p in results.STARTUP_PHASES]
    if rec.start_s is None or None in ends:
        return None
    ends = [float(e) for e in ends] + [rec.start_s]
    return [b - a for a, b in zip([0.0] + ends, ends)]


def startup_section(rs: results.ResultSet) -> str:
    """How long runs took from their launch to the first training step, and in which phase: the
    fixed cost that a run's timed steps leave out, per cell (option set, variant, GPUs). Empty
    for records from before it was measured."""
    totals: dict[tuple[str, str, int], list[float]] = {}
    phases: dict[tuple[str, str, int], list[list[float]]] = {}
    seen: list[dict] = []   # each run's option set, for label_order
    for data, _ in results.iter_runs(rs.runs_dir, damaged=True):
        try:   # a damaged record is a failed row of the tables already: no start-up to show
            rec = results.RunRecord.from_json(data)
        except (ValueError, TypeError, AttributeError):
            continue
        if rec.ok and rec.start_s is not None:
            row = {"options": rec.options, "precision": rec.config.get("precision"),
                   "global_batch": rec.config.get("global_batch"),
                   "per_gpu_batch": rec.per_gpu_batch, "scaling": rec.scaling}
            key = (label(row), rec.variant, rec.gpus)
            seen.append(dict(row, label=key[0]))
            totals.setdefault(key, []).append(rec.start_s)
            if (split := startup_phases(rec)) is not None:
                phases.setdefault(key, []).append(split)
    if not totals:
        return ""
    lab_rank = {lab: i for i, lab in enumerate(label_order(pd.DataFrame(seen)))}
    order = {v: i for i, v in enumerate(variant_order(pd.Series([v for _, v, _ in totals])))}
    several = len(lab_rank) > 1   # the settings column only where they differ
    names = (list(results.STARTUP_PHASES) + ["rest"]) if phases else []
    table = []
    for (lab, v, g), t in sorted(totals.items(), key=lambda kv: (lab_rank[kv[0][0]], order[kv[0][1]], kv[0][2])):
        split = phases.get((lab, v, g))
        cells_ = [f"{median(col):.1f}" for col in zip(*split)] if split else ["–"] * len(names)
        table.append(([lab] if several else []) + [v, str(g), str(len(t)), f"{median(t):.1f}",
                                                   f"{min(t):.1f}-{max(t):.1f}", *cells_])
    text = ("Seconds from a run's launch (its GPUs held) to its first training step: imports, "
            "torchrun, the devices, the data and the model, none of it in the throughput.")
    if names:
        text += (" Then the median of each phase: imports (Python, torch and torch._dynamo, which "
                 "the optimizer would import; for ddp torchrun and its ranks too), devices (CUDA, "
                 "the process group), data (the numeric switches and the dataset read), model "
                 "(model, wrapper, optimizer), feed (the batches' source: the gpu feed's upload), "
                 "rest (to the first step); – where a cell's records predate the phases. The "
                 "phases are medians each, so they need not add up to the total's median.")
    headers = (["settings"] if several else []) + ["variant", "gpus", "ok runs", "median s", "min-max s", *names]
    first_num = 2 if several else 1
    return "\n".join(["## Start-up", "", text, "",
                      md_table(headers, table, right=list(range(first_num, len(headers)))), ""])


def not_ok_section(summary: pd.DataFrame) -> str:
    """Skipped and failed runs, each distinct reason once with the runs that gave it."""
    out = ["## Skipped and failed runs", ""]
    bad = summary[summary["status"] != results.STATUS_OK]
    if bad.empty:
        return "\n".join(out + ["None: every recorded run finished.", ""])
    bad = bad.assign(reason=bad["reason"].map(one_line).replace("", "(no reason given)"))
    for status, by_status in bad.groupby("status", sort=True):
        out += [f"### {status} ({len(by_status)})", ""]
        for reason, group in by_status.groupby("reason", sort=True):
            ids = ", ".join(f"`{rid}`" for rid in group["run_id"])
            out.append(f"- {reason}: {ids}")
        out.append("")
    return "\n".join(out)


def warnings_section(warnings: pd.DataFrame) -> str:
    """Per variant, each distinct warning once with its total count over all runs."""
    out = ["## Warnings", ""]
    if warnings.empty:
        return "\n".join(out + ["No warnings recorded.", ""])
    # A recorded warning happened at least once even when its count was not kept.
    warnings = warnings.assign(count=warnings["count"].fillna(1),
                               message=warnings["message"].map(one_line))
    for variant in variant_order(warnings["variant"]):
        rows = warnings[warnings["variant"] == variant]
        out += [f"### {variant}", ""]
        totals = rows.groupby(["category", "message"], sort=True).agg(
            count=("count", "sum"), runs=("run_id", "nunique"), location=("location", "first"))
        for (category, message), t in totals.iterrows():
            where = f" (at `{t['location']}`)" if t["location"] else ""
            out.append(f"- {category} ×{t['count']:,.0f} in {t['runs']} run(s){where}: {message}")
        out.append("")
    return "\n".join(out)


def mechanisms_section(rs: results.ResultSet) -> str:
    """The knobs' mechanism checks of the ok runs (run.mechanisms): expected against counted;
    absent where no run turned a knob."""
    records = []
    for data, _ in results.iter_runs(rs.runs_dir, damaged=True):
        try:   # a damaged record is a failed row of the tables already
            records.append(results.RunRecord.from_json(data))
        except (ValueError, TypeError, AttributeError):
            continue
    found = mechanisms.rows(records)
    if not found:
        return ""
    failed = sum(r["state"] == "failed" for r in found)
    text = (f"Each knob a run turned, checked by its mechanism on the profiled step: {len(found)} check(s), "
            f"{failed} failed.")
    table = [[r["run_id"], r["knob"], r["check"], fmt(r["expected"]), fmt(r["counted"]), r["state"], r["text"]]
             for r in found]
    return "\n".join(["## Mechanisms", "", text, "",
                      md_table(["run", "knob", "check", "expected", "counted", "verdict", "what it says"],
                               table, right=[3, 4]), ""])


def rehearsed_note(summary: pd.DataFrame) -> str:
    """What rehearsed runs are and why their speed is missing below ("" without any)."""
    ran = ok_runs(summary)
    n = int(ran["rehearsed"].fillna(False).astype(bool).sum()) if "rehearsed" in ran.columns else 0
    if not n:
        return ""
    return (f"_{n} run(s) were rehearsed (run option `rehearse`): their ranks shared one GPU over gloo, "
            "each its own process and allocator, so their memory is what one rank holds on its own "
            "GPU (less NCCL's buffers) and their step times are nobody's speed: they are left out of "
            "the headline, the scaling table and the throughput figures._\n")


def render_summary(results_dir: Path | str, tag: str, noise_from: list[str] | None = None) -> str:
    """summary.md's text; noise_from: A/A launches (tags) whose launch noise widens the headline
    images/s intervals."""
    launch = (load_launch_noise(results_dir, noise_from, load_set(results_dir, tag, "result set"))[0]
              if noise_from else None)
    summary = load_table(results_dir, tag, "runs")
    warnings = load_table(results_dir, tag, "warnings")
    med = read_cells(results_dir, tag)
    med = med.assign(label=labels(med))   # each cell's option set in words
    if len(med):   # option sets in the figures' order, then variant and GPU count as sorted
        rank = {lab: i for i, lab in enumerate(label_order(med))}
        med = med.assign(_r=med["label"].map(rank)).sort_values("_r", kind="stable").drop(columns="_r")
    ran = ok_runs(summary)
    # Without CUDA the engine runs single and ddp on the CPU: a "GPU" count is a process count.
    cpu_note = ("_These runs ran on the CPU (no CUDA device): \"GPUs\" below count ddp's gloo "
                "processes, and the timings say nothing about GPUs._\n"
                if len(ran) and (ran["device_type"] == "cpu").all() else "")
    timed = speed_runs(med) if len(med) else med
    sections = [f"# dpbench results: {tag}\n", cpu_note, rehearsed_note(summary),
                provenance_section(results.ResultSet(results_dir, tag)),
                headline_section(timed, launch), scaling_section(timed, summary), medians_section(med),
                startup_section(results.ResultSet(results_dir, tag)),
                mechanisms_section(results.ResultSet(results_dir, tag)),
                not_ok_section(summary), warnings_section(warnings)]
    return "\n".join(s for s in sections if s).rstrip() + "\n"


def write_summary_md(results_dir: Path | str, tag: str, noise_from: list[str] | None = None) -> Path:
    path = results.ResultSet(results_dir, tag).summary_md
    results.write_atomic(path, render_summary(results_dir, tag, noise_from))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write results/<tag>/summary.md.")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--noise-from", default="", metavar="TAG,TAG[,TAG]",
                        help="A/A launches of this experiment on this machine: widen the headline "
                             "throughput intervals by their launch-to-launch noise")
    args = parser.parse_args(argv)
    print(write_summary_md(args.results_dir, args.tag, [t for t in args.noise_from.split(",") if t]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
