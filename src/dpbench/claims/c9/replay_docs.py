"""docs/sharding.md's reserved memory replayed: rank 0's device allocations of each sharded
rehearsal case, recorded on fake tensors (claims.c9.alloc_trace, the reference ALLOC_TRACES),
replayed through the CUDA caching allocator's rules (analysis.caching_allocator) and set beside
what the GPU's allocator reserved in the rehearsal launches (claims.c9.docs.LAUNCHES). Torch-free;
reads only the committed references.
"""
from __future__ import annotations

import json
import statistics
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dpbench.analysis import gpu_alloc_history, rehearsal
from dpbench.analysis.caching_allocator import MIB, PROFILED_END, SHARDED, Snapshot, replay
from dpbench.claims.c9 import text
from dpbench.claims.c9.docs import (LAUNCHES, _percent, card_of, combined, commit_of, launch_name, made_at,
                                    reserved_checked)
from dpbench.report.docs_queries import query
from dpbench.report.markdown import md_table

ALLOC_TRACES = ("cpu-alloc-87b6119", "traces.tar.gz")
# The traces of the rules the first blind check froze (through 11dc2db): cuBLAS's workspaces as two
# of 32 MiB at the first GEMM, every case replayed as its process's first
BLIND_TRACES = ("cpu-alloc-5aa7b30", "traces.tar.gz")
# The last launch made before run.sharded.shard_model emptied the cache after sharding (5191b45):
# every launch after it ran with the whole model's segments released
LAST_KEPT_SEGMENTS = ("h100-rehearsal-ceb1b88", "n8-235m-fsdp.tar.gz")
# The first launch made after the replay was fixed (the allocator's rules, the traces at 5aa7b30
# and this module at 11dc2db): from it on, the first blind check
FIRST_AFTER_REPLAY: tuple[str, str] | None = ("h100-rehearsal-11dc2db", "n1-235m-1b-fsdp.tar.gz")
# The last launch the rules of ALLOC_TRACES saw (the GPU's own allocator history that led to
# them): launches after it are their blind check
LAST_SEEN_BY_PRELUDES = ("h100-alloc-history-209515f", "n1-12m.tar.gz")
GLOO = "gloo"                      # claims.c9.alloc_trace's tag of gloo's copies

Key = tuple[str, str, int]         # (size, variant label, N)


def trace_label(trace: dict[str, Any]) -> str:
    """A trace's case as analysis.rehearsal.variant_label names a record's."""
    keep = (trace.get("options") or {}).get("reshard_after_forward") is False
    return trace["variant"] + ("-keep" if keep else "")


@cache
def traces(ref: Path, which: tuple[str, str] = ALLOC_TRACES) -> dict[Key, dict[str, Any]]:
    """(size, variant label, N) -> the trace, from the reference's tar."""
    out = {}
    with tarfile.open(ref / which[0] / which[1]) as tar:
        for member in tar.getmembers():
            if member.name.endswith("traces.jsonl"):
                for line in tar.extractfile(member).read().decode().splitlines():
                    t = json.loads(line)
                    if t.get("status", "ok") == "ok":   # a failed case's line holds its reason, no events
                        out[(t["size"], trace_label(t), int(t["ranks"]))] = t
    return out


@cache
def replayed(ref: Path, key: Key, emptied: bool, gloo: bool = True, after: Key | None = None,
             which: tuple[str, str] = ALLOC_TRACES) -> Snapshot:
    """The trace's replay at the profiled step's end: with the cache emptied after sharding
    (`emptied`) or not, with gloo's copies (a rehearsed rank) or without (a rank over NCCL),
    as its process's first case or `after` another (what that case left: cuBLAS's workspaces)."""
    def events(k: Key) -> list[tuple]:
        return [tuple(e) for e in traces(ref, which)[k]["events"]]
    return replay(events(key), empty_cache_at=(SHARDED,) if emptied else (), without=() if gloo else (GLOO,),
                  after=events(after) if after else ()).marks[PROFILED_END]   # the GPU's snapshot


