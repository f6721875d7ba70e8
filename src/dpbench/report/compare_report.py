"""The regression check's markdown: the human-readable twin of compare's json report (it works
on the json loaded back, too). All of the report's wording lives here; the numbers and
verdicts come from dpbench.analysis.compare."""
from __future__ import annotations

import math
from typing import Any

from dpbench.analysis.compare.verdict import counted
from dpbench.report.markdown import md_table


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


def _cells_text(cells: list[dict]) -> str:
    shown = ", ".join(f"`{_run_group(c)}`" for c in cells[:8])
    return shown + (f" and {len(cells) - 8} more" if len(cells) > 8 else "")


def _sets_md(sets: dict | None) -> list[str]:
    """What the two sides are: one set compared with itself, or two experiments' sets."""
    if not sets:   # a report from before `sets` was written
        return []
    out = []
    if sets["same_set"]:
        out += [f"> **The baseline and the candidate are the same result set ({sets['same_because']}):** "
                "nothing below can differ; this compares no two launches.", ""]
    exp = sets["experiments"]
    if exp["differ"]:
        text = (f"> **The experiments differ:** the baseline has {counted(exp['baseline']['cells'], 'cell')}, "
                f"the candidate {exp['candidate']['cells']}; they share {sets['shared_cells']}, and only "
                "shared cells are compared.")
        if sets["only_baseline"]:
            text += f" Only in the baseline: {_cells_text(sets['only_baseline'])}."
        if sets["only_candidate"]:
            text += f" Only in the candidate: {_cells_text(sets['only_candidate'])}."
        out += [text, ""]
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
        judged = _enveloped(r)
        # Format 1 reports (no curve test) show their final-loss p.
        p = r.get("curve_p_holm", r.get("final_loss_p_holm")) if judged else None
        # Reports before format 3 judged every curve unpaired.
        design = (r.get("curve_design") or ("unpaired" if r.get("curve_df") else "–")) if judged else None
        sd = (f"{r['curve_sd']:.3g} ({r['curve_df']})" if judged and r.get("curve_sd") is not None else
              "–" if judged else None)
        rows.append([_run_group(r), r["repeats"], r["mode"], r["steps_matched"], r["max_abs_diff"],
                     spread, where, design, _loss_change(r.get("curve_change")) if judged else None, sd,
                     r.get("smallest_detectable") if judged else None, r.get("curve_p") if judged else None, p,
                     _mark(r, r["verdict"]),
                     "; ".join(filter(None, [r["note"], r.get("why_not_exact") if r["mode"] != "exact" else ""]))])
    return rows


def _loss_change(v: float | None) -> str:
    return "–" if v is None else f"{v:+.3g}"


def _seed_paired_rule() -> str:
    return ("; where both sides' runs carry seeds and two or more match, the test is seed-paired: "
            "the mean of the seed-matched differences (candidate - baseline) by a t-test whose "
            "variance comes from the seed-matched differences between the A/A launches (the "
            "candidate left out) where given, else from the differences themselves; otherwise the "
            "sides' difference by a t-test with the variance pooled from both sides")


def _enveloped(r: dict) -> bool:
    """Whether the row was held against the baseline's spread (exact rows after a software change)."""
    return r["mode"] != "exact" or r.get("outside_fraction") is not None


