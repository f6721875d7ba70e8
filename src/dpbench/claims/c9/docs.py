"""docs/sharding.md's rehearsed ranks: every rehearsal reference's launches combined into one
set (analysis.rehearsal.combine: the newest launch's record of a case wins, failed cases kept),
read by named queries (registered with dpbench.report.docs_queries' `query`) and drawn as the
page's figures under docs/figures/. Torch-free; reads only the committed references.

    python -m dpbench.claims.c9.docs          # redraws docs/figures/rehearsal-*.png
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dpbench.analysis import rehearsal
from dpbench.analysis.memory_model import GRADIENT_KINDS, MIB, TOLERANCE, step_start, with_references
from dpbench.claims.c9 import text
from dpbench.claims.c9.rehearsed import DDP_FROM_ONE_RANK, finding, largest_batch_rows, open_cells
from dpbench.claims.c9.verdict import Crossover, verdict_from
from dpbench.host.source import PROJECT
from dpbench.report.docs_queries import query
from dpbench.report.markdown import md_table

ROOT = PROJECT
FIGURES = Path("docs") / "figures"
# Every rehearsal launch kept under results/reference, oldest first (each reference's README says
# which launch came after which): where two measured the same case the later one's record wins.
LAUNCHES = (("h200-rehearsal-525c3e7", "rehearsal-part1.tar.gz"),
            ("h200-rehearsal-n4-522758d", "rehearsal-n4.tar.gz"),
            ("h200-rehearsal-n8-8cec286", "n8-235m-42m-12m.tgz"),
            ("h200-rehearsal-n8-8cec286", "n8-42m-12m.tgz"),
            ("h200-rehearsal-n8-7288c44", "n8-12m.tar.gz"),
            ("h200-rehearsal-n8-7288c44", "n8-42m.tar.gz"),
            ("h200-rehearsal-n8-1a5f006", "n8-42m.tar.gz"),
            ("h200-rehearsal-4036c92", "n8-42m-hsdp.tar.gz"),
            ("h200-rehearsal-4036c92", "n4-235m.tar.gz"),
            ("h200-rehearsal-4036c92", "n4-235m-sharded.tar.gz"),
            ("h200-rehearsal-a7dce61", "n1-1b.tar.gz"),
            ("h200-rehearsal-a7dce61", "n4-1b-fsdp.tar.gz"),
            ("h200-rehearsal-a7dce61", "n4-235m-ddp.tar.gz"),
            ("h200-rehearsal-a7dce61", "n4-1b-ddp-zero1.tar.gz"),
            ("h200-rehearsal-a7dce61", "n8-235m.tar.gz"),
            ("h200-rehearsal-a7dce61", "n8-235m-keep-hsdp.tar.gz"),
            ("h200-rehearsal-a7dce61", "n4-1b-zero1-first.tar.gz"),
            ("h200-rehearsal-a7dce61", "n4-1b-zero1.tar.gz"),
            # on an H100 (an H200 did not come): the one-rank cases with the backward's start
            # marked, 236M at N = 8 (hsdp's first), 1.08B fsdp at N = 2 and 4, and 2B
            *(("h100-rehearsal-1307c9b", f"{t}.tar.gz") for t in (
                "n1-235m-1b", "n8-235m", "n4-1b-fsdp", "n4-2b", "n1-2b", "n2-2b", "n2-2b-ddp", "n4-2b-ddp")),
            ("h100-rehearsal-3cfd779", "n2-1b-fsdp.tar.gz"),
            # the GPU's backward part by part (each unit's marked) and each stream's cache segments
            *(("h100-rehearsal-ceb1b88", f"{t}.tar.gz") for t in ("n1-2b-fsdp", "n1-1b-fsdp", "n1-235m-fsdp",
                                                                   "n8-235m-fsdp")),
            # the cache emptied after sharding (5191b45) and the allocator's replay blind: 236M at
            # every N, 1.08B and 1.97B at N = 8 (their first), 1.08B hsdp (its first)
            *(("h100-rehearsal-11dc2db", f"{t}.tar.gz") for t in (
                "n1-235m-1b-fsdp", "n2-235m", "n4-235m-fsdp", "n8-235m", "n2-1b-keep", "n8-2b-fsdp",
                "n8-1b-fsdp", "n4-1b-hsdp")),
            # 11.7M at N = 1 with the GPU allocator's own history of each case (ddp, zero1, fsdp)
            ("h100-alloc-history-209515f", "n1-12m.tar.gz"),
            # 1.08B ddp, zero1 and fsdp at N = 2 (DDP's first row there); with the allocator's
            # history, 1.08B fsdp at N = 1 and 236M fsdp at N = 2 (an H200 did not come)
            *(("h100-rehearsal-ab61c43", f"{t}.tar.gz") for t in ("n2-1b", "n1-1b-fsdp-hist", "n2-235m-fsdp-hist")),
            # on an H200: 1.08B and 1.97B at N = 8 within 16GB (zero1's launch was killed and wrote
            # no record), 1.08B fsdp at N = 4 and zero1 at N = 4 with the allocator's history
            *(("h200-rehearsal-72e1378", f"{t}.tar.gz") for t in ("n8-1b-zero1", "n8-1b-2b-fsdp", "n4-1b-fsdp",
                                                                   "n4-1b-zero1-hist")),
            # the first searches sent to the line's edge: 1.08B fsdp at N = 2 (cut short twice
            # before), fsdp without resharding at 1.08B N = 4 and 1.97B N = 2 and 4
            *(("h100-rehearsal-cb9adc2", f"{t}.tar.gz") for t in ("n2-1b-fsdp", "n4-1b-keep", "n2-2b-keep",
                                                                   "n4-2b-keep")))
# The last launch seen when the reserved slack's reference became the fewest communicating ranks
# (memory_model.with_references): every launch after it is that rule's blind check
RESERVED_RULE_SAW = ("h200-rehearsal-4036c92", "n4-235m-sharded.tar.gz")
COMPONENTS = ("parameters", "gradients", "optimizer", "largest_unit", "activation_peak", "reserved_peak")
# The same cases rehearsed on the CPU with PyTorch's memory tracker (run.live_memory): what a
# rank holds at each phase's peak, by kind, beside the H200's allocator peaks
CPU_TRACKER = (("cpu-tracker-fb14748", "rehearsal-n1-2-4.tar.gz"), ("cpu-tracker-fb14748", "rehearsal-n1-2.tar.gz"))
# Beyond what the H200 has run: the 2048x20 model on the CPU's tracker (fsdp at N = 1 and 2),
# made where the model's forward is marked apart from the loss (the all-gather FSDP2 keeps) and
# the level at its last unit's start is recorded (that unit's gathering)
CPU_BEYOND = (("cpu-tracker-a17794e", "n1-1b.tar.gz"), ("cpu-tracker-a17794e", "n2-1b.tar.gz"))
# The same 2048x20 cases made earlier: with the forward marked but no level at the last unit's
# start (the model with the kept unit alone), and before the forward was marked (without it)
CPU_BEYOND_KEPT_ONLY = (("cpu-tracker-c69720d", "n1-1b.tar.gz"), ("cpu-tracker-c69720d", "n2-1b.tar.gz"))
CPU_BEYOND_BEFORE = (("cpu-tracker-1b-34ac865", "rehearsal-n1.tar.gz"), ("cpu-tracker-1b-34ac865", "rehearsal-n2.tar.gz"))
# 2048x20 fsdp on the H200, where no one-rank fsdp case ran (the N = 1 launch's time went to ddp):
# checked against the model predicted from the CPU tracker's one-rank case (CPU_BEYOND)
GPU_BEYOND = (("h200-rehearsal-a7dce61", "n4-1b-fsdp.tar.gz"),)
# 236M fsdp at N = 4 and 8 on the CPU's tracker: what the backward's peak holds where it rises with N
CPU_RISE = (("cpu-tracker-8fa7b82", "n4-235m-fsdp.tar.gz"), ("cpu-tracker-8fa7b82", "n8-235m-fsdp.tar.gz"))
# 236M and 2048x20 fsdp at N = 1 and 2 on the CPU's tracker with the backward's first gradient
# marked (run.components.BACKWARD_START): the one-rank cases predict the backward's start and later peak
CPU_START = (("cpu-tracker-c8f7f8d", "n1-235m-1b-fsdp.tar.gz"), ("cpu-tracker-c8f7f8d", "n2-235m-1b-fsdp.tar.gz"))
# made after that rule was committed (c8f7f8d), at sizes it had not seen: 11.7M and 42.3M at N = 1, 4, 8,
# its blind check
CPU_START_BLIND = tuple(("cpu-tracker-db6d857", f"n{n}-12m-42m-fsdp.tar.gz") for n in (1, 4, 8))
# 1.08B's units (width 2048) on 4 blocks, fsdp at N = 1, 2, 4 on the CPU's tracker: what the
# backward's later peak holds where it passes the model at N = 4 (as 1.08B's and 1.97B's on the GPU)
CPU_WIDE = tuple(("cpu-tracker-44481c1", f"n{n}-wide4-fsdp.tar.gz") for n in (1, 2, 4))
# Each unit's part of fsdp's backward marked (run.components.BACKWARD_UNIT), the model's rule for
# the parts committed at PARTS_RULE: the cases it was made on (1.08B's units on 4 blocks, explored
# before that commit and made again at it) and those made after it, its blind check (11.7M and
# 42.3M at N = 1, 2, 4, 8; 236M at N = 1, 4, 8); 1.08B's one-rank case predicts the GPU's 1.08B rows
PARTS_RULE = "56c1f32"
CPU_PARTS_MADE_ON = tuple((f"cpu-tracker-{PARTS_RULE}", f"n{n}-wide4-fsdp.tar.gz") for n in (1, 2, 4))
CPU_PARTS_BLIND = (*((f"cpu-tracker-{PARTS_RULE}", f"n{n}-12m-42m-fsdp.tar.gz") for n in (1, 2, 4, 8)),
                   *((f"cpu-tracker-{PARTS_RULE}", f"n{n}-235m-fsdp.tar.gz") for n in (1, 4, 8)))
CPU_PARTS_1B = ((f"cpu-tracker-{PARTS_RULE}", "n1-1b-fsdp.tar.gz"),)
# The same family on fake tensors (claims.c9.fake: rank 0 of N, no memory behind it) at N = 1, 2,
# 4, 8, 11.7M to 1.97B: beside the gloo ranks' tracker and the GPU's allocator, and the one-rank
# case, parts marked, of the size no machine here holds (1.97B)
FAKE = (("cpu-fake-567a31c", "n1-2-4-8-fake.tar.gz"),
        # the same cases again with the loss marked apart, at the rule for fsdp without resharding
        ("cpu-fake-87992f5", "n1-2-4-8-fake.tar.gz"))
# fsdp without resharding moment by moment (memory_model.kept_units), frozen at KEEP_RULE; four
# shapes it was not made on, made after it: its blind check
KEEP_RULE = "c0d8ecd"
FAKE_KEEP_BLIND = (("cpu-fake-87992f5", "blind-fake.tar.gz"),)
# The 236M model's fsdp with and without resharding at N = 1 and 2 on the CPU's tracker, there too
CPU_KEPT = (("cpu-tracker-a17794e", "n1-2-235m.tar.gz"),)


def launch_name(reference: str, tar: str) -> str:
    return f"{reference}/{tar}"


def commit_of(launch: str) -> str:
    """The commit a launch measured at: its reference folder's last word."""
    return launch.split("/")[0].rsplit("-", 1)[1]


