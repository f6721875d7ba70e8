#!/usr/bin/env python3
"""The performance targets, read off the perf experiment's results (a benchmark, not a test:
it prints and never fails).

    python3 tools/device/perf_targets.py [results/perf-torch-<version>] [--default-experiment DIR]
        [--md FILE] [--json FILE] [--figure FILE.png] [--sweep-figure FILE.png]

Every ratio compares runs of one result set, so they were measured together on one machine.
A cell is found by its run's settings (its metrics.json config; without one, the experiment's
`train` block and the run's options); a cell of several repeats counts with its median and the
interval dpbench.analysis.tables gives it. An epoch is the training split the runs' records name.
Also printed: every DDP cell with its knobs (the bucket size in effect: the run's, or PyTorch's
default as the torch here builds it, said as such), its compile time and its efficiency against
as many single runs of the same setup at the per-GPU batch (dpbench.analysis.tables' weak efficiency);
the single-GPU recipes with their compile times; and for every run how far images/s is from
what its median step time implies (a gap means untimed work crept into the timed steps, or a
few slow steps: both worth a look).

The last target, the whole default experiment on 2 GPUs within 15 minutes, is judged on the
result set given with --default-experiment (else on this one): it must hold the default
experiment's runs as planned now, on 2 GPUs, none failed, and keep the Snakemake log of the
commands that made them (logs/snakemake.log: the last invocation that made every run, and any
that continued it after a time limit). The records hold each run's own wall time but no start
or end, so the whole experiment's time is only in that log.

A target whose cell (or baseline) has no measurement reads "not measured (<why>)", never a
verdict. --figure draws what each step of the fast single-GPU recipe buys (and the DDP cells
beside it once any was measured); --sweep-figure draws DDP's throughput against bucket size.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import re
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from dpbench import results  # noqa: E402  (after the path that finds them)
from dpbench.analysis import tables  # noqa: E402

# The layouts the targets speak of (everything else at the experiment's settings: gpu feed,
# no compile, cudnn.benchmark off).
FP32 = {"precision": "fp32", "channels_last": False}
FP32_CL = {"precision": "fp32", "channels_last": True}
BF16_CL = {"precision": "bf16", "channels_last": True}
EAGER = {"feed": "gpu", "compile": "none", "cudnn_benchmark": False, "fused_sgd": False}


def single(layout: dict, batch: int, **extra) -> dict:
    return {"variant": "single", "gpus": 1, "global_batch": batch, **layout, **EAGER, **extra}


def ddp2(layout: dict, scaling: str, batch: int, **extra) -> dict:
    sel = {"variant": "ddp", "gpus": 2, **layout, **EAGER, **extra}
    return {**sel, "per_gpu_batch": batch} if scaling == "weak" else {**sel, "per_gpu_batch": None,
                                                                         "global_batch": batch}


# (name, kind, numerator cell, denominator cell or None, factor, target)
#   ratio:      numerator images/s >= target x factor x denominator images/s
#   epoch:      training split / numerator images/s <= target seconds
TARGETS = [
    ("ddp fp32, 2 GPUs, strong (global 512) vs 2 x single at 256", "ratio",
     ddp2(FP32, "strong", 512), single(FP32, 256), 2, 0.97),
    ("ddp fp32, 2 GPUs, weak (512 per GPU) vs 2 x single at 512", "ratio",
     ddp2(FP32, "weak", 512), single(FP32, 512), 2, 0.98),
    ("ddp bf16 + channels_last, 2 GPUs, weak vs 2 x single", "ratio",
     ddp2(BF16_CL, "weak", 512), single(BF16_CL, 512), 2, 0.90),
    ("single fp32 + channels_last epoch (s)", "epoch", single(FP32_CL, 512), None, 1, 1.4),
    ("single fp32 + channels_last vs the same loop fed one fixed batch", "ratio",
     single(FP32_CL, 512), single(FP32_CL, 512, feed="fixed"), 1, 0.97),
    ("single bf16 + channels_last epoch (s)", "epoch", single(BF16_CL, 512), None, 1, 0.80),
    ("single bf16 + channels_last vs the same loop fed one fixed batch", "ratio",
     single(BF16_CL, 512), single(BF16_CL, 512, feed="fixed"), 1, 0.97),
    # the same two targets for the compiled recipe (CUDA graphs: eager bf16 is launch-bound)
    ("single bf16 + channels_last, compiled (reduce-overhead), epoch (s)", "epoch",
     single(BF16_CL, 512, compile="reduce-overhead"), None, 1, 0.80),
    ("single bf16 + channels_last, compiled (reduce-overhead), vs the same loop fed one fixed batch", "ratio",
     single(BF16_CL, 512, compile="reduce-overhead"),
     single(BF16_CL, 512, compile="reduce-overhead", feed="fixed"), 1, 0.97),
    ("ddp fp32 + channels_last, 2 GPUs, weak vs 2 x single in that layout", "ratio",
     ddp2(FP32_CL, "weak", 512), single(FP32_CL, 512), 2, 0.95),
    # eager bf16 without compiling: where the device's work covers the host's (batch 1024), and
    # with one fused kernel for SGD (fewer launches at 512)
    ("single bf16 + channels_last, batch 1024, epoch (s)", "epoch", single(BF16_CL, 1024), None, 1, 0.80),
    ("single bf16 + channels_last, fused SGD, epoch (s)", "epoch",
     {**single(BF16_CL, 512), "fused_sgd": True}, None, 1, 0.80),
]

# The issue's last target: the default experiment (the one config.yaml names), as planned now,
# on this many GPUs within this many minutes.
DEFAULT_EXPERIMENT = yaml.safe_load((ROOT / "config.yaml").read_text())["experiment"]
DEFAULT_GPUS, DEFAULT_MINUTES = 2, 15
WALL_TARGET = f"the whole default experiment ({DEFAULT_EXPERIMENT}) on {DEFAULT_GPUS} GPUs (min)"
# Where a result set keeps the Snakemake log of the commands that made it: logs/snakemake.log
# (tools/device/perf.sh appends each call's to it; a committed reference packs logs/ into
# logs.tar.gz), or pipeline.log beside the tables (how the first 2-GPU reference kept it).
SNAKEMAKE_LOG = "snakemake"
LEGACY_LOG = "pipeline.log"
NOT_MEASURED = "not measured"


# -- reading the result set ----------------------------------------------------------------------

def find_result_set(given: str | None) -> Path:
    if given:
        path = Path(given)
        return path.parent if path.name == "summary.csv" else path
    found = sorted((ROOT / "results").glob("perf-*/summary.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit("no results/perf-*/summary.csv: run the perf experiment first "
                 "(snakemake --cores all --config experiment=perf), or name the result set")
    return found[-1].parent


def run_defaults() -> dict:
    from dpbench.plan.config import RunConfig
    return RunConfig().to_dict()


def experiment_train(name: str = "perf") -> dict:
    base = run_defaults()
    path = ROOT / "experiments" / f"{name}.yaml"
    if path.exists():
        base.update((yaml.safe_load(path.read_text()) or {}).get("train", {}))
    return base


def read_record(rs: results.ResultSet, rid: str) -> results.RunRecord | None:
    """The run's record (None when it has none, or none that can be read)."""
    try:
        return rs.record(rid)
    except (OSError, ValueError, TypeError, AttributeError):   # a damaged record: use the table
        return None


