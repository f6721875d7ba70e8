"""What a pipeline's runs came to, from their records: the counts and commonest reasons it
prints as its last words, and the exit status `fail_on_failed_runs` asks for."""
from __future__ import annotations

import sys
from collections import Counter
from typing import Any

from dpbench import results
from dpbench.plan.locks import needs_pipeline_lock
from dpbench.plan.matrix import Plan

def run_outcomes(plan: Plan) -> dict[str, Any]:
    """What the plan's runs came to, from their records: counts per status (`not run` where no
    record is there) and, per status, (reason, count) from the commonest down."""
    counts: Counter = Counter()
    reasons: dict[str, Counter] = {}
    for run_id in plan.runs:
        try:
            rec = results.read_metrics(plan.results.run_dir(run_id))
        except (OSError, ValueError):
            rec = {"status": results.STATUS_FAILED, "reason": "its metrics.json cannot be read"}
        status = rec.get("status", "?") if isinstance(rec, dict) else "not run"
        counts[status] += 1
        if isinstance(rec, dict) and status != results.STATUS_OK:
            reason = str(rec.get("reason") or "no reason recorded").strip().splitlines()
            line = reason[0] if reason else "no reason recorded"
            reasons.setdefault(status, Counter())[line if len(line) <= 160 else line[:157] + "..."] += 1
    return {"counts": dict(counts), "reasons": {k: v.most_common() for k, v in reasons.items()}}


def outcome_lines(plan: Plan, top: int = 3) -> list[str]:
    """The pipeline's last words: how many runs are ok, failed, skipped (and not run), with the
    commonest reasons, and where the rest is written."""
    out = run_outcomes(plan)
    counts = out["counts"]
    order = [results.STATUS_OK, results.STATUS_FAILED, results.STATUS_SKIPPED, "not run"]
    parts = [f"{counts.get(k, 0)} {k}" for k in order if counts.get(k) or k != "not run"]
    parts += [f"{n} {k}" for k, n in counts.items() if k not in order]
    lines = [f"dpbench: {len(plan.runs)} runs in {plan.results.dir}: {', '.join(parts)}"]
    for status in (results.STATUS_FAILED, results.STATUS_SKIPPED):
        for reason, n in out["reasons"].get(status, [])[:top]:
            lines.append(f"dpbench:   {status} ({n}): {reason}")
        rest = len(out["reasons"].get(status, [])) - top
        if rest > 0:
            lines.append(f"dpbench:   {status}: {rest} other reason(s)")
    if counts.get(results.STATUS_FAILED) or counts.get(results.STATUS_SKIPPED):
        lines.append(f"dpbench: every run and its reason: {plan.results.summary_md}")
    return lines


def report_outcomes(plan: Plan, targets: Any, succeeded: bool) -> int:
    """Prints `outcome_lines` (Snakemake's onsuccess and onerror) where the pipeline made or
    needs runs of this set; returns the exit status the pipeline should end with: 1 when
    `fail_on_failed_runs` is set and a run failed, else 0."""
    if not needs_pipeline_lock(targets):   # compare: no runs of this set
        return 0
    try:
        lines = outcome_lines(plan)
        failed = run_outcomes(plan)["counts"].get(results.STATUS_FAILED, 0)
    except OSError as exc:
        print(f"dpbench: cannot count the runs of {plan.results.dir} ({exc})", file=sys.stderr)
        return 0
    if plan.config.get("fail_on_failed_runs") and failed:
        lines.append(f"dpbench: {failed} run(s) failed and fail_on_failed_runs is set: the pipeline fails"
                     + ("" if succeeded else " (it failed anyway)"))
    print("\n".join(lines), file=sys.stderr, flush=True)
    return 1 if plan.config.get("fail_on_failed_runs") and failed else 0