def launched_after(launch: str, last: tuple[str, str]) -> bool:
    order = [launch_name(*x) for x in LAUNCHES]
    return order.index(launch) > order.index(launch_name(*last))


def emptied_cache(launch: str) -> bool:
    """Whether a launch ran after shard_model began to empty the cache after sharding."""
    return launched_after(launch, LAST_KEPT_SEGMENTS)


def record_key(r: dict[str, Any]) -> Key:
    return (str(r.get("size")), rehearsal.variant_label(r), int(r.get("gpus") or 0))


def process_first(launch: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, Any]:
    """The first case that ran in the record's process: claims.c9.rehearsal runs each N's cases
    one after another in one torchrun (a skipped case never built its model)."""
    same = [r for r in launch if not r.get("launched") and r.get("gpus") == record.get("gpus")
            and r.get("status") != "skipped"]
    return same[0] if same else record


def prelude(have: dict[Key, dict[str, Any]], first: dict[str, Any], key: Key) -> tuple[Key | None, bool]:
    """The trace to replay before the record's own, and whether it stands in for the first case:
    none where the record was its process's first; the first case's trace where it has one; else
    (ddp and zero1 are not traced) fsdp's at the first case's size, or the record's own."""
    first_key = record_key(first)
    if first_key == key:
        return None, False
    for k in (first_key, (first_key[0], "fsdp", key[2]), key):
        if k in have:
            return k, k != first_key
    return None, False


@dataclass(frozen=True)
class Row:
    """Rank 0 of one GPU record beside its trace's replay, MiB."""
    size: str
    variant: str
    gpus: int
    launch: str
    measured: float                     # the reserved peak
    measured_streams: dict[str, float]  # by stream at the step's end ({} where not recorded)
    replayed: Snapshot
    nccl: Snapshot                      # the same case as a rank over NCCL: no gloo copies, cache emptied
    after: Key | None = None            # the case replayed first (its process's first), if any
    stand_in: bool = False              # whether that trace stands in for an untraced first case

    @property
    def error(self) -> float:
        # reserved only grows within a step: its end is the profiled step's reserved peak
        return self.measured / (self.replayed.reserved / MIB) - 1.0


def rows(ref: Path, newest_only: bool = False, which: tuple[str, str] = ALLOC_TRACES,
         preludes: bool = True) -> list[Row]:
    """Every ok GPU record of a sharded case whose trace is in the reference (its batch the
    trace's), rank 0's; `newest_only`: one per case, the newest launch's (as the page's tables).
    `preludes`: each replayed after its process's first case (False: as that first case, the
    rules of BLIND_TRACES)."""
    c = combined(ref)
    have = traces(ref, which)
    records = (c.records if newest_only else
               [{**r, rehearsal.SOURCE: name} for name, recs in c.launches.items() for r in recs])
    out = []
    for r in records:
        key = record_key(r)
        m = (r.get("memory_components") or [{}])[0]
        if (r.get("status") != "ok" or r.get("launched") or key not in have
                or (r.get("options") or {}).get("per_gpu_batch") != have[key]["batch"]
                or not isinstance(m.get("reserved_peak_mib"), (int, float))):
            continue
        launch = r[rehearsal.SOURCE]
        after, stand_in = prelude(have, process_first(c.launches[launch], r), key) if preludes else (None, False)
        out.append(Row(*key, launch, m["reserved_peak_mib"], m.get("reserved_by_stream_mib") or {},
                       replayed(ref, key, emptied_cache(launch), after=after, which=which),
                       replayed(ref, key, True, gloo=False, which=which), after, stand_in))
    names = {str(r["size"]): r["parameters"] for r in c.records if r.get("parameters")}
    return sorted(out, key=lambda x: (names.get(x.size, 0), rehearsal.sort_key((x.size, x.variant, x.gpus)), x.launch))


def side(streams: dict[str, float]) -> float:
    return sum(v for k, v in streams.items() if k != "0")


