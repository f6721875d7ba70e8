"""docs/advise.md's named queries (registered with dpbench.report.docs_queries' `query`): the
error table of advise.error over the rehearsal and sharding references (with NCCL's memory where
a measurement of it is committed), DeepSpeed's and
accelerate's estimates read from advise/estimates.json (so the page renders the same where they
are not installed), and the advice and --check runs of the H200 reference. Torch-free."""
from __future__ import annotations

import json
from functools import cache
from itertools import groupby
from pathlib import Path

from dpbench.advise import error, nccl_memory
from dpbench.report.docs_queries import query
from dpbench.report.markdown import md_table


@cache   # every query of the page reads the same measurements and cells: computed once a render
def _measured(ref: Path) -> dict[str, nccl_memory.GroupMemory]:
    return nccl_memory.reference_group_memory(ref)


@cache
def _rows(ref: Path) -> list[dict]:
    return error.cells([ref / name for name in error.REFERENCES], error.cached_estimates(), _measured(ref))


@query("advise_process_group")
def advise_process_group(ref: Path) -> str:
    """Whether NCCL's measured memory entered the NVML cells: its value and sources, or why not."""
    def link(source: str) -> str:
        inside = source.removeprefix("results/reference/")
        return f"[{inside}](../{source})" if inside != source else f"`{source}`"
    return nccl_memory.group_note(_rows(ref), _measured(ref), link)


@query("advise_nvml_without_group")
def advise_nvml_without_group(ref: Path) -> str:
    """The NVML share within its target with NCCL's memory left out (as before it was measured)."""
    rows = error.cells([ref / name for name in error.REFERENCES], error.cached_estimates(), {})
    s = next(x for x in error.summary(rows) if x["quantity"] == "nvml")
    return f"{s['within_target']:.1%} of {s['cells']} cells"


@query("advise_error_summary")
def advise_error_summary(ref: Path) -> str:
    return error.summary_markdown(_rows(ref), error.cached_versions())


@query("advise_error_cells")
def advise_error_cells(ref: Path) -> str:
    return error.cells_markdown(_rows(ref))


@query("advise_error_references")
def advise_error_references(ref: Path) -> str:
    return ", ".join(f"[{name}](../results/reference/{name})" for name in error.REFERENCES)


@query("advise_estimator_versions")
def advise_estimator_versions(ref: Path) -> str:
    v = error.cached_versions()
    return f"DeepSpeed {v['deepspeed']}, accelerate {v['accelerate']}"


@query("advise_error_verdict")
def advise_error_verdict(ref: Path) -> str:
    """Each quantity's share within its target, and whether that meets the issue's 90%."""
    parts = []
    for s in error.summary(_rows(ref)):
        share = s["within_target"]
        met = "met" if share is not None and share >= error.SHARE else "missed"
        parts.append(f"{s['quantity'].replace('_', ' ')} {share:.0%} of {s['cells']} cells ({met})")
    return "; ".join(parts)


@query("advise_nvml_misses")
def advise_nvml_misses(ref: Path) -> str:
    """The NVML cells beyond their target (the probe's own left out): which, and by how much."""
    misses = [r for r in _rows(ref) if r["quantity"] == "nvml" and not r.get("probe")
              and r.get("error") is not None and abs(r["error"]) > error.TARGETS["nvml"]]
    if not misses:
        return "none"
    where = sorted({f"{r['model']} {r['setup']} on {r['gpus']} ({r['source']})" for r in misses})
    low, high = min(r["error"] for r in misses), max(r["error"] for r in misses)
    nccl = sum(bool(r.get("nccl_group")) for r in misses)
    return f"{len(misses)}: {', '.join(where)}, {low:+.1%} to {high:+.1%}; {nccl} of them ran with an NCCL group"


# dpbench advise and --check on one H200 (each README: the calls): with the headroom, and before it
# (the advised batch at the card's edge)
ON_H200 = "h200-advise-1a5f006"
AT_EDGE = "h200-advise-032c2c6"


@cache   # read once a render: several queries quote each
def _h200_advice(ref: Path, name: str = ON_H200) -> list[tuple[str, dict]]:
    """(call folder/file stem, the advice's JSON) of every advise run in an H200 reference."""
    return [(f"{p.parent.name}/{p.stem}", json.loads(p.read_text()))
            for p in sorted((ref / name).glob("*/advise-*.json"))]


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1%}"


def _advice_table(ref: Path, name: str) -> str:
    """Each advice of the reference: the workload, GPUs and card, the recommended setup, its batch."""
    rows = []
    for call, d in _h200_advice(ref, name):
        top = next((r for r in d["rows"] if r["setup"] == d["chosen"]), {})
        rows.append([call, d["probe"]["parameters"], d["gpus"], f"{d['gpu_memory_gib']:g}", d["probe"]["precision"],
                     d["chosen"] or "none", top.get("batch"), top.get("largest_batch"),
                     None if top.get("nvml_gib") is None else round(top["nvml_gib"], 1)])
    return md_table(["advice", "parameters", "GPUs", "card GiB", "precision", "recommended", "batch",
                     "largest batch", "NVML GiB (predicted)"], rows, right=(1, 2, 6, 7, 8))


