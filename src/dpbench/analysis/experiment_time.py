"""The perf targets' last row: the whole default experiment (the one config.yaml names) on
DEFAULT_GPUS GPUs within DEFAULT_MINUTES, judged on a result set given for it.

The set must be the default experiment as its own plan.json planned it (that experiment, on
that many GPUs, nothing given that changes its runs), hold every run of that plan with the
config the plan gave it, none failed, and keep the Snakemake log of the commands that made them
(logs/snakemake.log: the last invocation that made every run, and any that continued it after a
time limit). The records hold each run's own wall time but no start or end, so the whole
experiment's time is only in that log.
"""
from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import yaml

from dpbench import results
from dpbench.analysis import options
from dpbench.analysis.perf_cells import run_defaults
from dpbench.analysis.perf_targets import NOT_MEASURED
from dpbench.host.source import PROJECT
from dpbench.plan import pipeline
from dpbench.plan.matrix import planned_runs

# The default experiment on this many GPUs within this many minutes.
DEFAULT_EXPERIMENT = yaml.safe_load((PROJECT / "config.yaml").read_text())["experiment"]
DEFAULT_GPUS, DEFAULT_MINUTES = 2, 15
WALL_TARGET = f"the whole default experiment ({DEFAULT_EXPERIMENT}) on {DEFAULT_GPUS} GPUs (min)"
# Where a result set keeps the Snakemake log of the commands that made it: logs/snakemake.log
# (tools/device/perf.sh appends each call's to it; a committed reference packs logs/ into
# logs.tar.gz), or pipeline.log beside the tables (how the first 2-GPU reference kept it).
SNAKEMAKE_LOG = "snakemake"
LEGACY_LOG = "pipeline.log"
# Config keys a set's plan.json may have been given without changing which runs it planned or
# how they train: its name, where it is written, how many GPUs it is planned for (checked
# apart), and what the pipeline does after the runs. Any other key given (repeats, variants,
# gpus, train, matrix, ...) makes the set another experiment than the default.
LEAVES_THE_RUNS = {"experiment", "tag", "results_dir", "gpus_available", "fail_on_failed_runs",
                   "compare", "paired", "baseline", "candidate"}