def names(ref: Path) -> dict[str, str]:
    return {str(r["size"]): text.params(r["parameters"]) for r in combined(ref).records if r.get("parameters")}


@query("rehearsal_reserved_replayed")
def rehearsal_reserved_replayed(ref: Path) -> str:
    """Per GPU record that holds its streams (rank 0): reserved measured and replayed, the
    default stream and the others, MiB; and the replay of the same case on a rank over NCCL."""
    n = names(ref)
    body = []
    for x in rows(ref):
        if not x.measured_streams:
            continue
        sim = {k: v / MIB for k, v in x.replayed.reserved_by_stream.items()}
        body.append([n[x.size], x.variant, x.gpus, made_at(x.launch) + (", emptied" if emptied_cache(x.launch) else ""),
                     f"{x.measured_streams.get('0', 0):,.0f} / {sim.get('0', 0):,.0f}",
                     f"{side(x.measured_streams):,.0f} / {side(sim):,.0f}",
                     f"{x.measured:,.0f} / {x.replayed.reserved / MIB:,.0f}", _percent(x.error),
                     f"{x.nccl.reserved / MIB:,.0f}"])
    return md_table(["model", "variant", "N", "commit, GPU", "default stream, measured / replayed",
                     "other streams, measured / replayed", "reserved peak, measured / replayed", "error",
                     "replayed over NCCL"], body)


def slack_errors(ref: Path) -> dict[tuple[str, str, int], float]:
    """The slack rule's error (memory_model.with_references) where it predicts reserved."""
    return {(m["size"], m["variant"], m["gpus"]): m["relative_difference"] for m in reserved_checked(combined(ref))}


@query("rehearsal_reserved_replay_summary")
def rehearsal_reserved_replay_summary(ref: Path) -> str:
    """The replay's error over every GPU record of a sharded case (rank 0's reserved peak), and
    beside the slack rule on the rows both predict (the page's newest records)."""
    every = rows(ref)
    errors = [abs(x.error) for x in every]
    within = sum(e <= 0.05 for e in errors)
    worst = max(every, key=lambda x: abs(x.error))
    n = names(ref)
    slack = slack_errors(ref)
    both = [(x, slack[(x.size, x.variant, x.gpus)]) for x in rows(ref, newest_only=True)
            if (x.size, x.variant, x.gpus) in slack]
    to_2_mib = sum(abs(x.measured - x.replayed.reserved / MIB) <= 2 for x in every)   # one segment's rounding
    said = (f"over {len(every)} GPU records of sharded cases (rank 0; {len({x.launch for x in every})} launches) the "
            f"replay's reserved peak is within 5% of the measured in {within} and within 2 MiB in {to_2_mib}, "
            f"its median |error| "
            f"{100 * statistics.median(errors):.1f}%, the largest {_percent(worst.error)} ({worst.variant} at "
            f"{n[worst.size]}, N = {worst.gpus}, {made_at(worst.launch)})")
    if both:
        said += (f"; on the {len(both)} rows the slack rule predicts, the replay's largest |error| is "
                 f"{100 * max(abs(x.error) for x, _ in both):.1f}% and the slack rule's "
                 f"{100 * max(abs(e) for _, e in both):.1f}%")
    return said


@query("rehearsal_reserved_replay_blind")
def rehearsal_reserved_replay_blind(ref: Path) -> str:
    """The rows from launches made after the first rules were fixed (BLIND_TRACES, every case as
    its process's first), each one's error under those rules."""
    if FIRST_AFTER_REPLAY is None:
        return "none yet"
    order = [launch_name(*x) for x in LAUNCHES]
    after = set(order[order.index(launch_name(*FIRST_AFTER_REPLAY)):])
    n = names(ref)
    blind = [x for x in rows(ref, which=BLIND_TRACES, preludes=False) if x.launch in after]
    return "; ".join(f"{x.variant} at {n[x.size]}, N = {x.gpus} ({commit_of(x.launch)}): {_percent(x.error)}"
                     for x in blind) or "none yet"