def card_of(launch: str) -> str:
    """The GPU a launch ran on: its reference folder's first word ("h100-...", "h200-...")."""
    return launch.split("/")[0].split("-", 1)[0].upper()


def made_at(launch: str) -> str:
    """A launch's commit and card, as the tables' commit column shows them."""
    return f"{commit_of(launch)}, {card_of(launch)}"


@dataclass(frozen=True)
class Combined:
    launches: dict[str, list[dict[str, Any]]]   # launch -> its own records, as it wrote them
    records: list[dict[str, Any]]                # one per case, the newest launch's
    not_fitting: list[dict[str, Any]]
    memory: list[dict[str, Any]]                 # analysis.rehearsal.memory_table
    rows: list[dict[str, Any]]                   # C9's largest_batch rows

    def crossovers(self) -> list[Crossover]:
        return [c for c in verdict_from(self.rows).crossovers if c.quantity == "largest_batch"]


@cache   # every query of the page reads the same launches: combined once a render
def combined(ref: Path) -> Combined:
    parts = {launch_name(r, t): rehearsal.read_launch(ref / r / t) for r, t in LAUNCHES}
    records = rehearsal.combine([(name, recs) for name, (recs, _) in parts.items()])
    # a budget N ranks could not search on one launch's GPU may fit another's: each says where
    where: dict[tuple[int, str], list[str]] = defaultdict(list)
    for name, (_, nfs) in parts.items():
        for nf in nfs:
            where[(int(nf["ranks"]), str(nf["budget"]))].append(name)
    not_fitting = [{**nf, "launches": where[(int(nf["ranks"]), str(nf["budget"]))]}
                   for nf in rehearsal.combine_not_fitting(nf for _, nf in parts.values())]
    cases = [r for r in records if not r.get("launched")]
    rows = largest_batch_rows(cases, not_fitting)
    return Combined({name: recs for name, (recs, _) in parts.items()}, records, not_fitting,
                    rehearsal.memory_table(cases), rows)


def size_names(c: Combined) -> dict[str, str]:
    """'256x4' -> '11.7M': the parameter count the records give each size."""
    return {str(r["size"]): text.params(r["parameters"]) for r in c.records if r.get("size") and r.get("parameters")}


def link(launch: str) -> str:
    folder = launch.split("/")[0]
    return f"[`{launch}`](../results/reference/{folder}/README.md)"


def _percent(x: float) -> str:
    return f"{100 * x:+.1f}%"


@query("rehearsal_launches")
def rehearsal_launches(ref: Path) -> str:
    """Per launch: its commit, N, the sizes it reached, its cases ok and failed, and how many of
    its records the combined view keeps (a later launch's record of the same case wins)."""
    c = combined(ref)
    names = size_names(c)
    kept = [r[rehearsal.SOURCE] for r in c.records]
    body = []
    for launch, recs in c.launches.items():
        cases = [r for r in recs if not r.get("launched")]
        ok = [r for r in cases if r.get("status") == "ok"]
        sizes = sorted({names.get(str(r.get("size")), "") for r in ok} - {""}, key=text.params_value)
        body.append([link(launch), commit_of(launch), card_of(launch),
                     ", ".join(map(str, sorted({int(r["gpus"]) for r in cases}))),
                     ", ".join(sizes) or "none", len(ok), len(cases) - len(ok), kept.count(launch)])
    return md_table(["launch (oldest first)", "commit", "GPU", "N", "sizes measured", "cases ok", "cases failed",
                     "records kept"], body)


@query("rehearsal_one_rank_source")
def rehearsal_one_rank_source(ref: Path) -> str:
    """Which launches ran no one-rank case, and whose one-rank runs predict their activations and reserved."""
    c = combined(ref)
    ok = [r for r in c.records if r.get("status") == "ok" and not r.get("launched")]
    with_one = sorted({r[rehearsal.SOURCE] for r in ok if int(r["gpus"]) == 1})
    without = sorted({r[rehearsal.SOURCE] for r in ok} - set(with_one), key=list(c.launches).index)
    ns = sorted({int(r["gpus"]) for r in ok if r[rehearsal.SOURCE] in without})
    def words(items: list) -> str:
        return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)
    return (f"the N = {words([str(n) for n in ns])} launches ({words([f'`{w}` at {commit_of(w)}' for w in without])}) "
            f"ran none, so theirs come from the N = 1 runs of the same model size and per-rank batch in "
            f"{words([f'`{w}` at {commit_of(w)}' for w in with_one])}")


def memory_table(ref: Path, size: str) -> str:
    """Per variant and N, the size's per-rank components: measured / model MiB (error), and the launch."""
    c = combined(ref)
    rows = [m for m in c.memory if m["size"] == size]
    source = {(r["size"], rehearsal.variant_label(r), int(r["gpus"])): made_at(r[rehearsal.SOURCE])
              for r in c.records if r.get("status") == "ok"}
    by = {(m["variant"], m["gpus"], m["component"]): m for m in rows}
    keys = sorted({(m["variant"], m["gpus"]) for m in rows}, key=lambda k: rehearsal.sort_key((size, *k)))
    # here, not at the top: replay_docs reads this module's launches (a cycle at import time)
    from dpbench.claims.c9.replay_docs import rows as replay_rows
    replayed = {(x.variant, x.gpus): x for x in replay_rows(ref, newest_only=True) if x.size == size}
    body = []
    for variant, gpus in keys:
        cells = []
        for comp in COMPONENTS:
            m = by.get((variant, gpus, comp))
            cells.append("–" if m is None else f"{m['measured_mib']:,.0f} / –" if m["predicted_mib"] is None
                         else f"{m['measured_mib']:,.0f} / {m['predicted_mib']:,.0f} "
                              f"({_percent(m['relative_difference'])})"
                         + (" !" if m["beyond_tolerance"] else ""))
        x = replayed.get((variant, gpus))
        cells.append("–" if x is None else f"{x.measured:,.0f} / {x.replayed.reserved / MIB:,.0f} ({_percent(x.error)})"
                     + (" !" if abs(x.error) > TOLERANCE else ""))
        body.append([variant, gpus, source.get((size, variant, gpus), ""), *cells])
    return md_table(["variant", "N", "commit, GPU", *(x.replace("_", " ") for x in COMPONENTS),
                     "reserved peak, rank 0, replayed"], body)


def predicted_rows(c: Combined) -> list[dict[str, Any]]:
    """The memory table's rows the model predicts (a peak with no one-rank case has none)."""
    return [m for m in c.memory if m["predicted_mib"] is not None]


EXACT = ("parameters", "gradients", "optimizer", "largest_unit")   # counted from tensors: the closed forms'
PEAKS = ("activation_peak", "reserved_peak")                          # the allocator's: predicted from N = 1


@query("rehearsal_exact_error")
def rehearsal_exact_error(ref: Path) -> str:
    """The largest |error| of the tensor-counted components over every size, variant and N."""
    worst = max(abs(m["relative_difference"]) for m in predicted_rows(combined(ref)) if m["component"] in EXACT)
    return f"±{100 * worst:.1f}%"


@query("rehearsal_peak_misses")
def rehearsal_peak_misses(ref: Path) -> str:
    """Per allocator component, the (variant, size) whose error at N >= 2 lies beyond 5%, with each N's error."""
    c = combined(ref)
    names = size_names(c)
    misses = [m for m in c.memory if m["component"] in PEAKS and m["gpus"] >= 2 and m["beyond_tolerance"]]
    lines = []
    for comp in PEAKS:
        groups: dict[tuple[str, str], list[str]] = {}
        for m in sorted(misses, key=lambda m: (text.params_value(names[m["size"]]), rehearsal.sort_key(
                (m["size"], m["variant"], m["gpus"])))):
            if m["component"] == comp:
                groups.setdefault((m["variant"], m["size"]), []).append(
                    f"N = {m['gpus']} {_percent(m['relative_difference'])}")
        said = "; ".join(f"{v} at {names[sz]}: {', '.join(ns)}" for (v, sz), ns in groups.items())
        lines.append(f"- {comp.replace('_', ' ')}: {said or 'none'}")
    return "\n".join(lines)


@query("rehearsal_activation_error")
def rehearsal_activation_error(ref: Path) -> str:
    """The largest |error| of the activation peak at N >= 2 over every size and variant."""
    worst = max(abs(m["relative_difference"]) for m in predicted_rows(combined(ref))
                if m["component"] == "activation_peak" and m["gpus"] >= 2)
    return f"±{100 * worst:.1f}%"


@query("fsdp_root_gathers")
def fsdp_root_gathers(ref: Path) -> str:
    """The smallest model's fsdp at N = 2: its counted all-gathers against its units and c·P."""
    c = combined(ref)
    rec = next(r for r in c.records if r.get("status") == "ok" and r.get("size") == "256x4"
               and rehearsal.variant_label(r) == "fsdp" and int(r["gpus"]) == 2)
    gathers = next(x for x in rec["collectives"] if x["collective"] == "all_gather")
    blocks = int(str(rec["size"]).split("x")[1])
    return (f"at {size_names(c)['256x4']} ({blocks} blocks and the root: {blocks + 1} units) on N = 2 ranks the "
            f"counter saw {gathers['count']} all-gathers, {gathers['bytes'] / MIB:.1f} MiB in all, twice c·P "
            f"({rec['param_bytes'] / MIB:.1f} MiB)")


def allocated_peak(m: dict[str, Any]) -> float:
    """A rank's allocated peak over the profiled step's phases (MiB)."""
    return max(m["forward_peak_mib"], m["backward_peak_mib"], m.get("step_peak_mib") or 0)


def case_order(r: dict[str, Any]) -> tuple:
    """A record's place in the page's tables: size, variant, N (analysis.rehearsal.sort_key)."""
    return rehearsal.sort_key((r["size"], rehearsal.variant_label(r), r["gpus"]))


def reserved_checked(c: Combined) -> list[dict[str, Any]]:
    """The reserved rows the model predicts from a smaller N (not compared with themselves)."""
    return [m for m in c.memory if m["component"] == "reserved_peak" and m["gpus"] > (m["reference_gpus"] or m["gpus"])]


@query("rehearsal_reserved_error")
def rehearsal_reserved_error(ref: Path) -> str:
    """The largest |error| of the reserved peak at every N above its reference's."""
    return f"±{100 * max(abs(m['relative_difference']) for m in reserved_checked(combined(ref))):.1f}%"