def _num(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def settings(row: dict, rec: results.RunRecord | None, train: dict) -> dict:
    """The run's settings: its recorded config, else the experiment's train block and its options."""
    if rec is not None and rec.config:
        # a record from before a setting existed ran at that setting's default
        return {**run_defaults(), **rec.config}
    cfg = {**train, **tables.parse_options(row.get("options", ""))}
    for key in ("variant", "precision", "feed"):
        if row.get(key):
            cfg[key] = row[key]
    for key in ("gpus", "global_batch"):
        if _num(row.get(key)) is not None:
            cfg[key] = int(_num(row[key]))
    if cfg.get("per_gpu_batch") is None and row.get("scaling") == "weak":
        cfg["per_gpu_batch"] = cfg["global_batch"] // cfg["gpus"]
    return cfg


def load_cells(folder: Path) -> list[dict]:
    """One entry per cell (run id without its repeat): its settings, its runs' statuses and
    reasons, and from its ok runs images/s (median and interval), the median p50 step time,
    the training split's size, the compile time, the torch versions, and the efficiency
    against gpus x single of the same setup at the per-GPU batch (dpbench.analysis.tables.cells)."""
    rs = results.ResultSet.at(folder)
    summary = tables.load_table(rs.root, rs.tag, "summary")
    estimated = {(c["options"], c["variant"], int(c["gpus"])): c
                 for c in tables.cells(summary).to_dict("records")}
    train = experiment_train()
    cells: dict[str, dict] = {}
    for row in summary.to_dict("records"):
        parts = results.parse_run_id(row["run_id"])
        rec = read_record(rs, row["run_id"])
        cell = cells.setdefault(parts.cell if parts else row["run_id"], {
            "cell": parts.cell if parts else row["run_id"], "ips": [], "p50": [], "status": [],
            "reasons": [], "sizes": set(), "compiles": [], "torch": set(),
            "settings": settings(row, rec, train),
            "tables": estimated.get((row["options"], row["variant"], int(_num(row["gpus"]) or 0)))})
        cell["status"].append(row["status"])
        ips = _num(row["images_per_s"])
        if row["status"] == results.STATUS_OK and ips:
            cell["ips"].append(ips)
            cell["p50"].append(_num(row["step_ms_p50"]))
            raw = rec.raw if rec is not None else {}
            prov, throughput = raw.get("provenance") or {}, raw.get("throughput") or {}
            if _num((prov.get("dataset") or {}).get("train_size")):
                cell["sizes"].add(int(prov["dataset"]["train_size"]))
            if _num(throughput.get("compile_s")) is not None:
                cell["compiles"].append(float(throughput["compile_s"]))
            if prov.get("torch"):
                cell["torch"].add(str(prov["torch"]))
        elif row.get("reason"):
            cell["reasons"].append(row["reason"])
    for cell in cells.values():
        est = tables.median_ci(cell["ips"])
        cell["ips_est"] = est
        cell["images_per_s"] = est.value if cell["ips"] else None
        p50 = [p for p in cell["p50"] if p]
        cell["p50_ms"] = statistics.median(p50) if p50 else None
        # repeats that name different training splits have no one epoch
        cell["train_size"] = next(iter(cell["sizes"])) if len(cell["sizes"]) == 1 else None
        cell["compile_s"] = statistics.median(cell["compiles"]) if cell["compiles"] else None
        row = cell.pop("tables")
        cell["efficiency"] = tables.cell_estimate(row, "efficiency_weak") if row else tables.NONE
        cell["efficiency_reference"] = row["weak_reference"] if row else ""
    return list(cells.values())


def matches(cell: dict, selector: dict) -> bool:
    s = cell["settings"]
    return all(s.get(k) == v for k, v in selector.items())


def epoch_estimate(cell: dict) -> tables.Estimate:
    """The epoch's time, the training split over images/s (the interval's ends swap over)."""
    size, ips = cell["train_size"], cell["ips_est"]
    if not size or cell["images_per_s"] is None:
        return tables.NONE
    return tables.Estimate(size / ips.value, size / ips.high, size / ips.low, ips.level)


# -- DDP's knobs in words ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def pytorch_bucket_mb() -> tuple[float | None, str]:
    """DDP's bucket size where a run leaves bucket_cap_mb unset, as the torch here builds it (a
    one-rank gloo group around a one-parameter model): (MB, torch's version), or (None, why)."""
    try:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as exc:
        return None, f"torch does not import here ({exc})"

    def built() -> float:
        return DistributedDataParallel(torch.nn.Linear(1, 1)).bucket_bytes_cap / 2**20

    try:
        if dist.is_initialized():
            return built(), torch.__version__
        with tempfile.TemporaryDirectory() as folder:
            dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
            try:
                return built(), torch.__version__
            finally:
                dist.destroy_process_group()
    except (RuntimeError, ValueError) as exc:
        return None, f"no DDP could be built here ({exc})"


def effective_bucket(cell: dict) -> tuple[float | None, str]:
    """(MB, note): the run's bucket_cap_mb, or PyTorch's default (the note says so, and which
    torch said it where the runs used another); MB is None when neither is known."""
    mb = cell["settings"].get("bucket_cap_mb")
    if mb is not None:
        return float(mb), ""
    default, here = pytorch_bucket_mb()
    if default is None:
        return None, f"PyTorch's default, unknown: {here}"
    ran = sorted(cell["torch"])
    note = "PyTorch's default" + (f" in torch {here}; the runs used {', '.join(ran)}" if ran and ran != [here] else "")
    return default, note


def knobs_words(settings: dict) -> str:
    """The knobs other than the bucket size: 'views + static graph, no buffer sync'."""
    views, static = settings.get("gradient_as_bucket_view"), settings.get("static_graph")
    words = ("views + static graph" if views and static else "gradient views" if views
             else "static graph" if static else "knobs off")
    return words + (", no buffer sync" if settings.get("broadcast_buffers") is False else "")


def bucket_words(cell: dict) -> str:
    mb, note = effective_bucket(cell)
    return (f"bucket {mb:g} MB" if mb is not None else "bucket size unknown") + (f" ({note})" if note else "")


def knobs_label(cell: dict) -> str:
    """'bucket 25 MB, views + static graph' for a DDP cell; '' for the others."""
    if cell["settings"].get("variant") != "ddp":
        return ""
    return f"{bucket_words(cell)}, {knobs_words(cell['settings'])}"


def layout_words(settings: dict) -> str:
    return f"{settings['precision']}{' + channels_last' if settings.get('channels_last') else ''}"


# -- the tables -------------------------------------------------------------------------------------

def why_unmeasured(cell: dict) -> str:
    """'skipped: needs 2 GPUs, 1 visible': the cell's status and first reason, without the
    reason's trailing detail in parentheses."""
    status = "/".join(sorted(set(cell["status"]) - {"ok"})) or "no images/s recorded"
    # the detail is the first " (" on: it may nest parentheses of its own ("for 1 GPU(s))")
    reason = cell["reasons"][0].split(" (", 1)[0].strip() if cell["reasons"] else ""
    if len(reason) > 80:
        reason = reason[:77].rstrip() + "..."
    return f"{status}: {reason}" if reason else status


def repeats_note(cell: dict) -> str:
    """' (1 of 2 repeats)' when some repeats of a measured cell did not finish ok."""
    n = len(cell["status"])
    return f" ({len(cell['ips'])} of {n} repeats)" if len(cell["ips"]) < n else ""


def target_rows(cells: list[dict]) -> list[dict]:
    """One row per target and numerator cell. `outcome` is pass, FAIL or not measured; `verdict`
    says it in words (why a cell was not measured, how many repeats counted, or that the goal
    lies inside the measurement's interval)."""
    rows = []
    for name, kind, num_sel, den_sel, factor, target in TARGETS:
        nums = [c for c in cells if matches(c, num_sel)]
        dens = [c for c in cells if den_sel and matches(c, den_sel)]
        base = {"target": name, "kind": kind, "goal": target, "setting": "", "measured": None,
                "low": None, "high": None, "interval": ""}
        if not nums:
            rows.append({**base, "outcome": NOT_MEASURED,
                         "verdict": f"{NOT_MEASURED} (no run of this cell in the result set)"})
            continue
        if den_sel is not None and len(dens) != 1:
            why = "no baseline run in the result set" if not dens else f"{len(dens)} cells match the baseline"
            rows.append({**base, "outcome": NOT_MEASURED, "verdict": f"{NOT_MEASURED} ({why})"})
            continue
        den_cell = dens[0] if dens else None
        den = den_cell["images_per_s"] if den_cell else None
        for c in sorted(nums, key=lambda c: -(c["images_per_s"] or 0)):
            row = {**base, "setting": knobs_label(c), "images_per_s": c["images_per_s"],
                   "baseline_images_per_s": den, "cell": c["cell"]}
            why = (why_unmeasured(c) if c["images_per_s"] is None else
                   f"baseline {why_unmeasured(den_cell)}" if den_cell is not None and den is None else
                   "its records name no training split" if kind == "epoch" and not c["train_size"] else None)
            if why:
                rows.append({**row, "outcome": NOT_MEASURED, "verdict": f"{NOT_MEASURED} ({why})"})
                continue
            if kind == "epoch":
                est, n = epoch_estimate(c), len(c["ips"])
                outcome = "pass" if est.value <= target else "FAIL"
            else:
                est = tables.ratio_ci(c["ips"], den_cell["ips"], factor)
                n = min(len(c["ips"]), len(den_cell["ips"]))
                outcome = "pass" if est.value >= target else "FAIL"
            inside = (_num(est.low) is not None) and min(est.low, est.high) < target < max(est.low, est.high)
            verdict = (outcome + repeats_note(c)
                       + (repeats_note(den_cell).replace(" (", " (baseline ") if den_cell else "")
                       + (" (the goal lies inside the interval)" if inside else ""))
            rows.append({**row, "measured": est.value, "low": _num(est.low), "high": _num(est.high),
                         "interval": tables.interval_text(est, "{:.3f}" if kind == "ratio" else "{:.2f}", n),
                         "outcome": outcome, "verdict": verdict})
    return rows


# -- the whole default experiment's time ------------------------------------------------------------

def not_the_default_experiment(folder: Path) -> tuple[str | None, int]:
    """(why the result set is not the default experiment as planned now on DEFAULT_GPUS GPUs,
    or None when it is: its runs and their configs, none failed, the GPUs they saw; the
    number of runs the plan holds)."""
    from dpbench.plan import pipeline
    rs = results.ResultSet.at(folder)
    try:
        planned = pipeline.make_plan(pipeline.load_experiment(
            {"experiment": DEFAULT_EXPERIMENT, "gpus_available": DEFAULT_GPUS}, ROOT)).runs
    except (pipeline.ConfigError, ImportError, OSError, ValueError) as exc:
        return f"the default experiment cannot be planned here: {exc}", 0
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
        return (f"{rs.tag} is not the default experiment as planned now: " + "; ".join(
            f"{len(ids)} {what} (e.g. {ids[0]})" for ids, what in (
                (missing, f"of its {len(planned)} runs missing"), (extra, "runs not in it")) if ids)), len(planned)
    defaults = run_defaults()
    for rid, rc in planned.items():
        plan, ran = rc.to_dict(), {**defaults, **(records[rid].get("config") or {})}
        differ = sorted(k for k, v in plan.items() if ran.get(k) != v)
        if differ:
            k = differ[0]
            return f"run {rid} ran with {k}={ran.get(k)!r}, the plan now says {plan[k]!r}", len(planned)
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
        return f"its runs saw {tables.gpus_label(seen)}; the target is for {DEFAULT_GPUS}", len(planned)
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


# -- the DDP cells, the single-GPU recipes, the agreement of images/s and p50 -----------------------

def sweep_rows(cells: list[dict]) -> list[dict]:
    """Every measured ddp cell, by GPUs, layout and scaling: its bucket size in effect, the other
    knobs, compile mode and time, images/s, and its efficiency against gpus x single of the same
    setup at the per-GPU batch (dpbench.analysis.tables; None where no such single run was measured)."""
    out = []
    for c in cells:
        s = c["settings"]
        if s.get("variant") != "ddp" or c["images_per_s"] is None:
            continue
        mb, note = effective_bucket(c)
        ips, eff = c["ips_est"], c["efficiency"]
        out.append({"cell": c["cell"], "gpus": s["gpus"], "layout": layout_words(s),
                    "scaling": "weak" if s.get("per_gpu_batch") else "strong",
                    "global_batch": s["global_batch"], "per_gpu_batch": s["global_batch"] // s["gpus"],
                    "bucket_mb": mb, "bucket_note": note, "knobs": knobs_words(s), "setting": knobs_label(c),
                    "compile": s.get("compile", "none"), "compile_s": c["compile_s"],
                    "images_per_s": ips.value, "images_per_s_low": _num(ips.low),
                    "images_per_s_high": _num(ips.high),
                    "epoch_s": c["train_size"] / ips.value if c["train_size"] else None,
                    "efficiency": _num(eff.value), "efficiency_low": _num(eff.low),
                    "efficiency_high": _num(eff.high),
                    "efficiency_interval": tables.interval_text(eff, "{:.3f}", len(c["ips"]))
                    if (_num(eff.value) is not None) else "", "reference": c["efficiency_reference"]})
    return sorted(out, key=lambda r: (r["gpus"], r["layout"], r["scaling"], r["compile"], r["knobs"],
                                      r["bucket_mb"] or 0))


def fastest_rows(cells: list[dict]) -> list[dict]:
    """Every single-GPU cell, fastest first: epoch time, compile time and what it turned on."""
    out = []
    for c in cells:
        s = c["settings"]
        if s.get("variant") != "single" or c["images_per_s"] is None:
            continue
        recipe = [s["precision"], "channels_last" if s.get("channels_last") else "contiguous",
                  f"batch {s['global_batch']}", f"feed {s['feed']}"]
        if s.get("cudnn_benchmark"):
            recipe.append("cudnn.benchmark")
        if s.get("fused_sgd"):
            recipe.append("fused SGD")
        if s.get("compile", "none") != "none":
            recipe.append(f"compile {s['compile']}")
        out.append({"recipe": ", ".join(recipe), "images_per_s": c["images_per_s"],
                    "epoch_s": _num(epoch_estimate(c).value), "compile_s": c["compile_s"]})
    return sorted(out, key=lambda r: -r["images_per_s"])


def agreement_rows(cells: list[dict]) -> list[dict]:
    """images/s against global batch / p50: equal when every timed step takes the median time."""
    out = []
    for c in cells:
        if c["images_per_s"] is None or not c["p50_ms"]:
            continue
        from_p50 = c["settings"]["global_batch"] / (c["p50_ms"] / 1e3)
        out.append({"cell": c["cell"], "images_per_s": c["images_per_s"], "from_p50": from_p50,
                    "gap": c["images_per_s"] / from_p50 - 1})
    return sorted(out, key=lambda r: -abs(r["gap"]))


def epoch_words(cells: list[dict]) -> str:
    """'epoch = 50,000 images', or what the cells' training splits are when they differ."""
    sizes = sorted({c["train_size"] for c in cells if c["train_size"]})
    if len(sizes) == 1:
        return f"epoch = {sizes[0]:,} images"
    return "epoch = each run's training split" if sizes else "no run names its training split"


def fmt(value, spec: str = ",.0f") -> str:
    return "" if value is None else format(value, spec)


def outcome_counts(rows: list[dict]) -> str:
    """'2 pass, 1 FAIL, 12 not measured (of 15 rows)'."""
    counts = [(o, sum(r["outcome"] == o for r in rows)) for o in ("pass", "FAIL", NOT_MEASURED)]
    return ", ".join(f"{n} {o}" for o, n in counts if n) + f" (of {len(rows)} rows)"


GOAL = {"epoch": "<= {:g} s", "ratio": ">= {:g}", "wall": "<= {:g} min"}
MEASURED = {"epoch": ".2f", "ratio": ".3f", "wall": ".1f"}


def markdown(folder: Path, cells: list[dict], targets: list[dict]) -> str:
    lines = [f"# Performance targets: {folder.name}", "", f"Targets: {outcome_counts(targets)}.", "",
             "| target | goal | DDP knobs | measured | interval | images/s | baseline images/s | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in targets:
        lines.append(f"| {r['target']} | {GOAL[r['kind']].format(r['goal'])} | {r['setting']} | "
                     f"{fmt(r['measured'], MEASURED[r['kind']])} | {r['interval']} | "
                     f"{fmt(r.get('images_per_s'))} | {fmt(r.get('baseline_images_per_s'))} | {r['verdict']} |")
    lines += ["", "## DDP: knobs", ""]
    sweep = sweep_rows(cells)
    if sweep:
        lines += ["vs GPUs x single: images/s over GPUs x the single run of the same setup at the "
                  f"per-GPU batch ({epoch_words(cells)}).", "",
                  "| GPUs | layout | scaling | global batch | bucket | knobs | compile | compile (s) | "
                  "images/s | vs GPUs x single |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sweep:
            eff = fmt(r["efficiency"], ".3f") + (f" ({r['efficiency_interval']})"
                                                  if r["efficiency_low"] is not None else "")
            bucket = (f"{r['bucket_mb']:g} MB" if r["bucket_mb"] is not None else "unknown") + (
                f" ({r['bucket_note']})" if r["bucket_note"] else "")
            lines.append(f"| {r['gpus']} | {r['layout']} | {r['scaling']} | {r['global_batch']} | {bucket} | "
                         f"{r['knobs']} | {r['compile']} | {fmt(r['compile_s'], '.1f')} | "
                         f"{fmt(r['images_per_s'])} | {eff or 'no single run of its setup'} |")
    else:
        lines.append(f"No DDP cell was measured{ddp_unmeasured_words(cells)}.")
    lines += ["", "## One GPU, fastest first", "", f"{epoch_words(cells).capitalize()}.", "",
              "| recipe | images/s | epoch (s) | compile (s) |", "|---|---|---|---|"]
    lines += [f"| {r['recipe']} | {fmt(r['images_per_s'])} | {fmt(r['epoch_s'], '.2f')} | {fmt(r['compile_s'], '.1f')} |"
              for r in fastest_rows(cells)]
    agree = agreement_rows(cells)
    if agree:
        worst = agree[0]
        lines += ["", f"images/s against batch / p50 step time: worst gap {worst['gap']:+.1%} "
                      f"({worst['cell']}: {worst['images_per_s']:,.0f} vs {worst['from_p50']:,.0f}); "
                      f"{sum(abs(r['gap']) > 0.03 for r in agree)} of {len(agree)} cells beyond 3%"]
    skipped = [c for c in cells if c["images_per_s"] is None]
    if skipped:
        lines += ["", "Cells without a measurement:"]
        lines += [f"- {c['cell']}: {', '.join(sorted(set(c['status'])))}"
                  f"{': ' + c['reasons'][0][:160] if c['reasons'] else ''}" for c in skipped]
    return "\n".join(lines) + "\n"


def ddp_unmeasured_words(cells: list[dict]) -> str:
    """' (10 cells skipped: needs 2 GPUs, 1 visible)': why the DDP cells have no measurement."""
    ddp = [c for c in cells if c["settings"].get("variant") == "ddp" and c["images_per_s"] is None]
    if not ddp:
        return ""
    whys = sorted({why_unmeasured(c) for c in ddp})
    return f" ({len(ddp)} cell{'s' if len(ddp) > 1 else ''} {'; '.join(whys)})"


def machine_words(folder: Path) -> str:
    """'NVIDIA H200, torch 2.11.0+cu130' from the result set's provenance (its name without one)."""
    try:
        prov = results.ResultSet.at(folder).provenance()
    except (OSError, ValueError):
        return folder.name
    gpus = results.gpu_models(prov)
    torch = results.provenance_values(prov, "torch")
    words = ", ".join(x for x in [" / ".join(gpus), torch and "torch " + " / ".join(map(str, torch))] if x)
    return words or folder.name


# -- the recipe figure ---------------------------------------------------------------------------

# The fast single-GPU recipe, one step at a time (label, selector); the compile steps follow.
RECIPE = [
    ("fp32, contiguous", single(FP32, 512)),
    ("+ channels_last", single(FP32_CL, 512)),
    ("bf16 + channels_last", single(BF16_CL, 512)),
    ("+ cudnn.benchmark", single(BF16_CL, 512, cudnn_benchmark=True)),
]
# What the loop would reach without its data feed: the same step fed one fixed batch, drawn
# below the step of its layout.
CEILINGS = {"+ channels_last": ("ceiling: one fixed batch (fp32)", single(FP32_CL, 512, feed="fixed")),
            "bf16 + channels_last": ("ceiling: one fixed batch (bf16)", single(BF16_CL, 512, feed="fixed"))}
COMPILE_MODES = ("default", "max-autotune", "reduce-overhead")


def _one(cells: list[dict], selector: dict) -> dict | None:
    found = [c for c in cells if matches(c, selector)]
    return found[0] if len(found) == 1 else None


def recipe_rows(cells: list[dict]) -> list[dict]:
    """The recipe ladder top to bottom: kind "step" (a step of the recipe) or "ceiling" (the
    fixed-batch run of the step above). A step's gain is over the measured step it builds on:
    the one before it, except a compiled run without cudnn.benchmark, which builds on
    bf16 + channels_last. Steps without a cell in the result set are left out; steps whose
    cell was not measured stay, with `why`."""
    steps = list(RECIPE)
    for mode in sorted({c["settings"].get("compile") for c in cells} - {None, "none"},
                       key=lambda m: (COMPILE_MODES.index(m) if m in COMPILE_MODES else 99, m)):
        name = "" if mode == "default" else f" {mode}"
        tuned = single(BF16_CL, 512, cudnn_benchmark=True, compile=mode)
        if _one(cells, tuned):
            steps.append((f"+ compile{name}", tuned))
        else:
            steps.append((f"+ compile{name} (cudnn.benchmark off)", single(BF16_CL, 512, compile=mode)))
    rows, measured = [], {}
    for label, selector in steps:
        cell = _one(cells, selector)
        if cell is None:
            continue
        ips = cell["images_per_s"]
        over = "bf16 + channels_last" if "cudnn.benchmark off" in label else None
        if over not in measured:
            over = next(reversed(measured), None)
        row = {"kind": "step", "label": label, "cell": cell["cell"], "images_per_s": ips,
               "epoch_s": _num(epoch_estimate(cell).value), "compile_s": cell["compile_s"], "over": over,
               "gain": ips / measured[over] - 1 if ips and over else None,
               "why": None if ips else why_unmeasured(cell)}
        rows.append(row)
        if ips:
            measured[label] = ips
        if label in CEILINGS:
            ceiling_label, ceiling_sel = CEILINGS[label]
            ceiling = _one(cells, ceiling_sel)
            if ceiling is not None and ceiling["images_per_s"]:
                cips = ceiling["images_per_s"]
                rows.append({"kind": "ceiling", "label": ceiling_label, "cell": ceiling["cell"],
                             "images_per_s": cips, "epoch_s": _num(epoch_estimate(ceiling).value),
                             "compile_s": ceiling["compile_s"], "over": label,
                             "reached": ips / cips if ips else None, "why": None})
    return rows


def _speed_words(images_per_s: float, epoch_s: float | None) -> str:
    return f"{images_per_s:,.0f} img/s" + (f" · {epoch_s:.2f} s/epoch" if epoch_s is not None else "")


def _bar_words(row: dict, step_above: str | None) -> str:
    if row["images_per_s"] is None:
        return f"{NOT_MEASURED} ({row['why']})"
    words = _speed_words(row["images_per_s"], row["epoch_s"])
    if row["kind"] == "ceiling":
        return words + (f" · the real feed reaches {row['reached']:.1%} of it" if row.get("reached") else "")
    if row.get("gain") is not None:
        words += f" · {row['gain']:+.0%}"
        if row["over"] != step_above:
            words += f" over {row['over']}"
    if row.get("compile_s") is not None:
        words += f" · compiled in {row['compile_s']:.0f} s"
    return words


CHAR_FRACTION = 0.0068   # of an 11.5-inch figure's panel, at the "small" font


def _bars(ax, rows: list[dict], labels: list[str], words: list[str], colors: list, hatches: list,
          xlabel: str) -> float:
    """Bars top to bottom, each with its words right of its end; returns the x limit that leaves
    every bar's words room (a character takes about CHAR_FRACTION of the panel's width)."""
    y = list(range(len(rows)))
    values = [r["images_per_s"] or 0 for r in rows]
    ax.barh(y, values, color=colors, hatch=hatches, edgecolor="0.35", linewidth=0.6, height=0.7)
    top = max(values) or 1.0
    for yi, value, text in zip(y, values, words):
        ax.annotate(text, (value, yi), xytext=(4, 0), textcoords="offset points", va="center",
                    ha="left", fontsize="small")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"images/s ({xlabel})")
    ax.grid(axis="y", visible=False)
    from matplotlib.ticker import StrMethodFormatter
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    return max(value / max(0.2, 1 - 0.02 - CHAR_FRACTION * len(w)) for value, w in zip(values + [top], words + [""]))


def recipe_figure(folder: Path, cells: list[dict]):
    """Horizontal bars, one per recipe step (and fixed-batch ceiling); a second panel with the
    measured DDP cells when there are any."""
    import seaborn as sns
    from matplotlib.figure import Figure
    from dpbench.report import figstyle

    ladder = recipe_rows(cells)
    sweep = sweep_rows(cells)
    steps = [r for r in ladder if r["kind"] == "step"]
    blues = sns.color_palette("crest", max(2, len(steps)))
    heights = [max(1, len(ladder))] + ([len(sweep)] if sweep else [])
    fig = Figure(figsize=(11.5, 1.5 + 0.42 * sum(heights) + (0.6 if sweep else 0)), dpi=figstyle.DPI,
                 layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, height_ratios=heights)[:, 0]
    some = next((c["settings"] for c in cells if c["settings"].get("variant") == "single"), {})
    ax = axes[0]
    if ladder:
        colors, hatches, labels, words, i, above = [], [], [], [], 0, None
        for r in ladder:
            if r["kind"] == "step":
                colors.append(blues[i])
                hatches.append(None)
                i += 1
            else:
                colors.append("0.88")
                hatches.append("//")
            labels.append(r["label"])
            words.append(_bar_words(r, above))
            if r["kind"] == "step" and r["images_per_s"]:
                above = r["label"]
        right = _bars(ax, ladder, labels, words, colors, hatches, epoch_words(cells))
    else:
        right = 0.0
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no single-GPU cell of the recipe in this result set", ha="center",
                va="center", transform=ax.transAxes)
    # the panels are wide: one-line titles (figstyle.panel_title wraps for narrow panels)
    ax.set_title(f"One GPU · batch 512 · {some.get('dataset', '?')}, gpu feed · "
                 f"%: gain over the step above")
    if sweep:
        ax2 = axes[1]
        labels = [f"{tables.gpus_label(r['gpus'])} · {r['layout']} · {r['scaling']}\n{r['setting']}"
                  + ("" if r["compile"] == "none" else f" · compile {r['compile']}") for r in sweep]
        words = [_speed_words(r["images_per_s"], r["epoch_s"])
                 + (f" · {r['efficiency']:.2f} of {r['gpus']} x single" if r["efficiency"] else "")
                 for r in sweep]
        palette = sns.color_palette("flare", len(sweep))
        right = max(right, _bars(ax2, [{"images_per_s": r["images_per_s"]} for r in sweep], labels,
                                 words, list(palette), [None] * len(sweep), epoch_words(cells)))
        ax2.set_title("DDP: knobs · x single: images/s over GPUs x single at the per-GPU batch")
    for a in axes:   # one images/s scale for both panels
        if a.axison:
            a.set_xlim(0, right)
    figstyle.figure_title(fig, f"What each step of the fast recipe buys ({machine_words(folder)})")
    if not sweep:   # the caption says why the DDP knobs have no panel
        fig.supxlabel(f"DDP knobs: no panel, no DDP cell was measured{ddp_unmeasured_words(cells)}",
                      fontsize="small", color="0.3")
    return fig


# -- the bucket-size figure ----------------------------------------------------------------------

def sweep_panels(rows: list[dict]) -> dict[tuple, dict[str, list[dict]]]:
    """The DDP cells with a known bucket size: one panel per GPU count, layout, scaling and
    per-GPU batch; in it one line per knobs and compile mode, its points by bucket size."""
    panels: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r["bucket_mb"] is not None:
            line = r["knobs"] + ("" if r["compile"] == "none" else f", compile {r['compile']}")
            panel = panels.setdefault((r["gpus"], r["layout"], r["scaling"], r["per_gpu_batch"]), {})
            panel.setdefault(line, []).append(r)
    return {k: {line: sorted(pts, key=lambda r: r["bucket_mb"]) for line, pts in sorted(v.items())}
            for k, v in sorted(panels.items(), key=lambda kv: (-kv[0][0], kv[0][1], kv[0][2] != "weak"))}


def sweep_figure(folder: Path, cells: list[dict]):
    """DDP's images/s against its bucket size (log scale): one panel per GPU count, layout and
    scaling (each its own images/s scale), one line per knobs setting (one colour each across
    panels); open markers where the size is PyTorch's default, bars where repeats give an
    interval."""
    import seaborn as sns
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    from dpbench.report import figstyle

    rows = sweep_rows(cells)
    panels = sweep_panels(rows)
    title = f"DDP throughput against bucket size ({machine_words(folder)})"
    if not panels:
        why = (f"no DDP cell was measured{ddp_unmeasured_words(cells)}" if not rows else
               f"no measured DDP cell has a known bucket size ({rows[0]['bucket_note']})")
        return figstyle.placeholder(title, why)
    knobs = sorted({line for panel in panels.values() for line in panel})
    colors = dict(zip(knobs, sns.color_palette("colorblind", len(knobs))))
    sizes = sorted({r["bucket_mb"] for panel in panels.values() for pts in panel.values() for r in pts})
    fig, axes = figstyle.panel_grid(len(panels), n_cols=min(3, len(panels)))
    defaults = False
    for ax, ((gpus, layout, scaling, per_gpu), panel) in zip(axes, panels.items()):
        for line, pts in panel.items():
            x, y = [r["bucket_mb"] for r in pts], [r["images_per_s"] for r in pts]
            ax.plot(x, y, "-", marker="o", color=colors[line])
            shown = [r for r in pts if r["images_per_s_low"] is not None]
            if shown:
                ax.errorbar([r["bucket_mb"] for r in shown], [r["images_per_s"] for r in shown],
                            yerr=[[r["images_per_s"] - r["images_per_s_low"] for r in shown],
                                  [r["images_per_s_high"] - r["images_per_s"] for r in shown]],
                            fmt="none", ecolor=colors[line], capsize=3)
            unset = [r for r in pts if r["bucket_note"]]
            if unset:
                defaults = True
                ax.plot([r["bucket_mb"] for r in unset], [r["images_per_s"] for r in unset], "o",
                        mfc="white", mec=colors[line], zorder=3)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlim(sizes[0] / 1.6, sizes[-1] * 1.6)
        ax.margins(y=0.25)
        figstyle.thousands(ax)
        ax.set_xlabel("bucket_cap_mb (MB, log scale)")
        ax.set_ylabel("images/s")
        batch = f"{per_gpu} per GPU" if scaling == "weak" else f"global batch {per_gpu * gpus}"
        figstyle.panel_title(ax, f"{tables.gpus_label(gpus)} · {layout} · {scaling} scaling, {batch}")
    handles = [Line2D([], [], color=colors[k], marker="o", label=k) for k in knobs]
    if defaults:
        handles.append(Line2D([], [], color="0.4", marker="o", mfc="white", ls="none",
                              label="PyTorch's default size\n(bucket_cap_mb unset)"))
    fig.legend(handles=handles, loc="outside right center", frameon=False, title="DDP knobs")
    figstyle.figure_title(fig, title)
    return fig


def write_figure(draw, folder: Path, cells: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from dpbench.report import figstyle
    with figstyle.style():
        fig = draw(folder, cells)
    figstyle.save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="?", help="the perf result set (folder or its summary.csv)")
    p.add_argument("--default-experiment", type=Path,
                   help="the default experiment's result set, for the whole-experiment time (default: the perf set)")
    p.add_argument("--md", type=Path, help="also write the tables here (markdown)")
    p.add_argument("--json", type=Path, help="also write the target rows here")
    p.add_argument("--figure", type=Path, help="also draw what each step of the fast recipe buys here (png)")
    p.add_argument("--sweep-figure", type=Path, help="also draw DDP's throughput against bucket size here (png)")
    args = p.parse_args(argv)
    folder = find_result_set(args.results)
    cells = load_cells(folder)
    targets = target_rows(cells) + [default_experiment_row(args.default_experiment or folder)]
    text = markdown(folder, cells, targets)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"result_set": folder.name, "targets": targets,
                                         "sweep": sweep_rows(cells), "single": fastest_rows(cells),
                                         "agreement": agreement_rows(cells),
                                         "recipe": recipe_rows(cells)}, indent=1) + "\n")
    if args.figure:
        write_figure(recipe_figure, folder, cells, args.figure)
    if args.sweep_figure:
        write_figure(sweep_figure, folder, cells, args.sweep_figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
