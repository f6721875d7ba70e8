"""The claims experiment in time-boxed calls (tools/device/pipeline_run.sh): which jobs first,
and which records a cut gives back.

    python3 -m dpbench.claims.priority first [EXPERIMENT]     output paths, one a line, for snakemake --prioritize
    python3 -m dpbench.claims.priority cut-off RUNS_DIR SINCE  drop failed records written since SINCE (epoch s)
    python3 -m dpbench.claims.priority stale [EXPERIMENT]     drop skipped records of runs this machine can run

First come the parts the ledger's headline verdicts rest on: C8's fp32 batch sweep on the gpu
feed (the article's premise as a curve, with its crossover), C1 at its narrowest and widest
output (where the article is right about device 0, and where not), and the C7 probe (the
DataParallel step breakdown that C7 and C8 name their cause from). The rest follows: C8's bf16
sweep and the article's own recipe, C1's middle widths, C6, C7's benchmark-on runs and the other
probes. The groups are found by claim and by what they train (precision, feed, output width),
not by name; an experiment without them prints nothing, and Snakemake then keeps its own order.

A cut stops every job with a signal. A DDP run stopped that way still writes a record, saying
it failed (the launcher's rule: every DDP run leaves one), and Snakemake keeps that record as
the job's output: without `cut-off` the run would never train again.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from dpbench import results
from dpbench.claims.settings import claim_groups
from dpbench.plan.config import RunConfig
from dpbench.plan.matrix import Plan
from dpbench.plan.pipeline import load_experiment, make_plan

FIRST_PROBES = ("C7",)


def _group_runs(plan: Plan) -> dict[str, list[tuple[str, RunConfig]]]:
    """Group name -> its planned runs, as the plan made them (Plan.group_runs)."""
    return {name: sorted(runs.items()) for name, runs in plan.group_runs.items()}


def first_targets(plan: Plan) -> list[str]:
    groups = {name: runs for name, runs in _group_runs(plan).items() if runs}
    first = [r for g in claim_groups(groups, "C8") for r in groups[g]
             if groups[g][0][1].precision == "fp32" and groups[g][0][1].feed == "gpu"]
    c1 = claim_groups(groups, "C1")
    widths = [groups[g][0][1].num_classes for g in c1]
    first += [r for g in c1 for r in groups[g] if groups[g][0][1].num_classes in (min(widths), max(widths))]
    rids = sorted({rid for rid, rc in first if not plan.skipped(rc)})
    return [str(plan.results.metrics_path(rid)) for rid in rids] + \
        [str(plan.results.probe_path(c)) for c in FIRST_PROBES if c in plan.config["probes"] and rids]


def drop_cut_off(runs_dir: Path | str, since: float) -> list[str]:
    """Delete the failed records written since `since` (seconds since the epoch; a second's
    slack for the file system's clock): the runs a cut stopped, which must train again. Returns
    their run ids. A run that failed before the cut keeps its record: that failure is a result."""
    dropped = []
    for path in sorted(Path(runs_dir).glob(f"*/{results.METRICS}")):
        rec = results.read_metrics(path.parent) or {}
        if path.stat().st_mtime >= since - 1 and rec.get("status") == results.STATUS_FAILED:
            path.unlink()
            dropped.append(path.parent.name)
    return dropped


def drop_stale_skips(plan: Plan) -> list[str]:
    """Delete the skipped records of runs this plan does not skip: a result set carried from a
    machine with fewer GPUs keeps its "needs 2 GPUs" records, which Snakemake (without its own
    metadata) takes as done, so those runs would never train here. Returns their run ids."""
    dropped = []
    for rid, rc in sorted(plan.runs.items()):
        path = plan.results.metrics_path(rid)
        rec = results.read_metrics(path.parent) if path.is_file() else None
        if rec and rec.get("status") == results.STATUS_SKIPPED and not plan.skipped(rc):
            path.unlink()
            dropped.append(rid)
    return dropped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    first = sub.add_parser("first", help="output paths to prioritise, one a line")
    first.add_argument("experiment", nargs="?", default="claims")
    stale = sub.add_parser("stale", help="drop skipped records of runs this machine can run")
    stale.add_argument("experiment", nargs="?", default="claims")
    cut = sub.add_parser("cut-off", help="drop the failed records a cut left")
    cut.add_argument("runs_dir")
    cut.add_argument("since", type=float, help="when the cut came, in seconds since the epoch")
    args = ap.parse_args(argv)
    if args.command == "cut-off":
        for rid in drop_cut_off(args.runs_dir, args.since):
            print(f"cut off by the limit, trains again next call: {rid}")
        return 0
    config = {**(yaml.safe_load(Path("config.yaml").read_text()) or {}), "experiment": args.experiment}
    plan = make_plan(load_experiment(config, "."))
    if args.command == "stale":
        for rid in drop_stale_skips(plan):
            print(f"skipped where it was made, runs here: {rid}")
        return 0
    print("\n".join(first_targets(plan)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