@query("rehearsal_reserved_blind")
def rehearsal_reserved_blind(ref: Path) -> str:
    """The reserved rows from launches made after the slack rule (RESERVED_RULE_SAW): size,
    variant, N and error each; or that there are none yet."""
    c = combined(ref)
    names, order = size_names(c), list(c.launches)
    after = set(order[order.index(launch_name(*RESERVED_RULE_SAW)) + 1:])
    source = {(str(r["size"]), rehearsal.variant_label(r), int(r["gpus"])): r[rehearsal.SOURCE]
              for r in c.records if r.get("status") == "ok"}
    blind = [m for m in reserved_checked(c) if source.get((m["size"], m["variant"], m["gpus"])) in after]
    if not blind:
        return "none yet"
    return "; ".join(f"{m['variant']} at {names[m['size']]}, N = {m['gpus']}: {_percent(m['relative_difference'])}"
                     + (" !" if m["beyond_tolerance"] else "") for m in blind)


@query("rehearsal_reserved_slack")
def rehearsal_reserved_slack(ref: Path) -> str:
    """Per variant and N (rows), per size (columns): reserved less the profiled step's allocated
    peak, the ranks' mean, MiB."""
    c = combined(ref)
    names = size_names(c)
    slack: dict[tuple[str, int], dict[str, float]] = {}
    for r in c.records:
        rows = [m for m in r.get("memory_components") or [] if r.get("status") == "ok"
                and all(isinstance(m.get(k), (int, float)) for k in ("reserved_peak_mib", "forward_peak_mib", "backward_peak_mib"))]
        if rows:
            slack.setdefault((rehearsal.variant_label(r), int(r["gpus"])), {})[str(r["size"])] = sum(
                m["reserved_peak_mib"] - allocated_peak(m) for m in rows) / len(rows)
    sizes = sorted({sz for v in slack.values() for sz in v}, key=lambda sz: text.params_value(names[sz]))
    keys = sorted(slack, key=lambda k: rehearsal.sort_key(("", *k)))
    body = [[v, n, *(f"{slack[(v, n)][sz]:,.0f}" if sz in slack[(v, n)] else "–" for sz in sizes)] for v, n in keys]
    return md_table(["variant", "N", *(names[sz] for sz in sizes)], body)


def above_start(rec: dict[str, Any]) -> dict[str, float]:
    """The ranks' mean forward and backward peaks above the allocated bytes as the step began."""
    rows = rec["memory_components"]
    return {phase: sum(m[f"{phase}_peak_mib"] - step_start(m) for m in rows) / len(rows)
            for phase in ("forward", "backward")}


def at_peak(rec: dict[str, Any]) -> str:
    """What the tracker saw at rank 0's higher phase peak: the phase, its unsharded parameters,
    all-gather buffers and gradients (MiB)."""
    m = rec["memory_components"][0]
    phase = "forward" if m["forward_peak_mib"] >= m["backward_peak_mib"] else "backward"
    return f"{phase}: {kinds_text(m.get(f'{phase}_peak_by_kind_mib') or {})}"