def render_markdown(report: dict) -> str:
    """The human-readable twin of the json report (works on the json loaded back, too)."""
    th, w, counts = report["thresholds"], report["warnings"], report["verdict"]["counts"]
    fail_on = report.get("fail_on") or []
    cells = len({(r["variant"], r["gpus"], r["options"]) for r in report["throughput"] + report["loss"]})
    launch, paired = report.get("noise"), report.get("paired")
    # Format 2 changes are ratios of geometric means; older reports' (no `format`) of medians.
    geo = report.get("format", 1) >= 2
    centre = "geomean" if geo else "median"
    title = (f"# dpbench compare within one launch `{paired['tag']}`: `{report['candidate']}` (candidate) "
             f"vs `{report['baseline']}` (baseline)" if paired else
             f"# dpbench compare: `{report['baseline']}` (baseline) vs `{report['candidate']}` (candidate)")
    out = [title, "",
           f"{counted(report['runs']['baseline'], 'baseline run')} against "
           f"{counted(report['runs']['candidate'], 'candidate run')}, "
           f"{counted(cells, 'cell')} (variant, GPU count, options) on both sides.", "",
           "**How noise is judged.** " + (_paired_rule(paired) if paired else _throughput_rule(th, launch))
           + (f" The A/A launches gave no throughput noise ({report['noise_unfitted']})."
              if report.get("noise_unfitted") else "")
           + " Loss curves of "
           "deterministic runs with the same seed, config and hardware must match bit for bit (after a "
           "software change their bits may move, but the curve test below must still pass); other "
           "curves face the curve test: each run's mean loss from a tenth of the way in"
           + (_seed_paired_rule() if report.get("format", 1) >= 3 else
              ", the sides' difference by a t-test with the variance pooled from both sides")
           + f", Holm over the cells, diverged when p < {th['alpha']:g} and the difference exceeds "
           f"{th['loss_tolerance']:g}. Fewer than two "
           + ("seeds matched and fewer than two runs a side" if report.get("format", 1) >= 3 else "runs a side")
           + " means the noise is unknown: no divergence is called. The "
           f"per-step band ({th['envelope_k']:g} standard errors of the baseline's spread) is shown "
           "as a picture of where curves part, not a verdict.", ""]
    out += _sets_md(report.get("sets"))
    out += _provenance_md(report["provenance"])
    fails = (", ".join(f"{k} ({counts[k]})" for k in fail_on) if fail_on else
             "nothing (no --fail-on given)")
    out += ["", f"**Verdict: {report['verdict']['line']}**", "",
            f"Fails the job: {fails}. Counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + "."]
    # A paired report since the geometric means: the centres its change is made of (older ones: medians).
    paired_geo = bool(paired) and all("geomean_baseline" in r for r in report["throughput"])
    unit = report.get("throughput_unit", "images/s")   # reports before the workload's unit: images
    sections = [
        ("Run status", "", ["run", "baseline", "candidate", "change", "reason"], [],
         [[r["run_id"], r["baseline"], r["candidate"], _mark(r, r["change"]), r["reason"]]
          for r in report["status"]]),
        (f"Throughput within the launch ({unit}, {'geometric mean' if paired_geo else 'median'} over repeats)",
         ("`change`: the ratio of the geometric means - 1, the change the test judges (its mean log "
          "change); " if paired_geo else "")
         + "`smallest`: the change this cell's test finds at 80% power (noncentral t); `p (Holm)`: adjusted "
         "over the cells; `equivalence`: two one-sided tests of the change against the margin (`within` "
         "when both reject at alpha: a change that large is ruled out), with their p.",
         ["run group", "runs", "baseline", "candidate", "change", "smallest", "p (Holm)", "verdict", "equivalence",
          "TOST p"],
         [1, 2, 3, 4, 5, 6, 9],
         [[_run_group(r), f"{r['n_baseline']}/{r['n_candidate']}",
           r.get("geomean_baseline", r["median_baseline"]), r.get("geomean_candidate", r["median_candidate"]),
           _signed(r["change"], "%", 100), _pct(r["smallest_detectable"]), r["p_holm"], _mark(r, r["verdict"]),
           _within(r), r.get("tost_p")]
          for r in report["throughput"]]) if paired else
        (f"Throughput ({unit}, {'geometric mean' if geo else 'median'} over repeats)",
         ("`vs others`: the change beyond the median change of the other cells; `floor`: the "
          "departure a verdict needs; " if launch else "`floor`: the change a verdict needs; ")
         + f"`p (Holm)`: Welch's p{' on log throughput,' if geo else ''} adjusted over the cells.",
         ["run group", "repeats", "baseline", "candidate", "change"] + (["vs others"] if launch else [])
         + ["floor", "p", "p (Holm)", "verdict", "note"],
         range(1, 9 if launch else 8),
         [[_run_group(r), f"{r['n_baseline']}/{r['n_candidate']}", r[f"{centre}_baseline"],
           r[f"{centre}_candidate"], _signed(r["change"], "%", 100)]
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
         "for bit (where: the first differing step and its difference); `envelope`: the curve test "
         "(design: seed-paired or unpaired; change: of the mean loss after the first tenth, "
         "candidate - baseline; sd (df): of a seed-matched difference (paired) or of a run's "
         "summary (unpaired), with its degrees of freedom; detectable: the change it finds at 80% "
         "power; p, and p (Holm) over the cells) beside the band picture (outside: share of steps "
         "beyond the band; where: the first such step).",
         ["run group", "repeats", "mode", "steps", "max abs diff", "outside", "where", "design", "change",
          "sd (df)", "detectable", "p", "p (Holm)", "verdict", "note"], [1, 3, 4, 5, 8, 9, 10, 11, 12],
         _loss_rows(report)),
        ("Final accuracy (test_acc, mean over repeats)", "",
         ["run group", "baseline", "candidate", "change (pp)", "p (Holm)", "verdict"], range(1, 5),
         [[_run_group(r), r["acc_baseline"], r["acc_candidate"], _signed(r["change_pp"]), r["p_holm"],
           _mark(r, r["verdict"])] for r in report["accuracy"]]),
    ]
    if report.get("mechanisms"):   # only where a side turned a knob (reports before them have none)
        sections.append(("Mechanisms (each knob's check, run by run)",
                         "A check that held in the baseline and fails in the candidate is a regression: "
                         "a count of collectives or bytes, with no noise to weigh.",
                         ["run", "knob", "check", "baseline", "candidate", "change", "candidate says"], [],
                         [[r["run_id"], r["knob"], r["check"], r["baseline"], r["candidate"],
                           _mark(r, r["change"]), r["text"]] for r in report["mechanisms"]]))
    # Numbers align right, text left (md_table's rule, as in the other reports).
    for title, note, headers, right, rows in sections:
        if title.startswith("Throughput") and launch:
            out += _launch_noise_md(launch)
        out += ["", f"## {title}", ""] + ([note, ""] if note else []) + [md_table(headers, rows, right)]
    return "\n".join(out) + "\n"


def _within(r: dict) -> str:
    """A TOST cell: "within +-2%" when shown, "not shown within +-2%" when not, "–" untested."""
    if r.get("within") is None:
        return "–"
    margin = f"±{100 * r['equivalence']:g}%"
    return f"within {margin}" if r["within"] else f"not shown within {margin}"


def _paired_rule(paired: dict) -> str:
    launch = paired["launch"]
    return (f"Both environments ran in this one launch, their runs interleaved {paired['order']} per cell "
            f"and repeat, so the noise is this launch's run-to-run spread and no shift between launches "
            f"enters ({paired['design']}). The smallest change it could have seen (80% power): "
            f"{_pct(launch['smallest_detectable'])} common to every cell, per cell in the table below. "
            f"The whole launch: {_signed(launch['change'], '%', 100)}"
            + ("" if launch["p"] is None else f" (p = {launch['p']:.3g})") + f", **{launch['verdict']}**"
            + ("" if launch.get("within") is None else
               f"; {_within({**launch, 'equivalence': paired['equivalence']})} (TOST p = {launch['tost_p']:.3g})")
            + "."
            + "".join(f" {note}" for note in paired.get("notes") or []))


def _throughput_rule(th: dict, launch: dict | None) -> str:
    if not launch:
        floor = max(th["threshold"], th["noise_floor"])
        return (f"A throughput change is called only when it exceeds {100 * floor:g}% (the larger of the "
                f"threshold and the noise floor between two launches), {th['k_spread']:g} × the repeats' "
                f"pooled coefficient of variation, and Welch's t-test reaches p < {th['alpha']:g} after "
                f"Holm's correction over the cells. No A/A launches were given (--noise-from): a change "
                f"under {100 * floor:g}% cannot be told from the shift between two launches of this machine; "
                "to see smaller ones, check the upgrade in one launch, both installs interleaved "
                "(`--config experiment=upgrade base=... cand=...`, then `compare --paired`; docs/compare.md).")
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