@query("rehearsal_reserved_prelude_blind")
def rehearsal_reserved_prelude_blind(ref: Path) -> str:
    """The rows from launches made after the current rules were fixed (LAST_SEEN_BY_PRELUDES)."""
    n = names(ref)
    blind = [x for x in rows(ref) if launched_after(x.launch, LAST_SEEN_BY_PRELUDES)]
    return "; ".join(f"{x.variant} at {n[x.size]}, N = {x.gpus} ({commit_of(x.launch)}): {_percent(x.error)}"
                     for x in blind) or "none yet"


@query("rehearsal_replay_beyond")
def rehearsal_replay_beyond(ref: Path) -> str:
    """The GPU records whose reserved peak lies more than 5% from the replay, by model size: how
    many of that size's rows, and by how much the GPU held more (+) or less (-) than replayed."""
    n = names(ref)
    by_size: dict[str, list[Row]] = {}
    for x in rows(ref):
        by_size.setdefault(x.size, []).append(x)
    said = []
    for size, xs in by_size.items():
        beyond = [x for x in xs if abs(x.error) > 0.05]
        if beyond:
            diffs = sorted(x.measured - x.replayed.reserved / MIB for x in beyond)
            span = f"{diffs[0]:+,.0f}" + (f" to {diffs[-1]:+,.0f}" if len(diffs) > 1 else "")
            where = (f"{beyond[0].variant}, N = {beyond[0].gpus}, {made_at(beyond[0].launch)}" if len(beyond) == 1
                     else f"{len(beyond)} of its {len(xs)} rows")
            said.append(f"{n[size]} ({where}: {span} MiB)")
    return "; ".join(said) or "none"


@query("rehearsal_replay_side_short")
def rehearsal_replay_side_short(ref: Path) -> str:
    """Where N >= 2 and the record holds its streams: the range of the side streams' measured
    bytes less replayed, and of the default stream's (MiB)."""
    xs = [x for x in rows(ref) if x.measured_streams and x.gpus >= 2]
    def span(values: list[float]) -> str:
        return f"{min(values):+,.0f} to {max(values):+,.0f} MiB"
    side_diff = [side(x.measured_streams) - side({k: v / MIB for k, v in x.replayed.reserved_by_stream.items()}) for x in xs]
    default_diff = [x.measured_streams.get("0", 0) - x.replayed.reserved_by_stream.get("0", 0) / MIB for x in xs]
    return f"the default stream {span(default_diff)}, the other streams {span(side_diff)} ({len(xs)} records)"


@query("rehearsal_replay_emptied")
def rehearsal_replay_emptied(ref: Path) -> str:
    """Per traced case where emptying the cache after sharding changes the replayed reserved
    bytes at the step's end by 5% or more (gloo's copies kept): without -> with, MiB."""
    n = {**names(ref)}
    changed = []
    for key in traces(ref):
        before, after = (replayed(ref, key, e).reserved / MIB for e in (False, True))
        if abs(after / before - 1) >= 0.05:
            changed.append((after / before - 1, key, before, after))
    changed.sort()
    return "; ".join(f"{v} at {n.get(s, s)}, N = {g}: {b:,.0f} -> {a:,.0f} ({_percent(d)})"
                     for d, (s, v, g), b, a in changed) or "none by 5%"