def ok_cases(ref: Path, launches: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """The ok cases of these launches (the CPU tracker's or the H200's), combined (a later
    launch's case wins)."""
    parts = [(launch_name(r, t), rehearsal.read_launch(ref / r / t)[0]) for r, t in launches]
    return [r for r in rehearsal.combine(parts) if r.get("status") == "ok" and not r.get("launched")]


def model_above_start(rows: list[dict[str, Any]], phases) -> dict[str, float]:
    """The model's peak above the step's start per phase, the mean over a run's ranks' rows."""
    return {p: sum(x[f"predicted_{p}_above_start_mib"] for x in rows) / len(rows) for p in phases}


def last_unit_level(rec: dict[str, Any]) -> float:
    """Rank 0's level as the forward's last unit starts, above the step's start (MiB)."""
    m = rec["memory_components"][0]
    return m["forward_last_unit_start_mib"] - step_start(m)


def gpu_fsdp_by_n(c: Combined, size: str) -> dict[int, dict[str, Any]]:
    """N -> the GPU's fsdp (resharding) case of this size in the combined view."""
    return {int(r["gpus"]): r for r in c.records if r.get("status") == "ok" and not r.get("launched")
            and r.get("size") == size and rehearsal.variant_label(r) == "fsdp"}


def gpu_marked_ones(c: Combined) -> list[dict[str, Any]]:
    """The GPU's fsdp (resharding) one-rank cases whose backward's start is marked."""
    return [r for r in c.records if r.get("status") == "ok" and not r.get("launched") and int(r["gpus"]) == 1
            and rehearsal.variant_label(r) == "fsdp" and "backward_start_peak_mib" in r["memory_components"][0]]


def predicted_by_run(cpu: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """run_id -> its ranks' rows with the model's phase peaks, each predicted from the cases' one-rank run."""
    predicted = defaultdict(list)
    for row in with_references([row for r in cpu for row in rehearsal.component_rows(r)]):
        predicted[row["run_id"]].append(row)
    return predicted


@query("rehearsal_cpu_tracker")
def rehearsal_cpu_tracker(ref: Path) -> str:
    """Per case rehearsed both on a GPU and on the CPU with the tracker: each phase's peak
    above the step's start on both (MiB), what the tracker saw at the higher one, and the
    largest difference."""
    cpu = ok_cases(ref, CPU_TRACKER)
    c = combined(ref)
    names = size_names(c)
    def from_zero_grad(rec: dict[str, Any]) -> bool:   # older records measured the backward from the forward's end
        return "zero_grad_end_mib" in rec["memory_components"][0]
    way = {rehearsal.case_key(r): from_zero_grad(r) for r in cpu}
    # per case, the newest GPU record that measured its backward as the CPU's did
    alike = rehearsal.combine([(launch, [r for r in recs if r.get("status") == "ok" and not r.get("launched")
                                         and way.get(rehearsal.case_key(r)) == from_zero_grad(r)])
                               for launch, recs in c.launches.items()])
    gpu = {rehearsal.case_key(r): r for r in alike}
    body, worst = [], (0.0, 0.0)
    for r in sorted(cpu, key=lambda r: (text.params_value(names[str(r["size"])]), case_order(r))):
        g = gpu.get(rehearsal.case_key(r))
        if g is None:
            continue
        a, b = above_start(g), above_start(r)
        for phase in a:
            diff = b[phase] - a[phase]
            if abs(diff) > abs(worst[0]):
                worst = (diff, diff / a[phase])
        body.append([names[str(r["size"])], rehearsal.variant_label(r), r["gpus"], made_at(g[rehearsal.SOURCE]),
                     *(f"{a[p]:,.1f} / {b[p]:,.1f}" for p in a), at_peak(r)])
    table = md_table(["model", "variant", "N", "GPU case: commit, GPU", "forward peak above the start, GPU / CPU",
                      "backward peak above the start, GPU / CPU", "at the higher peak (CPU tracker, MiB)"], body)
    launches = ", ".join(f"`{launch_name(r, t)}`" for r, t in CPU_TRACKER)
    return (f"{table}\n\nOver these {len(body)} cases the tracker's peaks lie within {abs(worst[0]):.1f} MiB "
            f"({100 * abs(worst[1]):.1f}%) of the GPU's ({launches}, "
            f"[its README](../results/reference/{CPU_TRACKER[0][0]}/README.md)).")


def kinds_text(kinds: dict[str, float], gradients: float | None = None) -> str:
    """A peak's unsharded parameters, all-gather buffers and gradients (MiB; with `gradients`,
    the rank's, the gradients also as a share of them)."""
    grads = sum(kinds.get(k, 0.0) for k in GRADIENT_KINDS)
    share = f" ({100 * grads / gradients:.0f}%)" if gradients else ""
    return (f"{kinds.get('Unsharded Param', 0):,.0f} unsharded, {kinds.get('All Gather', 0):,.0f} all-gather, "
            f"{grads:,.0f} gradients{share}")


def cpu_model_table(ref: Path, launches: tuple[tuple[str, str], ...]) -> str:
    """CPU tracker cases: each phase's peak above the step's start against the memory model's
    (predicted from the one-rank case), and what each peak held."""
    cpu = ok_cases(ref, launches)
    predicted = predicted_by_run(cpu)
    body = []
    for r in sorted(cpu, key=case_order):
        m, peaks, rows = r["memory_components"][0], above_start(r), predicted[r["run_id"]]
        model = model_above_start(rows, peaks)
        last_unit = m.get("forward_last_unit_start_mib")
        body.append([text.params(r["parameters"]), rehearsal.variant_label(r), r["gpus"],
                     *(f"{peaks[p]:,.1f} / {model[p]:,.1f} ({_percent(peaks[p] / model[p] - 1)})" for p in peaks),
                     f"{m.get('forward_last_gather_mib') or 0:,.0f}",
                     "—" if last_unit is None else f"{last_unit - step_start(m):,.1f}",
                     *(kinds_text(m[f"{p}_peak_by_kind_mib"], m["gradients_mib"]) for p in peaks)])
    names = ", ".join(f"`{launch_name(r, t)}`" for r, t in launches)
    return (md_table(["model", "variant", "N", "forward peak above the start, measured / model",
                      "backward peak above the start, measured / model", "kept all-gather (MiB)",
                      "last block's start above the start (MiB)",
                      "at the forward's peak (MiB)", "at the backward's peak (MiB)"],
                     body) + f"\n\n({names}, [its README](../results/reference/{launches[0][0]}/README.md))")


@query("rehearsal_cpu_tracker_1b")
def rehearsal_cpu_tracker_1b(ref: Path) -> str:
    """The CPU tracker's cases of a size the H200 has not run, against the model."""
    return cpu_model_table(ref, CPU_BEYOND)


@query("rehearsal_h200_1b_fsdp")
def rehearsal_h200_1b_fsdp(ref: Path) -> str:
    """The H200's 2048x20 fsdp cases beside the CPU tracker's at N >= 2: each phase's peak above the
    step's start and the level as the last block starts, measured / the model predicted from the
    CPU tracker's one-rank case (error)."""
    cpu = ok_cases(ref, CPU_BEYOND)
    (one,) = [r for r in cpu if int(r["gpus"]) == 1]
    cases = [("CPU tracker", r) for r in cpu if int(r["gpus"]) > 1] + [("H200", r) for r in ok_cases(ref, GPU_BEYOND)]
    predicted = predicted_by_run([one] + [r for _, r in cases])
    one_level = last_unit_level(one)
    body = []
    for where, r in cases:
        m, peaks, rows = r["memory_components"][0], above_start(r), predicted[r["run_id"]]
        model = model_above_start(rows, peaks)
        level, kept = last_unit_level(r), m["forward_last_gather_mib"]
        body.append([where, r["gpus"], commit_of(r[rehearsal.SOURCE]),
                     *(f"{peaks[p]:,.1f} / {model[p]:,.1f} ({_percent(peaks[p] / model[p] - 1)})" for p in peaks),
                     f"{level:,.1f} / {one_level + kept:,.1f} ({_percent(level / (one_level + kept) - 1)})"])
    return md_table(["where", "N", "commit", "forward peak above the start, measured / model",
                     "backward peak above the start, measured / model",
                     "last block's start above the start, measured / one rank's + the kept block"], body)


@query("rehearsal_fsdp_phases_by_n")
def rehearsal_fsdp_phases_by_n(ref: Path) -> str:
    """fsdp (resharding) at 236M on the GPU per N: each phase's peak above the step's start and
    the gradients a rank holds (MiB, rank 0)."""
    by_n = gpu_fsdp_by_n(combined(ref), "1024x16")
    rows = [by_n[n] for n in sorted(by_n)]
    body = [[r["gpus"], made_at(r[rehearsal.SOURCE]), *(f"{v:,.1f}" for v in above_start(r).values()),
             f"{r['memory_components'][0]['gradients_mib']:,.1f}"] for r in rows]
    return md_table(["N", "commit, GPU", "forward peak above the start", "backward peak above the start",
                     "gradients a rank holds"], body)


@query("rehearsal_cpu_backward_rise")
def rehearsal_cpu_backward_rise(ref: Path) -> str:
    """236M fsdp (resharding) per N on the CPU tracker beside the GPU: the backward's peak above
    the step's start on both, the gradients a rank holds, and what the tracker saw at that peak."""
    cpu = [r for r in ok_cases(ref, CPU_KEPT + CPU_RISE) if rehearsal.variant_label(r) == "fsdp"]
    gpu_by_n = gpu_fsdp_by_n(combined(ref), "1024x16")
    body = []
    for r in sorted(cpu, key=lambda r: int(r["gpus"])):
        m, n = r["memory_components"][0], int(r["gpus"])
        kinds = m["backward_peak_by_kind_mib"]
        gpu = f"{above_start(gpu_by_n[n])['backward']:,.1f} ({card_of(gpu_by_n[n][rehearsal.SOURCE])})" if n in gpu_by_n else "–"
        body.append([n, gpu, f"{above_start(r)['backward']:,.1f}", f"{m['gradients_mib']:,.1f}",
                     f"{kinds_text(kinds)}, {kinds.get('Activation', 0):,.0f} activations, "
                     f"{kinds.get('Temp', 0):,.0f} temporaries"])
    names = ", ".join(f"`{launch_name(r, t)}`" for r, t in CPU_KEPT + CPU_RISE)
    return (md_table(["N", "backward peak above the start, GPU", "the same, CPU tracker", "gradients a rank holds",
                      "at the CPU's backward peak (MiB)"], body)
            + f"\n\n({names}, [its README](../results/reference/{CPU_RISE[0][0]}/README.md))")


@cache   # the table and its verdict read the same rows: made once a render
def backward_start_rows(ref: Path) -> list[dict[str, Any]]:
    """fsdp's (resharding) backward above the step's start per size, machine and N (rank means),
    measured and as the model predicts it from a marked one-rank case of that size (the newest,
    each unit's part marked where one is: CPU_PARTS_*): its start,
    its later peak and the larger. Every row of a size the CPU tracker ran at one rank is
    predicted from the CPU's case: its kinds tell the share of gradients written again at the
    later peak, which nothing on a GPU tells, and its peaks are the GPU's (the one-rank table);
    GPU rows of a larger size from the GPU's own marked one-rank case, its later peak taken as
    it is. GPU rows that measured the backward from the forward's end (before zero_grad's mark)
    are left out."""
    blind = {launch_name(*launch) for launch in CPU_START_BLIND}
    fsdp = [r for r in ok_cases(ref, CPU_START + CPU_START_BLIND) if rehearsal.variant_label(r) == "fsdp"]
    ones = {r["size"]: ("CPU tracker", r) for r in fsdp if int(r["gpus"]) == 1}
    ones |= parts_ones(ref)   # the newest, each unit's part marked (the model as it stands)
    cases = [("CPU tracker", r) for r in fsdp if int(r["gpus"]) > 1]
    cases += [("CPU tracker", r) for r in ok_cases(ref, CPU_RISE)]
    c = combined(ref)
    for r in gpu_marked_ones(c):   # where the CPU ran none
        ones.setdefault(r["size"], (card_of(r[rehearsal.SOURCE]), r))
    # a backward measured from zero_grad (older records measured it from the forward's end)
    cases += [(card_of(r[rehearsal.SOURCE]), r) for size in ones for n, r in gpu_fsdp_by_n(c, size).items()
              if n > 1 and "zero_grad_end_mib" in r["memory_components"][0]]
    names = size_names(c)
    out = []
    for where, r in cases:   # one at a time: run ids repeat across machines
        one_where, one = ones[r["size"]]
        model = model_above_start(predicted_by_run([one, r])[r["run_id"]],
                                  ("backward_start", "backward_late", "backward"))
        measured = above_start(r)["backward"]
        made_after = r[rehearsal.SOURCE] in blind   # the rule's blind check
        out.append({"model": names[str(r["size"])], "parameters": r["parameters"], "blind": made_after,
                    "where": f"{where}, blind" if made_after else where, "gpus": int(r["gpus"]),
                    "commit": commit_of(r[rehearsal.SOURCE]), "one_rank": f"{one_where}, {commit_of(one[rehearsal.SOURCE])}",
                    "measured": measured, **model, "error": measured / model["backward"] - 1,
                    "kept": r["memory_components"][0].get("forward_last_gather_mib")})
    return sorted(out, key=lambda x: (x["parameters"], x["where"], x["gpus"]))


@query("rehearsal_backward_start")
def rehearsal_backward_start(ref: Path) -> str:
    """backward_start_rows as a table: measured, the model's start, later peak and the larger (error)."""
    body = [[x["model"], x["where"], x["gpus"], x["commit"], x["one_rank"],
             "not recorded" if x["kept"] is None else f"{x['kept']:,.1f}",
             f"{x['measured']:,.1f}", f"{x['backward_start']:,.1f}", f"{x['backward_late']:,.1f}",
             f"{x['backward']:,.1f} ({_percent(x['error'])})"] for x in backward_start_rows(ref)]
    names = ", ".join(f"`{launch_name(r, t)}`" for r, t in CPU_START + CPU_START_BLIND)
    return (md_table(["model", "where", "N", "commit", "one-rank case", "block gathered first (the forward's last)",
                      "backward peak above the start, measured", "model: its start", "model: its later peak",
                      "model: the larger (error)"], body)
            + f"\n\n(one-rank cases and the blind check: {names}; READMEs: "
              f"[{CPU_START[0][0]}](../results/reference/{CPU_START[0][0]}/README.md), "
              f"[{CPU_START_BLIND[0][0]}](../results/reference/{CPU_START_BLIND[0][0]}/README.md))")


@query("rehearsal_backward_start_verdict")
def rehearsal_backward_start_verdict(ref: Path) -> str:
    """Per model size: the largest error over its rows and N, and which part the model took."""
    rows = backward_start_rows(ref)
    out = []
    for size in dict.fromkeys(x["model"] for x in rows):
        mine = [x for x in rows if x["model"] == size]
        worst = max(mine, key=lambda x: abs(x["error"]))
        start_wins = sorted({x["gpus"] for x in mine if x["backward_start"] >= x["backward_late"]})
        where = ", ".join(f"{x['where']} N = {x['gpus']}" for x in mine)
        part = (f"the start is the larger at N = {', '.join(map(str, start_wins))}" if start_wins
                else "the later peak is the larger everywhere")
        if abs(worst["error"]) <= TOLERANCE:
            out.append(f"At {size} the model's backward is within {_percent(abs(worst['error'])).lstrip('+')} "
                       f"of every row ({where}); {part}.")
        else:
            misses = "; ".join(f"{x['where']} N = {x['gpus']} {_percent(x['error'])}" for x in mine
                               if abs(x["error"]) > TOLERANCE)
            out.append(f"At {size} it misses by more than {TOLERANCE:.0%}: {misses} ({part}).")
    blind = [x for x in rows if x["blind"]]
    if blind:
        over = [x["backward"] - x["measured"] for x in blind]
        kept = [x["kept"] or 0.0 for x in blind]
        bound = all(0 <= o <= k + 0.1 for o, k in zip(over, kept, strict=True))
        sizes = " and ".join(dict.fromkeys(x["model"] for x in blind))
        ns = ", ".join(map(str, sorted({x["gpus"] for x in blind})))
        out.append(f"Made after the rule was committed, the blind rows ({sizes} at N = {ns}) lie within "
                   f"{_percent(max(abs(x['error']) for x in blind)).lstrip('+')} of it"
                   + (f"; the model is above each by {min(over):,.1f}-{max(over):,.1f} MiB, no more than the block "
                      f"gathered first there ({min(kept):,.1f}-{max(kept):,.1f} MiB): one rank's start peaks "
                      "before the root's backward prefetches that block, so there the rule is an upper bound "
                      "by at most the block, as in the tests' tiny LM." if bound else "."))
    for x in rows:
        gathered = [y["kept"] for y in rows if y["kept"] and y["model"] == x["model"]]
        if x["kept"] is None and gathered:
            out.append(f"The {x['where']}'s N = {x['gpus']} record ({x['commit']}) predates the measured last "
                       f"all-gather, so its model leaves out the block the backward gathers first "
                       f"({max(gathered):,.1f} MiB where measured at this size) and comes "
                       f"{x['measured'] - x['backward']:,.1f} MiB short.")
    return " ".join(out)


@query("rehearsal_backward_start_one_rank")
def rehearsal_backward_start_one_rank(ref: Path) -> str:
    """The marked fsdp cases of the CPU tracker, and the GPU's at one rank: the backward's start
    and later peak above the step's start, and what the tracker saw at each (MiB, rank 0)."""
    c = combined(ref)
    cpu = [("CPU tracker", r) for r in ok_cases(ref, CPU_START + CPU_START_BLIND) if rehearsal.variant_label(r) == "fsdp"]
    gpu = [(card_of(r[rehearsal.SOURCE]), r) for r in gpu_marked_ones(c)]
    names = size_names(c)
    body = []
    for where, r in sorted(cpu + gpu, key=lambda x: (x[1]["parameters"], int(x[1]["gpus"]), x[0])):
        m = r["memory_components"][0]
        start = step_start(m)
        kinds = [kinds_text(m[f"backward_{p}_peak_by_kind_mib"], m["gradients_mib"])
                 if f"backward_{p}_peak_by_kind_mib" in m else "– (no tracker on a GPU)" for p in ("start", "late")]
        body.append([names[str(r["size"])], r["gpus"], where, commit_of(r[rehearsal.SOURCE]), f"{m['gradients_mib']:,.1f}",
                     *(f"{m[f'backward_{p}_peak_mib'] - start:,.1f}" for p in ("start", "late")), *kinds])
    return md_table(["model", "N", "where", "commit", "gradients a rank holds",
                     "the backward's start above the step's start", "its later peak", "at its start",
                     "at its later peak"], body)


def late_kinds_text(m: dict[str, Any]) -> str:
    """What the tracker saw at the backward's later peak: unsharded parameters, all-gather and
    reduce-scatter buffers, gradients (and their share), activations and temporaries (MiB)."""
    kinds = m["backward_late_peak_by_kind_mib"]
    grads = sum(kinds.get(k, 0.0) for k in GRADIENT_KINDS)
    return (f"{kinds.get('Unsharded Param', 0):,.0f} unsharded, {kinds.get('All Gather', 0):,.0f} all-gather, "
            f"{kinds.get('Reduce Scatter', 0):,.0f} reduce-scatter, {grads:,.0f} gradients "
            f"({100 * grads / m['gradients_mib']:.0f}%), {kinds.get('Activation', 0):,.0f} activations, "
            f"{kinds.get('Temp', 0):,.0f} temporaries")


@cache
def wide_rows(ref: Path) -> list[dict[str, Any]]:
    """CPU_WIDE per N: the backward's start and later peak above the step's start, measured and
    the model's from the one-rank case, and what the later peak holds."""
    cases = ok_cases(ref, CPU_WIDE)
    predicted = predicted_by_run(cases)
    out = []
    for r in sorted(cases, key=lambda r: int(r["gpus"])):
        m, rows = r["memory_components"][0], predicted[r["run_id"]]
        model = model_above_start(rows, ("backward_start", "backward_late"))
        start = step_start(m)
        out.append({"gpus": int(r["gpus"]), "parameters": r["parameters"], "block": m.get("forward_last_gather_mib"),
                    "start": m["backward_start_peak_mib"] - start, "late": m["backward_late_peak_mib"] - start,
                    "model_start": model["backward_start"], "model_late": model["backward_late"],
                    "kinds": m["backward_late_peak_by_kind_mib"], "held": late_kinds_text(m)})
    return out


@query("rehearsal_late_peak_in_blocks")
def rehearsal_late_peak_in_blocks(ref: Path) -> str:
    """wide_rows as a table, with the reference named."""
    body = [[x["gpus"], f"{x['start']:,.1f} / {x['model_start']:,.1f}",
             f"{x['late']:,.1f} / {x['model_late']:,.1f} ({_percent(x['late'] / x['model_late'] - 1)})", x["held"]]
            for x in wide_rows(ref)]
    (one,) = {text.params(x["parameters"]) for x in wide_rows(ref)}
    return (f"The {one} model `transformer-lm-2048x4`, fsdp, rank 0, MiB above the step's start:\n\n"
            + md_table(["N", "backward's start, measured / model", "its later peak, measured / model",
                        "at the later peak (CPU tracker)"], body)
            + f"\n\n(`{CPU_WIDE[0][0]}`, [its README](../results/reference/{CPU_WIDE[0][0]}/README.md))")


def parts_ones(ref: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per size, the newest fsdp (resharding) one-rank case with each unit's part marked, and where
    it ran: the CPU tracker's (CPU_PARTS_*), else fake tensors' (FAKE), where no machine here holds
    one rank of the size."""
    ones = {r["size"]: ("CPU tracker", r) for r in ok_cases(ref, CPU_PARTS_MADE_ON + CPU_PARTS_BLIND + CPU_PARTS_1B)
            if int(r["gpus"]) == 1}
    for r in ok_cases(ref, FAKE):
        if int(r["gpus"]) == 1 and rehearsal.variant_label(r) == "fsdp":
            ones.setdefault(r["size"], ("fake tensors", r))
    return ones


@cache
def fake_rows(ref: Path) -> list[dict[str, Any]]:
    """Each case rehearsed both on fake tensors (FAKE) and on a GPU (the combined launches) or on
    gloo ranks of the CPU with the tracker (the CPU_PARTS references): rank 0's activation peak,
    its step's start and its backward's later peak, each side (MiB; the later peak above the
    step's start, where both marked it)."""
    fake = {rehearsal.case_key(r): r for r in ok_cases(ref, FAKE)}
    c = combined(ref)
    others = [(card_of(r[rehearsal.SOURCE]), made_at(r[rehearsal.SOURCE]), r) for r in c.records
              if r.get("status") == "ok" and not r.get("launched")]
    others += [("CPU tracker", f"{commit_of(r[rehearsal.SOURCE])}, CPU tracker", r)
               for r in ok_cases(ref, CPU_PARTS_MADE_ON + CPU_PARTS_BLIND + CPU_PARTS_1B)]
    out = []
    names = size_names(c)
    for where, made, r in others:
        if (f := fake.get(rehearsal.case_key(r))) is None:
            continue
        a, b = r["memory_components"][0], f["memory_components"][0]
        late = {k: m["backward_late_peak_mib"] - step_start(m) if "backward_late_peak_mib" in m else None
                for k, m in (("a", a), ("b", b))}
        out.append({"model": names.get(str(r["size"])) or text.params(r["parameters"]), "parameters": r["parameters"],
                    "variant": rehearsal.variant_label(r), "gpus": int(r["gpus"]), "where": where, "made": made,
                    "activation": a["activation_peak_mib"], "fake_activation": b["activation_peak_mib"],
                    "start": step_start(a), "fake_start": step_start(b),
                    "late": late["a"], "fake_late": late["b"],
                    "parts": a.get("backward_unit_peaks_mib"), "fake_parts": b.get("backward_unit_peaks_mib")})
    order = {v: i for i, v in enumerate(rehearsal.VARIANT_ORDER)}
    return sorted(out, key=lambda x: (x["where"] != "CPU tracker", x["parameters"], order.get(x["variant"], 9), x["gpus"]))


@query("rehearsal_fake_vs_gloo")
def rehearsal_fake_vs_gloo(ref: Path) -> str:
    """Fake tensors beside gloo ranks of the CPU on the cases both ran: the largest difference."""
    rows = [x for x in fake_rows(ref) if x["where"] == "CPU tracker"]
    worst = max(abs(x[k] - x[f"fake_{k}"]) for x in rows for k in ("activation", "start", "late"))
    sizes = ", ".join(dict.fromkeys(x["model"] for x in rows))
    ns = ", ".join(map(str, sorted({x["gpus"] for x in rows})))
    apart = [(x, k, v - x["fake_parts"][k]) for x in rows for k, v in x["parts"].items()
             if abs(v - x["fake_parts"][k]) >= 0.005]
    if apart:
        x, k, d = max(apart, key=lambda t: abs(t[2]))
        below = all(v < max(y["parts"].values()) for y, key, _ in apart for v in [y["parts"][key]])
        parts = (f"; of their {sum(len(y['parts']) for y in rows)} unit parts {len(apart)} lie apart, the most by "
                 f"{d:+,.2f} MiB on gloo ({x['model']} at N = {x['gpus']}, in the part of the "
                 f"{part_name(k, len(x['parts'])).split(' of ')[0]} block the backward runs)"
                 + (", each below its case's highest part" if below else ""))
    else:
        parts = "; so does every unit's part of the backward"
    return (f"On the {len(rows)} cases both ran (fsdp; {sizes}; N = {ns}), rank 0's activation peak, its "
            f"step's start and its backward's later peak on fake tensors are the gloo ranks' within "
            f"{worst:.2f} MiB{parts}")


@query("rehearsal_fake_vs_gpu")
def rehearsal_fake_vs_gpu(ref: Path) -> str:
    """fake_rows on a GPU as a table: rank 0's activation peak, step's start and later backward peak."""
    def later(x):
        return "–" if x["late"] is None or x["fake_late"] is None else \
            f"{x['late']:,.1f} / {x['fake_late']:,.1f} ({x['late'] - x['fake_late']:+,.1f})"
    body = [[x["model"], x["variant"], x["gpus"], x["made"],
             f"{x['activation']:,.1f} / {x['fake_activation']:,.1f} ({x['activation'] - x['fake_activation']:+,.1f})",
             f"{x['start'] - x['fake_start']:+,.1f}", later(x)]
            for x in fake_rows(ref) if x["where"] != "CPU tracker"]
    return (md_table(["model", "variant", "N", "commit, GPU", "activation peak, GPU / fake (MiB)",
                      "step's start, GPU less fake", "backward's later peak above the start, GPU / fake"], body)
            + f"\n\n(`{FAKE[-1][0]}`, [its README](../results/reference/{FAKE[-1][0]}/README.md))")


@query("rehearsal_fake_vs_gpu_summary")
def rehearsal_fake_vs_gpu_summary(ref: Path) -> str:
    """The GPU's activation peaks against fake tensors': the largest difference, absolute and
    relative, and the range of the state's offset."""
    rows = [x for x in fake_rows(ref) if x["where"] != "CPU tracker"]
    worst = max(rows, key=lambda x: abs(x["activation"] - x["fake_activation"]))
    rel = max(rows, key=lambda x: abs(x["activation"] / x["fake_activation"] - 1))
    offsets = [x["start"] - x["fake_start"] for x in rows]
    marked = [x for x in rows if x["late"] is not None and x["fake_late"] is not None]
    above = max(marked, key=lambda x: x["late"] - x["fake_late"])
    close = [x for x in marked if abs(x["late"] - x["fake_late"]) <= 1.0]
    named = ", ".join(f"{x['model']} N = {x['gpus']}" for x in close)
    return (f"On the {len(rows)} cases a GPU and fake tensors both ran, the GPU's activation peak is fake "
            f"tensors' within {abs(worst['activation'] - worst['fake_activation']):,.1f} MiB ({worst['model']} "
            f"{worst['variant']} at N = {worst['gpus']}), {_percent(abs(rel['activation'] / rel['fake_activation'] - 1)).lstrip('+')} "
            f"at most. Where the GPU marked its backward's later peak ({len(marked)} cases) it is fake tensors' "
            f"within 1 MiB in {len(close)} ({named}) and above "
            f"them in the others, by up to {above['late'] - above['fake_late']:,.1f} MiB ({above['model']} at "
            f"N = {above['gpus']}). The GPU's step starts {min(offsets):,.1f}-{max(offsets):,.1f} MiB higher")


def model_on_fake(cases: list[dict[str, Any]]) -> list[str]:
    """The memory model's activation peak on fake tensors' cases from N = 2, each predicted from
    its size's one-rank case among them (fsdp's: one rank shards nothing), per variant: the
    largest error and where; a variant beyond the tolerance names its misses."""
    table = [m for m in rehearsal.memory_table(cases)
             if m["component"] == "activation_peak" and m["gpus"] > 1 and m["relative_difference"] is not None]
    names = {r["size"]: text.params(r["parameters"]) for r in cases}
    out = []
    for variant in dict.fromkeys(m["variant"] for m in table):
        mine = [m for m in table if m["variant"] == variant]
        worst = max(mine, key=lambda m: abs(m["relative_difference"]))
        misses = [m for m in mine if abs(m["relative_difference"]) > TOLERANCE]
        exact = sum(1 for m in mine if abs(m["relative_difference"]) < 0.0005)
        line = (f"{variant}: within {_percent(abs(worst['relative_difference'])).lstrip('+')} of all {len(mine)} "
                f"({exact} within 0.05%; the most at {names[worst['size']]}, N = {worst['gpus']})")
        if misses:
            line += "; beyond 5%: " + ", ".join(f"{names[m['size']]} N = {m['gpus']} {_percent(m['relative_difference'])}"
                                                for m in misses)
        out.append(line)
    return out


@query("rehearsal_gpu_parts")
def rehearsal_gpu_parts(ref: Path) -> str:
    """The GPU's one-rank fsdp cases with each unit's part marked against fake tensors' (how far
    every part lies above), and the GPU's later backward peak from N = 2, predicted from the
    GPU's own one-rank case (the ranks' mean): how far the measured lies above; then which sizes
    that predicts (within 1 MiB at every N) and from which N the others' excess appears."""
    c = combined(ref)
    fake = {str(r["size"]): r for r in ok_cases(ref, FAKE) if int(r["gpus"]) == 1 and rehearsal.variant_label(r) == "fsdp"}
    names, offsets, rows, launches = size_names(c), [], [], set()
    predicted_sizes, growing, excess = [], [], []
    params = {str(r["size"]): r["parameters"] for r in c.records if r.get("size") and r.get("parameters")}
    for size in sorted(params, key=params.get):
        by_n = gpu_fsdp_by_n(c, size)
        one = by_n.get(1)
        if one is None or "backward_unit_peaks_mib" not in one["memory_components"][0] or size not in fake:
            continue
        launches.add(one[rehearsal.SOURCE])
        g, f = one["memory_components"][0], fake[size]["memory_components"][0]
        apart = [(g["backward_unit_peaks_mib"][k] - step_start(g)) - (f["backward_unit_peaks_mib"][k] - step_start(f))
                 for k in g["backward_unit_peaks_mib"]]
        offsets.append(f"{names[size]} {min(apart):+,.1f}" + (f" to {max(apart):+,.1f}" if max(apart) - min(apart) >= 0.05 else ""))
        above = {}
        for n, r in sorted(by_n.items()):
            if n < 2 or "backward_late_peak_mib" not in r["memory_components"][0]:
                continue
            predicted = predicted_by_run([one, r])[r["run_id"]]
            measured = [m["backward_late_peak_mib"] - step_start(m) for m in r["memory_components"]]
            model = [m["predicted_backward_late_above_start_mib"] for m in predicted if m["gpus"] == n]
            above[n] = sum(measured) / len(measured) - sum(model) / len(model)
            rows.append(f"{names[size]} N = {n} {above[n]:+,.1f}")
        if above and all(abs(v) < 1.0 for v in above.values()):
            predicted_sizes.append(f"{names[size]} (N = {', '.join(map(str, above))})")
        elif above:
            growing.append(f"{names[size]} from N = {min(n for n, v in above.items() if abs(v) >= 1.0)}")
            excess += [v for v in above.values() if abs(v) >= 1.0]
    order = [launch_name(*x) for x in LAUNCHES]
    made = commit_of(min(launches, key=order.index))
    return (f"From {made} the GPU marks each unit's part of its backward too. At one rank every unit's part on "
            f"the GPU lies above fake tensors' by {'; '.join(offsets)} MiB. Predicted from the GPU's own one-rank "
            f"case, its parts marked, the GPU's later backward peak from N = 2 lies above the model by "
            f"{', '.join(rows)} MiB. So the GPU's own one-rank case predicts {' and '.join(predicted_sizes) or 'none'} "
            f"to 1 MiB; at {' and '.join(growing) or 'no size'} an excess appears"
            + (f", {min(excess):,.1f} to {max(excess):,.1f} MiB at the N measured" if excess else ""))


@query("rehearsal_model_vs_fake")
def rehearsal_model_vs_fake(ref: Path) -> str:
    """model_on_fake on FAKE's cases (the newest of each)."""
    return "; ".join(model_on_fake(ok_cases(ref, FAKE)))


@query("rehearsal_keep_blind")
def rehearsal_keep_blind(ref: Path) -> str:
    """The rule for fsdp without resharding on the shapes it was not made on (FAKE_KEEP_BLIND),
    every variant, beside the older rule (every unit on every peak) on the same cases."""
    cases = ok_cases(ref, FAKE_KEEP_BLIND)
    ones = [r for r in cases if int(r["gpus"]) == 1 and rehearsal.variant_label(r) == "fsdp"]
    shapes = ", ".join(f"{r['size']} ({text.params(r['parameters'])}, batch {r['options']['per_gpu_batch']})" for r in ones)
    # the one-rank cases as older rows, their unit sizes left out: the older rule's input
    older = [line for line in model_on_fake([without_units(r) if int(r["gpus"]) == 1 else r for r in cases])
             if line.startswith("fsdp-keep:")]
    return (f"Made after the rule was committed ({KEEP_RULE}), on {len(cases)} cases of {len(ones)} shapes it was not "
            f"made on ({shapes} per rank), the activation peak from N = 2, per variant: "
            + "; ".join(model_on_fake(cases))
            + f". The older rule on the same cases: {older[0].removeprefix('fsdp-keep: ')}")


def without_units(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as one made before the units' sizes were recorded: the older rule's input."""
    return {**rec, "memory_components": [{k: v for k, v in m.items() if k != "unit_mib"}
                                         for m in rec["memory_components"]]}


def without_parts(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as one made before each unit's part was marked: the older rule's input."""
    return {**rec, "memory_components": [{k: v for k, v in m.items() if k != "backward_unit_peaks_mib"}
                                         for m in rec["memory_components"]]}


def part_name(key: str, units: int) -> str:
    """'end' -> "the root's"; a unit's index (fully_shard's order, the root last) -> its place in
    the backward's order among the units but the root ('2nd of 4': the backward runs the last first)."""
    if key == "end":
        return "the root's"
    place = units - int(key)
    return f"{place}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(place if place < 20 else place % 10, 'th') } of {units}"


def highest_part(parts: dict[str, float]) -> str:
    return max(parts, key=lambda k: parts[k])


@cache   # the table and its verdict read the same rows: made once a render
def unit_part_rows(ref: Path) -> list[dict[str, Any]]:
    """fsdp's (resharding) later backward peak above the step's start per case from N = 2 (the
    ranks' mean), measured and as the model predicts it from its size's one-rank case with each
    unit's part marked, beside the older rule (the same case, parts unmarked); the part holding
    it, measured and the model's (rank 0). The GPU's 1.08B rows are predicted from the CPU
    tracker's one-rank case (its one-rank peaks are the GPU's), 1.97B's from the one-rank case on
    fake tensors (FAKE: no machine here holds one rank of it)."""
    made_on, blind = ok_cases(ref, CPU_PARTS_MADE_ON), ok_cases(ref, CPU_PARTS_BLIND)
    ones = parts_ones(ref)
    # the GPU's rows of 1.08B (the CPU tracker's one-rank case) and of the sizes only fake tensors hold
    gpu_sizes = {r["size"] for r in ok_cases(ref, CPU_PARTS_1B)} | {s for s, (w, _) in ones.items() if w == "fake tensors"}
    cases = [("CPU tracker", r, False) for r in made_on if int(r["gpus"]) > 1]
    cases += [("CPU tracker", r, True) for r in blind if int(r["gpus"]) > 1]
    c = combined(ref)
    cases += [(card_of(r[rehearsal.SOURCE]), r, False) for size in sorted(gpu_sizes)
              for n, r in gpu_fsdp_by_n(c, size).items() if n > 1 and "zero_grad_end_mib" in r["memory_components"][0]]
    out = []
    for where, r, is_blind in cases:   # one at a time: run ids repeat across machines
        (one_where, one), m = ones[r["size"]], r["memory_components"][0]
        rows = predicted_by_run([one, r])[r["run_id"]]
        model = model_above_start(rows, ("backward_late",))["backward_late"]
        older = model_above_start(predicted_by_run([without_parts(one), r])[r["run_id"]], ("backward_late",))["backward_late"]
        units = len(one["memory_components"][0]["unit_mib"]) - 1
        predicted_parts = {k[len("predicted_backward_part_"):-len("_above_start_mib")]: v for k, v in rows[0].items()
                           if k.startswith("predicted_backward_part_")}
        measured_parts = {**m.get("backward_unit_peaks_mib", {}), "end": m.get("backward_end_part_peak_mib")}
        measured = sum(x["backward_late_peak_mib"] - step_start(x) for x in r["memory_components"]) / len(r["memory_components"])
        out.append({"model": text.params(r["parameters"]), "parameters": r["parameters"], "where": where,
                    "blind": is_blind, "gpus": int(r["gpus"]), "commit": commit_of(r[rehearsal.SOURCE]),
                    "one_rank": f"{one_where}, {commit_of(one[rehearsal.SOURCE])}", "measured": measured,
                    "model_late": model, "error": measured / model - 1, "older": older, "older_error": measured / older - 1,
                    "part": part_name(highest_part(measured_parts), units) if measured_parts["end"] is not None
                    else "not recorded",
                    "model_part": part_name(highest_part(predicted_parts), units),
                    "block": m.get("forward_last_gather_mib")})
    return sorted(out, key=lambda x: (x["where"] != "CPU tracker", x["blind"], x["parameters"], x["gpus"]))


@query("rehearsal_unit_parts")
def rehearsal_unit_parts(ref: Path) -> str:
    """unit_part_rows as a table, with the references named."""
    body = [[x["model"], f"{x['where']}, blind" if x["blind"] else x["where"], x["gpus"], x["commit"], x["one_rank"],
             f"{x['measured']:,.1f}", f"{x['model_late']:,.1f} ({_percent(x['error'])})",
             f"{x['older']:,.1f} ({_percent(x['older_error'])})", f"{x['part']} / {x['model_part']}"]
            for x in unit_part_rows(ref)]
    folder = CPU_PARTS_BLIND[0][0]
    return (md_table(["model", "where", "N", "commit", "one-rank case", "later peak above the start, measured",
                      "model, part by part (error)", "model without the parts (error)",
                      "part holding it, measured / model"], body)
            + f"\n\n(`{folder}`, [its README](../results/reference/{folder}/README.md))")


@query("rehearsal_unit_parts_verdict")
def rehearsal_unit_parts_verdict(ref: Path) -> str:
    """The blind rows' largest difference, the parts named right, the older rule's misses, and the
    GPU's rows predicted from the CPU tracker's one-rank parts."""
    rows = unit_part_rows(ref)
    blind = [x for x in rows if x["blind"]]
    out = []
    if blind:
        worst = max(blind, key=lambda x: abs(x["measured"] - x["model_late"]))
        sizes = list(dict.fromkeys(x["model"] for x in blind))
        ns = ", ".join(map(str, sorted({x["gpus"] for x in blind})))
        right = sum(x["part"] == x["model_part"] for x in blind)
        out.append(f"Made after the rule was committed ({PARTS_RULE}), the blind rows ({', '.join(sizes[:-1])} and "
                   f"{sizes[-1]} at N = {ns}) lie within {abs(worst['measured'] - worst['model_late']):,.2f} MiB "
                   f"({_percent(abs(worst['error'])).lstrip('+')}) of it, and the part holding the later peak is the "
                   f"model's in {right} of {len(blind)}.")
        older = max(blind, key=lambda x: abs(x["older_error"]))
        out.append(f"Without the parts the same rows lie up to {_percent(older['older_error'])} from the model "
                   f"({older['model']} at N = {older['gpus']}).")
    gpu = [x for x in rows if x["where"] != "CPU tracker" and abs(x["older_error"]) > TOLERANCE]
    if gpu:
        def part(x: dict[str, Any]) -> str:
            return "" if x["part"] == "not recorded" else \
                f" (the peak in the {x['part']}'s part, the model's in the {x['model_part']}'s)"
        each = "; ".join(f"{x['model']} at N = {x['gpus']} ({x['where']}, {x['commit']}) {_percent(x['error'])}, "
                         f"{_percent(x['older_error'])} without the parts{part(x)}" for x in gpu)
        over = [x["measured"] - x["model_late"] for x in gpu]
        blocks = [x["block"] for x in gpu]
        where = {"CPU tracker": "of the CPU tracker", "fake tensors": "on fake tensors"}
        sources = " and ".join(dict.fromkeys(f"{where.get(x['one_rank'].split(',')[0], x['one_rank'])} ({x['model']})"
                                             for x in gpu))
        out.append(f"On the GPU, predicted from the one-rank cases {sources}: {each}. "
                   f"Each lies above the model by {min(over):,.1f}-{max(over):,.1f} MiB, less than one block "
                   f"({min(blocks):,.1f}-{max(blocks):,.1f} MiB, as large as gloo's GPU copy of a collective's buffer).")
    return " ".join(out)


@query("rehearsal_ddp_236m_n4")
def rehearsal_ddp_236m_n4(ref: Path) -> str:
    """ddp at 236M on 4 ranks, the case whose search lost the ranks before: its trials in order,
    its largest batch per budget, and its highest trial's peak per rank beside the GPU."""
    (r,) = [r for r in combined(ref).records if r.get("size") == "1024x16" and int(r["gpus"]) == 4
            and r["variant"] == "ddp"]
    if r.get("status") != "ok":
        return f"it has not run to its end ({r['reason']})"
    trials = r["search_trials"]
    top = max(trials, key=lambda t: t["peak_mib"] or 0)
    found = "; ".join(f"{name} {s['largest']}" for name, s in r["search"].items())
    return (f"at {commit_of(r[rehearsal.SOURCE])} it ran to its end, with trials at batches "
            f"{', '.join(str(t['batch']) for t in trials)} (largest batch {found}); its highest trial, batch "
            f"{top['batch']}, peaked at {top['peak_mib']:,.0f} MiB a rank")


def forward_miss(ref: Path, launches: tuple[tuple[str, str], ...], made: str = "") -> str:
    """The forward's miss at the largest N of earlier 2048x20 cases, and where they are."""
    cpu = ok_cases(ref, launches)
    last = max(cpu, key=lambda r: int(r["gpus"]))
    rows = predicted_by_run(cpu)[last["run_id"]]
    model = model_above_start(rows, ("forward",))["forward"]
    return f"{_percent(above_start(last)['forward'] / model - 1)} (`{launches[0][0]}`{', ' + made if made else ''})"


@query("rehearsal_cpu_tracker_1b_before")
def rehearsal_cpu_tracker_1b_before(ref: Path) -> str:
    return forward_miss(ref, CPU_BEYOND_BEFORE, "made before the split")


@query("rehearsal_cpu_tracker_1b_kept_only")
def rehearsal_cpu_tracker_1b_kept_only(ref: Path) -> str:
    return forward_miss(ref, CPU_BEYOND_KEPT_ONLY)


@query("rehearsal_cpu_tracker_kept")
def rehearsal_cpu_tracker_kept(ref: Path) -> str:
    """The CPU tracker's 236M cases made with the model's forward marked, against the model."""
    return cpu_model_table(ref, CPU_KEPT)


@query("rehearsal_reserved_by_stream")
def rehearsal_reserved_by_stream(ref: Path) -> str:
    """Per case whose records hold it (rank 0): reserved by CUDA stream after the profiled step
    against the reserved and allocated peaks (MiB): how much of the slack the side streams hold."""
    c, body = combined(ref), []
    names = size_names(c)
    for r in sorted((r for r in c.records if r.get("status") == "ok" and (r.get("memory_components") or [{}])[0].get("reserved_by_stream_mib")),
                    key=lambda r: (r["parameters"], case_order(r))):
        m = r["memory_components"][0]
        streams = m["reserved_by_stream_mib"]
        side = [v for k, v in streams.items() if k != "0"]
        peak = allocated_peak(m)
        body.append([names[str(r["size"])], rehearsal.variant_label(r), r["gpus"], made_at(r[rehearsal.SOURCE]),
                     f"{m['reserved_peak_mib']:,.0f}", f"{peak:,.0f}", f"{m['reserved_peak_mib'] - peak:,.0f}",
                     f"{streams.get('0', 0):,.0f}", " + ".join(f"{v:,.0f}" for v in side) or "none", f"{sum(side):,.0f}"])
    return md_table(["model", "variant", "N", "commit, GPU", "reserved peak", "allocated peak", "slack",
                     "default stream", "other streams", "other streams, sum"], body)


@query("rehearsal_side_share")
def rehearsal_side_share(ref: Path) -> str:
    """At 236M, N >= 2, the sharded variants' side streams' pools as a share of their slack
    (reserved less the allocated peak), rank 0: the range, and the rows."""
    c = combined(ref)
    shares = []
    for r in c.records:
        m = (r.get("memory_components") or [{}])[0]
        streams = m.get("reserved_by_stream_mib")
        if (r.get("status") == "ok" and streams and str(r["size"]) == "1024x16" and int(r["gpus"]) >= 2
                and rehearsal.variant_label(r) in ("fsdp", "fsdp-keep", "hsdp")):
            side = sum(v for k, v in streams.items() if k != "0")
            shares.append(side / (m["reserved_peak_mib"] - allocated_peak(m)))
    return f"{100 * min(shares):.0f}% to {100 * max(shares):.0f}% ({len(shares)} records)"


# gloo's own GPU copies per collective, beside the cases (tools/device/gloo_clone_probe.py)
GLOO_PROBE = ("h100-rehearsal-1307c9b", "gloo_clone.log")
# the cases two launches ran on different cards, at the same torch: what the card changes
CARD_PAIRS = ((("h200-rehearsal-a7dce61", "n4-1b-fsdp.tar.gz"), ("h100-rehearsal-1307c9b", "n4-1b-fsdp.tar.gz")),
              (("h200-rehearsal-a7dce61", "n8-235m.tar.gz"), ("h100-rehearsal-1307c9b", "n8-235m.tar.gz")))
ALLOCATED = ("forward_peak_mib", "backward_peak_mib", "model_forward_peak_mib", "forward_end_mib",
             "zero_grad_end_mib", "backward_end_mib", "forward_last_gather_mib", "forward_last_unit_start_mib")


@query("rehearsal_gloo_copies")
def rehearsal_gloo_copies(ref: Path) -> str:
    """Per collective in the probe: what gloo held on the GPU above the collective's own tensors."""
    seen = [json.loads(line) for line in (ref / GLOO_PROBE[0] / GLOO_PROBE[1]).read_text().splitlines()
            if line.startswith("{")]
    said = "; ".join(f"`{x['collective']}` {x['peak_above_tensors_mib']:,.0f} MiB above its own "
                     f"{x['tensors_mib']:,.0f} MiB" for x in seen)
    first = seen[0]
    return (f"{said} (two processes on one {card_of(GLOO_PROBE[0])}, {first['input_mib']:,} MiB the reduce-scatter's "
            f"input, the all-gather's output and the all-reduce's tensor, torch "
            f"{first['torch']}; `tools/device/gloo_clone_probe.py`, `{launch_name(*GLOO_PROBE)}`)")


@query("rehearsal_card_check")
def rehearsal_card_check(ref: Path) -> str:
    """Per case run on two cards: the largest difference of rank 0's allocated levels and peaks,
    and each rank's reserved difference."""
    out = []
    for old, new in CARD_PAIRS:
        a, b = (next(r for r in rehearsal.read_launch(ref / x[0] / x[1])[0] if not r.get("launched")
                     and r.get("status") == "ok" and rehearsal.variant_label(r) == "fsdp") for x in (old, new))
        diff = max(abs(b["memory_components"][0][k] - a["memory_components"][0][k]) for k in ALLOCATED)
        reserved = sorted({round(y["reserved_peak_mib"] - x["reserved_peak_mib"], 1)
                           for x, y in zip(a["memory_components"], b["memory_components"], strict=True)})
        out.append(f"{text.params(a['parameters'])} fsdp at N = {a['gpus']} ({card_of(old[0])} at {commit_of(old[0])}, "
                   f"{card_of(new[0])} at {commit_of(new[0])}): allocated levels and peaks within {diff:,.1f} MiB, "
                   f"reserved {' / '.join(f'{d:+,.0f}' for d in reserved)} MiB a rank")
    return "; ".join(out)


def memory_caption(ref: Path, size: str) -> str:
    c = combined(ref)
    workload = next(r["options"]["workload"] for r in c.records if r.get("size") == size and (r.get("options") or {}).get("workload"))
    return f"The {size_names(c)[size]} model (`{workload}`):\n\n{memory_table(ref, size)}"


@query("rehearsal_memory_table_12m")
def rehearsal_memory_table_12m(ref: Path) -> str:
    return memory_caption(ref, "256x4")


@query("rehearsal_memory_table_42m")
def rehearsal_memory_table_42m(ref: Path) -> str:
    return memory_caption(ref, "512x8")


@query("rehearsal_memory_table_236m")
def rehearsal_memory_table_236m(ref: Path) -> str:
    return memory_caption(ref, "1024x16")


@query("rehearsal_memory_table_1b")
def rehearsal_memory_table_1b(ref: Path) -> str:
    return memory_caption(ref, "2048x20")


@query("rehearsal_memory_table_2b")
def rehearsal_memory_table_2b(ref: Path) -> str:
    return memory_caption(ref, "2560x24")


@query("rehearsal_crossover_table")
def rehearsal_crossover_table(ref: Path) -> str:
    """Per sharded variant, N and budget: the first size where its largest batch exceeds DDP's,
    measured and the memory model's, and the batches (sharded / DDP) at each size."""
    body = []
    for x in sorted(combined(ref).crossovers(), key=lambda x: (x.budget, x.gpus, x.name)):
        pairs = ", ".join(f"{text.params(p)}: {s:g} / {b:g}" for p, s, b in zip(x.parameters, x.sharded, x.baseline))
        model = ", ".join(f"{text.params(p)}: {s:g} / {b:g}" for p, s, b in
                          zip(x.parameters, x.predicted_sharded, x.predicted_baseline) if s is not None and b is not None)
        body.append([x.budget, f"{x.cap_gib:g}" if x.cap_gib else "–", x.gpus, x.name,
                     text.params(x.first_exceeds) if x.first_exceeds else "none",
                     text.params(x.predicted_first_exceeds) if x.predicted_first_exceeds else "none", pairs, model])
    return md_table(["budget", "GiB per rank", "N", "variant", "first beyond DDP, measured", "model's",
                     "largest batch sharded / DDP", "model: sharded / DDP"], body)


HOST_STAGING = "399b0d0"   # run.host_staging: launches from here on release gloo's pinned staging and record it


@query("rehearsal_host_peaks")
def rehearsal_host_peaks(ref: Path) -> str:
    """Per case whose ranks recorded their host peaks (launches from HOST_STAGING on): the most
    page-locked staging one rank held and its peak resident memory."""
    c = combined(ref)
    names = size_names(c)
    parts = []
    for r in sorted(c.records, key=case_order):
        rows = [m for m in r.get("memory_components") or [] if m.get("host_rss_peak_mib") is not None]
        if not rows:
            continue
        pinned = [m["host_pinned_peak_mib"] for m in rows if m.get("host_pinned_peak_mib") is not None]
        parts.append(f"{rehearsal.variant_label(r)} {names[str(r['size'])]} at N = {r['gpus']} "
                     f"({card_of(r[rehearsal.SOURCE])}): {max(pinned):,.0f} MiB page-locked, "
                     f"{max(m['host_rss_peak_mib'] for m in rows):,.0f} MiB resident")
    return "; ".join(parts) if parts else "no launch recorded them yet"


EDGE_SEARCH = "d9bc110"   # rehearsal.edge_search: the searches of launches at this commit and after
EDGE_SEARCH_FIRST = "h100-rehearsal-cb9adc2"   # the first of LAUNCHES (in their order) made with it


@query("rehearsal_search_trials")
def rehearsal_search_trials(ref: Path) -> str:
    """Trials each search ran to its end beyond batches 1 and 2 (which every case runs first),
    in the launches before the edge search and from it on."""
    c = combined(ref)
    first = next(i for i, (r, _) in enumerate(LAUNCHES) if r == EDGE_SEARCH_FIRST)
    counts: dict[bool, list[int]] = {False: [], True: []}
    exact: dict[bool, int] = {False: 0, True: 0}
    for i, (r, t) in enumerate(LAUNCHES):
        for rec in c.launches[launch_name(r, t)]:
            for s in (rec.get("search") or {}).values():
                if not s.get("cut_short") and s.get("largest"):
                    ran = {d[0] for d in s["trials"] if d[3] in ("measured", "failed") and d[0] > 2}
                    counts[i >= first].append(len(ran))
                    exact[i >= first] += s.get("smallest_failing") == s["largest"] + 1
    parts = []
    for edge, label in ((False, "before it"), (True, "from it on")):
        n = sorted(counts[edge])
        if n:
            parts.append(f"{label}, {len(n)} searches that found a batch: median {n[len(n) // 2]} trials, at "
                         f"most {n[-1]}; the batch above the largest failed in {exact[edge]} of them")
    return "; ".join(parts)


@query("rehearsal_host_staging_from")
def rehearsal_host_staging_from(ref: Path) -> str:
    return f"`{HOST_STAGING}`"


@query("rehearsal_edge_search_from")
def rehearsal_edge_search_from(ref: Path) -> str:
    return f"`{EDGE_SEARCH}`"


@query("rehearsal_crossover_open")
def rehearsal_crossover_open(ref: Path) -> str:
    """The swept sizes the crossovers lack that could still move one (rehearsed.open_cells): open
    ones, and those the variant's undivided parameters and gradients close."""
    c = combined(ref)
    cells = open_cells(c.crossovers(), c.records)
    if not cells:
        return "- None: below every crossover, and at every size of a row with none, both searches ran to their end."
    lines = []
    for cell in sorted(cells, key=lambda x: (x["floor_mib"] is not None, x["budget"], x["gpus"], x["label"], x["parameters"])):
        where = f"{cell['label']} at {text.params(cell['parameters'])} ({cell['size']}), {cell['budget']}, N = {cell['gpus']}"
        if cell["floor_mib"] is None:
            lines.append(f"- **Open:** {where}: no search of it ran to its end, so its row's crossover may move there.")
        else:
            lines.append(f"- Closed without a search: {where}: its parameters and gradients alone, which "
                         f"{cell['label']} does not divide, are {cell['floor_mib']:,.0f} MiB a rank at the backward's end, "
                         f"beyond the budget's {cell['cap_gib'] * 1024:,.0f} MiB, so no batch fits.")
    return "\n".join(lines)


@query("rehearsal_ddp_by_n")
def rehearsal_ddp_by_n(ref: Path) -> str:
    """Per size, DDP's measured peak a rank at batch 1 in every launch that measured it, by N:
    the evidence that DDP's memory a rank does not depend on N (ddp_from_one_rank's premise)."""
    c = combined(ref)
    names = size_names(c)
    peaks: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for recs in c.launches.values():
        for r in recs:
            if r.get("variant") == "ddp" and r.get("status") == "ok":
                peaks[str(r["size"])][int(r["gpus"])] += [t["peak_mib"] for t in r.get("search_trials") or []
                                                          if t.get("batch") == 1 and t.get("how") == "measured"]
    parts = []
    for size in sorted(peaks, key=lambda s: text.params_value(names[s])):
        by_n = {n: v for n, v in sorted(peaks[size].items()) if v}
        every = [p for v in by_n.values() for p in v]
        span = f"{min(every):,.1f}" if round(min(every), 1) == round(max(every), 1) \
            else f"{min(every):,.1f} to {max(every):,.1f}"
        parts.append(f"{names[size]} at N = {', '.join(str(n) for n in by_n)}: {span} MiB ({len(every)} records)")
    return "; ".join(parts)


@query("rehearsal_ddp_carried")
def rehearsal_ddp_carried(ref: Path) -> str:
    """The DDP rows the crossovers take from one rank (rehearsed.ddp_from_one_rank), one line each."""
    rows = [r for r in combined(ref).rows if r.get(DDP_FROM_ONE_RANK)]
    names = {int(r["parameters"]): text.params(r["parameters"]) for r in rows}
    by: dict[tuple[int, str], list[int]] = defaultdict(list)
    for r in rows:
        by[(int(r["parameters"]), str(r["budget"]))].append(int(r["gpus"]))
    return "\n".join(f"- {names[p]}, {budget}: DDP 0 at N = {', '.join(str(n) for n in sorted(ns))}"
                     for (p, budget), ns in sorted(by.items())) or "- none"


@query("rehearsal_c9")
def rehearsal_c9(ref: Path) -> str:
    """C9 as the ledger words it from the combined searches (the bold verdict line)."""
    f = finding(combined(ref).rows)
    return f"**C9 ({f.verdict})**: {f.summary}"


@query("rehearsal_not_run")
def rehearsal_not_run(ref: Path) -> str:
    """One sentence per (size, N) whose cases failed or were not run, from the records' reasons,
    and one per budget N ranks could not rehearse on the device."""
    c = combined(ref)
    names = size_names(c)
    failed = rehearsal.not_ok_rows(c.records)
    lines = []
    for size, gpus in sorted({(f["size"], f["gpus"]) for f in failed}, key=lambda k: (k[1], text.params_value(names[k[0]]))):
        group = [f for f in failed if (f["size"], f["gpus"]) == (size, gpus)]
        launches = sorted({f[rehearsal.SOURCE] for f in group})
        reasons: dict[str, list[str]] = {}
        for f in group:
            reasons.setdefault(f["reason"], []).append(f["variant"])
        said = "; ".join(f"{', '.join(vs)}: {why}" for why, vs in reasons.items())
        lines.append(f"- {names[size]} ({size}) at N = {gpus} did not run ({', '.join(f'`{x}`' for x in launches)}): "
                     f"{said}.")
    for reference, tar in LAUNCHES:   # older launches wrote no record where their ranks were killed
        if not c.launches[launch_name(reference, tar)]:
            why = rehearsal.first_failure(rehearsal.launch_log(ref / reference / tar)) or "no rank reported a failure"
            lines.append(f"- `{launch_name(reference, tar)}` wrote no record: its ranks stopped ({why}; the "
                         f"launch's README says what it ran).")
    for nf in c.not_fitting:
        cards = " and ".join(sorted({card_of(x) for x in nf["launches"]}))
        lines.append(f"- The {nf['budget']} budget at N = {nf['ranks']} was not searched in "
                     f"{', '.join(f'`{x}`' for x in nf['launches'])} (on the {cards}; the newest one's words): {nf['reason']}.")
    for r in sorted(c.records, key=case_order):   # ran, but its search stopped at the launch's time
        cut = {name: s["largest"] for name, s in (r.get("search") or {}).items() if s.get("cut_short")}
        if r.get("status") == "ok" and cut:
            # a search an earlier launch ran where the newest's GPU could not (rehearsal.SEARCH_FROM)
            source = {(r.get(rehearsal.SEARCH_FROM) or {}).get(name, r[rehearsal.SOURCE]) for name in cut}
            fits = ", ".join(f"{name}: batch {b} fits so far" if b else f"{name}: no batch measured"
                             for name, b in cut.items())
            lines.append(f"- {rehearsal.variant_label(r)} at {names[str(r['size'])]} ({r['size']}), N = {r['gpus']} "
                         f"({', '.join(f'`{x}`' for x in sorted(source))}): its memory was measured, but its search "
                         f"was cut short by the launch's time budget ({fits}), so C9 takes no largest batch from it.")
    return "\n".join(lines)


# -- figures ---------------------------------------------------------------------------------------

def figure_paths(root: Path = ROOT) -> dict[str, Path]:
    return {"memory-256x4": root / FIGURES / "rehearsal-memory-256x4.png",
            "memory-512x8": root / FIGURES / "rehearsal-memory-512x8.png",
            "memory-1024x16": root / FIGURES / "rehearsal-memory-1024x16.png",
            "memory-2048x20": root / FIGURES / "rehearsal-memory-2048x20.png",
            "memory-2560x24": root / FIGURES / "rehearsal-memory-2560x24.png",
            "largest-batch": root / FIGURES / "rehearsal-largest-batch.png"}


def draw(root: Path = ROOT) -> list[Path]:
    """The page's figures from the combined references: memory per rank by component against N
    for each size, and the largest batch against model size per (budget, N)."""
    # matplotlib only where figures are drawn: the page's queries never need it
    from dpbench.report.figstyle import save, style
    from dpbench.report.sharding_plots import plot_rehearsed_batches, plot_rehearsed_memory
    c = combined(root / "results" / "reference")
    names = size_names(c)
    paths = figure_paths(root)
    paths["memory-256x4"].parent.mkdir(parents=True, exist_ok=True)
    with style():
        for size in ("256x4", "512x8", "1024x16", "2048x20", "2560x24"):
            save(plot_rehearsed_memory(c.memory, size, f"{names[size]} ({size})", rehearsal.not_run_at(c.records, size)),
                 paths[f"memory-{size}"])
        save(plot_rehearsed_batches(c.rows, [dict(x.__dict__) for x in c.crossovers()]), paths["largest-batch"])
    return list(paths.values())


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    for p in draw():
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