def _as_its_plan_says(rs: results.ResultSet) -> tuple[str | None, dict[str, dict]]:
    """(why the set's own plan.json is not the default experiment on DEFAULT_GPUS GPUs, or None;
    the runs it planned: run id -> config as they train)."""
    try:
        doc = json.loads(rs.plan_path.read_text())
        planned = {rid: rc.to_dict() for rid, rc in planned_runs(doc).items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its {rs.plan_path.name} cannot be read ({type(exc).__name__}: {exc})", {}
    give_it = "give the default experiment's result set with --default-experiment"
    if doc.get("experiment") != DEFAULT_EXPERIMENT:
        return (f"{rs.tag} is the {doc.get('experiment')} experiment, not the default "
                f"({DEFAULT_EXPERIMENT}); {give_it}"), planned
    gpus = doc.get("gpus_planned")
    if gpus != DEFAULT_GPUS:
        return f"{rs.tag} was planned for {options.gpus_label(gpus or 0)}; the target is for {DEFAULT_GPUS}", planned
    # a plan.json written before plans kept what they were given says nothing here: its runs
    # are still checked against the records below
    changed = sorted(set(doc.get("given") or {}) - LEAVES_THE_RUNS)
    if changed:
        return (f"{rs.tag} is the default experiment with {', '.join(changed)} given, not the whole "
                f"of it; {give_it}"), planned
    return None, planned


def _as_planned_now(rs: results.ResultSet) -> tuple[str | None, dict[str, dict]]:
    """(why the default experiment cannot be planned here, or None; its runs as the checkout
    plans them now on DEFAULT_GPUS GPUs: run id -> config as they train)."""
    try:
        planned = pipeline.make_plan(pipeline.load_experiment(
            {"experiment": DEFAULT_EXPERIMENT, "gpus_available": DEFAULT_GPUS}, PROJECT)).runs
    except (pipeline.ConfigError, ImportError, OSError, ValueError) as exc:
        return f"the default experiment cannot be planned here: {exc}", {}
    return None, {rid: rc.to_dict() for rid, rc in planned.items()}


def not_the_default_experiment(folder: Path) -> tuple[str | None, int]:
    """(why the result set is not the whole default experiment on DEFAULT_GPUS GPUs, or None
    when it is: its runs and their configs as planned, none failed, the GPUs they saw; the
    number of runs the plan holds)."""
    rs = results.ResultSet.at(folder)
    if rs.plan_path.is_file():
        why, planned = _as_its_plan_says(rs)
        as_planned, plan_says = "as its plan.json planned it", "its plan.json says"
    else:
        # Older committed sets keep no plan.json: the checkout plans the default experiment again
        # and the set is judged against that (as every set was before plans were kept).
        why, planned = _as_planned_now(rs)
        as_planned, plan_says = "as planned now", "the plan now says"
    if why:
        return why, len(planned)
    found = list(results.iter_runs(rs.runs_dir, damaged=True))
    damaged = [rec.run_id for rec, _ in found if isinstance(rec, results.DamagedRecord)]
    if damaged:
        return f"{len(damaged)} of its records cannot be read (e.g. {damaged[0]})", len(planned)
    records = {rec["run_id"]: rec for rec, _ in found}
    missing, extra = sorted(set(planned) - set(records)), sorted(set(records) - set(planned))
    if len(missing) == len(planned):
        return (f"{rs.tag} holds none of the default experiment's {len(planned)} runs; give its "
                f"result set with --default-experiment"), len(planned)
    if missing or extra:
        return (f"{rs.tag} is not the default experiment {as_planned}: " + "; ".join(
            f"{len(ids)} {what} (e.g. {ids[0]})" for ids, what in (
                (missing, f"of its {len(planned)} runs missing"), (extra, "runs not in it")) if ids)), len(planned)
    defaults = run_defaults()
    for rid, plan in planned.items():
        ran = {**defaults, **(records[rid].get("config") or {})}
        differ = sorted(k for k, v in plan.items() if ran.get(k) != v)
        if differ:
            k = differ[0]
            return f"run {rid} ran with {k}={ran.get(k)!r}, {plan_says} {plan[k]!r}", len(planned)
    failed = sorted(rid for rid, rec in records.items() if rec.get("status") == results.STATUS_FAILED)
    if failed:
        return (f"{len(failed)} of its runs failed (e.g. {failed[0]}): its time is not the whole "
                f"experiment's"), len(planned)
    try:
        seen = len(results.widest_gpu_names(rs.provenance()))
    except (OSError, ValueError):
        seen = max((len((rec.get("provenance") or {}).get("gpu_names") or []) for rec in records.values()),
                   default=0)
    if seen != DEFAULT_GPUS:
        return f"its runs saw {options.gpus_label(seen)}; the target is for {DEFAULT_GPUS}", len(planned)
    return None, len(planned)


def snakemake_log(folder: Path) -> tuple[str | None, str]:
    """(the text of the Snakemake log the result set keeps, where it was), or (None, where it
    was looked for)."""
    rs = results.ResultSet.at(folder)
    for path in (rs.log_path(SNAKEMAKE_LOG), rs.dir / LEGACY_LOG):
        if path.is_file():
            return path.read_text(errors="replace"), rs.relative(path)
    packed = rs.dir / "logs.tar.gz"   # a committed reference (dpbench.results.reference packs logs/)
    member = f"{rs.logs_dir.name}/{SNAKEMAKE_LOG}.log"
    if packed.is_file():
        with tarfile.open(packed) as tar:
            try:
                return tar.extractfile(member).read().decode(errors="replace"), f"{packed.name}:{member}"
            except (KeyError, AttributeError):
                pass
    return None, f"{rs.relative(rs.log_path(SNAKEMAKE_LOG))} or {LEGACY_LOG}"


def snakemake_seconds(text: str, runs: int) -> tuple[float | None, str]:
    """The wall time in seconds of the Snakemake invocations that made the result set, and what
    it counts; or (None, why). They are the last invocation that planned every run (its job
    table trains all `runs`) and those that continued it (a call stopped by a time limit and
    resumed): their times add up, an upper bound where a run stopped midway was made again. The
    last of them must have finished all its steps."""
    tables_at = [m.start() for m in re.finditer(r"^Job stats:$", text, re.M)]
    whole = [at for at in tables_at if (m := re.search(r"^train\s+(\d+)$", text[at:], re.M))
             and int(m.group(1)) == runs]
    if not whole:
        return None, (f"no Snakemake invocation in the log made all {runs} runs (the others were made "
                      f"before it)" if tables_at else "the log holds no Snakemake job table")
    since = text[whole[-1]:]
    steps = re.findall(r"(\d+) of (\d+) steps \(\d+%\) done", since)
    if not steps or steps[-1][0] != steps[-1][1]:
        return None, (f"the log stops at {steps[-1][0]} of {steps[-1][1]} steps" if steps
                      else "the log shows no finished step")
    pieces = len(tables_at) - tables_at.index(whole[-1])
    how = f" of {pieces} Snakemake invocations, each continuing the one before" if pieces > 1 else ""
    if wall := re.findall(r"^pipeline wall time: (\d+(?:\.\d+)?) s\b", since, re.M):
        return sum(map(float, wall)), f"the command's wall time{how}"
    if elapsed := re.findall(r"Elapsed time: (\d+):(\d\d):(\d\d(?:\.\d+)?)", since):
        return sum(int(h) * 3600 + int(m) * 60 + float(sec) for h, m, sec in elapsed), f"Snakemake's elapsed time{how}"
    return None, "the log gives no wall time (no 'pipeline wall time' or 'Elapsed time' line)"


def default_experiment_row(folder: Path) -> dict:
    """The target row of the whole default experiment's time, judged on the result set at folder."""
    row = {"target": WALL_TARGET, "kind": "wall", "goal": DEFAULT_MINUTES, "setting": "",
           "measured": None, "low": None, "high": None, "interval": "", "result_set": folder.name}
    why, runs = not_the_default_experiment(folder)
    if why is None:
        text, where = snakemake_log(folder)
        if text is None:
            why = (f"{folder.name} keeps no Snakemake log ({where}); its records hold each run's wall "
                   f"time but no start or end, so the whole experiment's time is not in them")
        else:
            seconds, what = snakemake_seconds(text, runs)
            if seconds is None:
                why = f"{where}: {what}"
    if why:
        return {**row, "outcome": NOT_MEASURED, "verdict": f"{NOT_MEASURED} ({why})"}
    outcome = "pass" if seconds / 60 <= DEFAULT_MINUTES else "FAIL"
    return {**row, "measured": seconds / 60, "outcome": outcome,
            "verdict": f"{outcome} ({what}, {seconds:.0f} s, from {folder.name}/{where})"}