@query("rehearsal_reserved_regime_misses")
def rehearsal_reserved_regime_misses(ref: Path) -> str:
    """The slack rule's reserved misses beyond tolerance: for each, the launch its slack came
    from, whether the cache was emptied after sharding there and in the row's own launch, and
    the replay's error on the row."""
    c, n = combined(ref), names(ref)
    launch = {(str(r["size"]), rehearsal.variant_label(r), int(r["gpus"])): r[rehearsal.SOURCE]
              for r in c.records if r.get("status") == "ok"}
    replay_error = {(x.size, x.variant, x.gpus): x.error for x in rows(ref, newest_only=True)}
    said = []
    for m in reserved_checked(c):
        if not m["beyond_tolerance"]:
            continue
        key, ref_key = (m["size"], m["variant"], m["gpus"]), (m["size"], m["variant"], m["reference_gpus"])
        own, theirs = launch[key], launch.get(ref_key)
        regime = ("the row's cache emptied after sharding, its slack's not" if theirs and emptied_cache(own)
                  and not emptied_cache(theirs) else "both in the same way")
        replay = f"; replayed {_percent(replay_error[key])}" if key in replay_error else ""
        said.append(f"{m['variant']} at {n[m['size']]}, N = {m['gpus']} {_percent(m['relative_difference'])} "
                    f"(slack from N = {m['reference_gpus']}, {made_at(theirs) if theirs else '?'}: {regime}{replay})")
    return "; ".join(said) or "none"


HISTORY = "h100-alloc-history-209515f"   # the GPU allocator's own history (run.alloc_history)
HISTORY_ORDER = ("ddp", "zero1", "fsdp")  # its 11.7M cases, in the order their one process ran them
# the histories of later launches: each (reference, case), each case its process's first
LATER_HISTORIES = (("h100-rehearsal-ab61c43", "1b-fsdp-g1"), ("h100-rehearsal-ab61c43", "235m-fsdp-g2"),
                   ("h200-rehearsal-72e1378", "1b-zero1-g4"))


def history_dumps(ref: Path) -> dict[str, dict[str, Any]]:
    return {v: gpu_alloc_history.load(ref / HISTORY / "hist" / f"12m-{v}-g1.json.gz") for v in HISTORY_ORDER}


@dataclass(frozen=True)
class History:
    """One case's allocator history and where it was made."""
    reference: str
    size: str
    variant: str
    gpus: int
    dump: dict[str, Any]

    def name(self, ref: Path) -> str:
        return f"{self.variant} at {names(ref)[self.size]}, N = {self.gpus}"


@cache   # two queries read them: each history loaded once a render
def every_history(ref: Path) -> list[History]:
    """Every history in the references: the 11.7M launch's three cases, then LATER_HISTORIES."""
    said = [History(HISTORY, "256x4", v, 1, d) for v, d in history_dumps(ref).items()]
    for reference, case in LATER_HISTORIES:
        prefix, variant, gpus = case.split("-")
        size = next(str(r["size"]) for r in combined(ref).records if rehearsal.size_prefix(r) == prefix and r.get("size"))
        said.append(History(reference, size, variant, int(gpus[1:]),
                            gpu_alloc_history.load(ref / reference / "hist" / f"{case}.json.gz")))
    return said


@query("rehearsal_replay_gpu_history")
def rehearsal_replay_gpu_history(ref: Path) -> str:
    """The GPU's own requests replayed: per case, the GPU's reserved bytes and the replay's, and
    whether the replay ends with the GPU's segments on every stream."""
    said = []
    for h in every_history(ref):
        end = gpu_alloc_history.replayed(h.dump).end
        same = "the same segments" if gpu_alloc_history.segments_match(h.dump, end) else "other segments"
        gpu = sum(gpu_alloc_history.gpu_reserved_by_stream_mib(h.dump).values())
        said.append(f"{h.name(ref)} ({card_of(h.reference)}): {gpu:,.0f} MiB on the GPU, "
                    f"{end.reserved / MIB:,.0f} replayed ({same})")
    return "; ".join(said)


def _other_launches(ref: Path, h: History) -> list[tuple[str, float]]:
    """(commit, rank 0's reserved MiB) of the case's records from other launches on the same card."""
    out = []
    for launch, recs in combined(ref).launches.items():
        if launch.split("/")[0] == h.reference or card_of(launch) != card_of(h.reference):
            continue
        for r in recs:
            if (str(r.get("size")), rehearsal.variant_label(r), int(r.get("gpus") or 0)) == (h.size, h.variant, h.gpus) \
                    and r.get("status") == "ok" and r.get("memory_components"):
                out.append((commit_of(launch), float(r["memory_components"][0]["reserved_peak_mib"])))
    return out