def _checks_table(ref: Path, name: str) -> str:
    """Every setup --check ran: out of memory, or its measured against predicted, per quantity."""
    rows = []
    for call, d in _h200_advice(ref, name):
        for (setup, batch, how), got in groupby(d.get("check") or [], key=lambda c: (c["setup"], c["batch"], c["how"])):
            got = list(got)
            by = {c["what"]: c for c in got}
            failed = by.get("run")
            outcome = "out of memory" if failed and "out of memory" in (failed.get("reason") or "") else \
                (f"failed: {failed.get('reason', '')[:60]}" if failed else "ran")
            rows.append([call, setup, batch, how, outcome,
                         *[_pct(by[w]["error"]) if w in by else "–"
                           for w in ("allocated", "reserved", "nvml", "samples_per_s")]])
    return md_table(["advice", "setup", "batch", "how", "outcome", "allocated", "reserved", "NVML", "samples/s"],
                    rows, right=(2,))


def _out_of_memory(ref: Path, name: str) -> str:
    """Of the setups --check ran on the GPU itself (not rehearsed) at their advised batch (each
    setup's first row; a retry one step below comes after it), how many ran out of memory."""
    advised: dict[tuple, bool] = {}
    for call, d in _h200_advice(ref, name):
        for c in d.get("check") or []:
            if c["how"] == "ranks":
                advised.setdefault((call, c["setup"]), c["what"] == "run")
    return f"{sum(advised.values())} of the {len(advised)} setups"


def _errors(ref: Path, name: str, what: str) -> list[float]:
    return [c["error"] for _, d in _h200_advice(ref, name) for c in d.get("check") or []
            if c["what"] == what and c.get("error") is not None]


def _register_reference(prefix: str, name: str) -> None:
    """The queries every H200 advise reference answers, as {prefix}_advice, _checks,
    _out_of_memory and _ref (the folder's name)."""
    query(f"{prefix}_advice", name)(lambda ref: _advice_table(ref, name))
    query(f"{prefix}_checks", name)(lambda ref: _checks_table(ref, name))
    query(f"{prefix}_out_of_memory", name)(lambda ref: _out_of_memory(ref, name))
    query(f"{prefix}_ref", name)(lambda ref: name)


_register_reference("advise_h200", ON_H200)
_register_reference("advise_edge", AT_EDGE)


@query("advise_h200_ranking", ON_H200)
def advise_h200_ranking(ref: Path) -> str:
    """Per timed check: the advised setup's measured samples/s as a share of the fastest measured."""
    parts = []
    for call, d in _h200_advice(ref, ON_H200):
        rk = d.get("ranking")
        if rk:
            got = "did not run" if rk["advised_rate"] is None else f"{rk['share_of_best']:.1%} of {rk['best']}'s"
            parts.append(f"{call}: the advised {rk['advised']} at {got} "
                         f"({'within' if rk['within'] else 'not within'} {rk['tolerance']:.0%})")
    return "; ".join(parts) or "no check timed two setups"


@query("advise_h200_memory_errors", ON_H200)
def advise_h200_memory_errors(ref: Path) -> str:
    """The checks' range of errors per memory quantity (measured against predicted)."""
    parts = []
    for what in ("allocated", "reserved", "nvml"):
        errs = _errors(ref, ON_H200, what)
        if errs:
            within = sum(abs(e) <= error.TARGETS[what] for e in errs)
            parts.append(f"{what} {min(errs):+.1%} to {max(errs):+.1%} ({within} of {len(errs)} within "
                         f"±{error.TARGETS[what]:.0%})")
    return "; ".join(parts)


@query("advise_h200_speed_errors", ON_H200)
def advise_h200_speed_errors(ref: Path) -> str:
    errs = _errors(ref, ON_H200, "samples_per_s")
    return f"{min(errs):+.1%} to {max(errs):+.1%}" if errs else "none timed"


@query("advise_h200_resnet_probe_steps", ON_H200)
def advise_h200_resnet_probe_steps(ref: Path) -> str:
    """ResNet18's probe: its step time at each of its two batches (why its speed is mispredicted)."""
    d = next(d for call, d in _h200_advice(ref, ON_H200) if call.endswith("resnet18-g1"))
    (b1, b2), (t1, t2) = d["probe"]["batches"], d["probe"]["step_s"]
    return f"{1e3 * t1:.1f} ms at batch {b1} and {1e3 * t2:.1f} ms at {b2}"