@query("rehearsal_replay_without_addresses")
def rehearsal_replay_without_addresses(ref: Path) -> str:
    """The same histories replayed with the replay's own addresses for new segments, as a
    trace's are (it cannot know the driver's): where that changes a stream's bytes, MiB, with the
    trace's replay of the same record and the case's records from other launches on that card."""
    said, same = [], 0
    histories = every_history(ref)
    traced = {(x.size, x.variant, x.gpus, x.launch.split("/")[0]): x for x in rows(ref)}
    for h in histories:
        end = gpu_alloc_history.replayed(h.dump, driver_addresses=False).end
        same += gpu_alloc_history.segments_match(h.dump, end)
        ours = end.reserved_by_stream_mib()
        gpu = gpu_alloc_history.gpu_reserved_by_stream_mib(h.dump)
        trace = traced.get((h.size, h.variant, h.gpus, h.reference))
        others = "".join(f"; the same case at {c} on the {card_of(h.reference)}: {v:,.0f} in all"
                         for c, v in _other_launches(ref, h))
        for k in sorted(gpu):
            if round(gpu[k]) != round(ours.get(k, 0.0)):
                where = "the default stream" if k == gpu_alloc_history.DEFAULT_STREAM else f"stream {k}"
                beside = f", the trace's replay {trace.replayed.reserved_by_stream_mib().get(k, 0.0):,.0f}" if trace else ""
                said.append(f"{h.name(ref)}, {where}: {gpu[k]:,.0f} on the GPU, {ours.get(k, 0.0):,.0f} replayed"
                            f"{beside}{others}")
    return f"{'; '.join(said) or 'no stream changes'}. {same} of the {len(histories)} cases end with the GPU's segments"


@query("rehearsal_replay_workspaces")
def rehearsal_replay_workspaces(ref: Path) -> str:
    """What the process's first case allocated in its warm step and kept (the optimizer's state
    aside), and what the later cases kept."""
    dumps = history_dumps(ref)
    def what(kept: list[tuple[int, str]]) -> str:
        return ", ".join(f"{b / MIB:g} MiB " + (f"from `{w.split(' < ')[0]}`" if w else "from no Python frame")
                         for b, w in kept) or "nothing"
    first, *later = HISTORY_ORDER
    return (f"{first}, the process's first case: {what(gpu_alloc_history.kept_from_warm_step(dumps[first]))}; "
            + "; ".join(f"{v}: {what(gpu_alloc_history.kept_from_warm_step(dumps[v]))}" for v in later))


@query("rehearsal_replay_preludes")
def rehearsal_replay_preludes(ref: Path) -> str:
    """How the records were replayed: as their process's first case, after it, with a stand-in."""
    xs = rows(ref)
    after = [x for x in xs if x.after]
    stand = [x for x in after if x.stand_in]
    return (f"{len(xs) - len(after)} of the {len(xs)} records were their process's first case; {len(after)} "
            f"are replayed after it, {len(stand)} of those with a stand-in (the first case was ddp or zero1, "
            f"which are not traced: fsdp's trace at its size stands in)")


@query("rehearsal_replay_12m_then_now")
def rehearsal_replay_12m_then_now(ref: Path) -> str:
    """11.7M's records, measured less replayed, under the first rules and now (MiB)."""
    def span(xs: list[Row]) -> str:
        d = sorted(x.measured - x.replayed.reserved / MIB for x in xs)
        if round(d[0]) == round(d[-1]):
            return f"{d[0]:+,.0f} MiB in each of {len(d)} records"
        return f"{d[0]:+,.0f} to {d[-1]:+,.0f} MiB over {len(d)} records"
    small = rows(ref)[0].size   # the rows come by model size, smallest first
    then = [x for x in rows(ref, which=BLIND_TRACES, preludes=False) if x.size == small]
    now = [x for x in rows(ref) if x.size == small]
    return f"{span(then)} under the first rules, {span(now)} now"
