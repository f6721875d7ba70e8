"""advise's error, published: over the measured cells of the references (rehearsed ranks and the
sharding bench), what advise.predict says beside what was measured, for the allocated peak, the
reserved peak, NVML's memory and the largest batch, with DeepSpeed's and accelerate's estimates
of the same cells beside (advise.others; "not installed" without them). Torch-free.

    python -m dpbench.advise.error [REFERENCE_DIR ...] [--json]

Each model's probe facts come from that reference's own one-rank run, as `dpbench advise`'s probe
would measure them: a rehearsal's one-rank ddp record (activations: the straight line through
its measured trials, as claims.c9.rehearsed fits them; the step's, allocator's and context's
shares from its profiled step), a sharding bench's `single` record (one batch: activations
through the origin). The cells of that probe run are marked `probe` and left out of the summary:
they measure the fit, not the prediction.

Neither probe record had a process group, so NCCL's own memory comes from a measurement made
apart (advise.process_group_probe, on the machine of the cells): read from an advise JSON (its
probe facts) or the probe's own JSON (`--process-group FILE ...`; by default every JSON under
results/reference/*advise*/), and added to the NVML prediction of the runs that brought up an
NCCL group on a GPU of that name. Without one, nothing is added and the text says so.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import tarfile
from pathlib import Path
from statistics import median
from typing import Any, Callable, Iterable, Mapping

from dpbench.advise import others
from dpbench.advise.nccl_memory import (MEASUREMENTS, GroupMemory, group_memory, group_note, reference_group_memory,
                                        with_group)
from dpbench.advise.predict import ProbeFacts, Setup, largest_batch, predict
from dpbench.analysis.memory_model import (CONTEXT_BYTES, MIB, Setting, is_number, measured_state, optimizer_slots,
                                           predicted_bytes)
from dpbench.claims.c9.rehearsed import line
from dpbench.report.markdown import md_table

ROOT = Path(__file__).resolve().parents[3]
REFERENCES = ("h200-rehearsal-525c3e7", "h200-rehearsal-n4-522758d", "h200-sharding-f611959", "h200-c1-probe-550c3a7")
C1_MODEL = "resnet18"   # C1's largest batches are of ResNet18 at 10 outputs: the sharding bench's resnet18
TARGETS = {"allocated": 0.10, "reserved": 0.10, "nvml": 0.15}   # issue 42: within, in >= 90% of cells
SHARE = 0.90
ESTIMATES = Path(__file__).with_name("estimates.json")   # the others' estimates of the cells, saved
QUANTITIES = ("allocated", "reserved", "nvml", "largest_batch")


# -- reading the references ---------------------------------------------------------------------------

def rehearsal_records(folder: Path) -> list[dict[str, Any]]:
    """The claims.c9.rehearsal records of a rehearsal reference: records.jsonl in its tarballs or
    beside them."""
    lines: list[str] = []
    for tar in sorted(folder.glob("*.tar.gz")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith(".jsonl") and (f := t.extractfile(m)) is not None:
                    lines += io.TextIOWrapper(f, encoding="utf-8").read().splitlines()
    for path in sorted(folder.glob("*.jsonl")):
        lines += path.read_text().splitlines()
    return [r for r in (json.loads(ln) for ln in lines if ln.strip()) if r.get("size") and r.get("status") == "ok"]


def sharding_records(folder: Path) -> list[dict[str, Any]]:
    """The run records of a sharding bench reference (records/<run>/metrics.json)."""
    out = []
    for path in sorted(glob.glob(str(folder / "records" / "*" / "metrics.json"))):
        r = json.loads(Path(path).read_text())
        if r.get("status") == "ok" and r.get("memory_components"):
            out.append({**r, "folder": Path(path).parent.name})
    return out


def model_name(folder_name: str) -> str:
    """The model part of a sharding bench's run folder: lm-125m-fsdp-bf16 -> lm-125m."""
    variants = {"single", "ddp", "zero1", "fsdp", "hsdp"}
    parts = folder_name.split("-")
    return "-".join(parts[:next((i for i, p in enumerate(parts) if p in variants), len(parts))])


def setup_of(record: Mapping[str, Any]) -> Setup:
    cfg = record.get("config") or {}
    return Setup(str(record["variant"]), bool(cfg.get("reshard_after_forward", True)), int(cfg.get("accumulate") or 1),
                 cfg.get("checkpoint") == "units", bool(cfg.get("offload", False)))


def _state_mib(record: Mapping[str, Any], variant: str) -> float:
    P = int(record["parameters"])
    s = Setting(variant, P, record["param_bytes"] / P, optimizer_slots(record.get("config") or {}))
    return float(predicted_bytes(s)["state"] or 0.0) / MIB


def _peak(row: Mapping[str, Any]) -> float:
    return max(row[f"{p}_peak_mib"] for p in ("forward", "backward", "step"))


def _base_facts(record: Mapping[str, Any], unit_mib: float | None, **kw: Any) -> ProbeFacts:
    P, cfg = int(record["parameters"]), record.get("config") or {}
    return ProbeFacts(workload=str(record.get("size") or record.get("run_id")), parameters=P,
                      param_bytes=record["param_bytes"] / P,
                      largest_unit_bytes=None if unit_mib is None else unit_mib * MIB,
                      precision=str(cfg.get("precision", "fp32")), optimizer_slots=optimizer_slots(cfg),
                      device="cuda", **kw)


def rehearsal_facts(probe: Mapping[str, Any], unit_mib: float | None) -> ProbeFacts | None:
    """A one-rank ddp record's probe facts (None without two measured trial batches)."""
    fit = line(probe.get("search_trials") or [])
    if fit is None:
        return None
    intercept, slope = fit
    row = probe["memory_components"][0]
    start = measured_state(row) or 0.0
    top = max((t for t in probe["search_trials"] if t.get("how") == "measured"), key=lambda t: t["batch"])
    nvml = row.get("nvml_process_mib")
    return _base_facts(probe, unit_mib, batches=(1, 2), activation_mib=(slope, 2 * slope),
                       fixed_mib=intercept - _state_mib(probe, "ddp"), step_extra_mib=row["step_peak_mib"] - start,
                       reserved_extra_mib=top["reserved_mib"] - top["peak_mib"],
                       context_mib=nvml - row["reserved_peak_mib"] if is_number(nvml) else CONTEXT_BYTES / MIB)


def sharding_facts(single: Mapping[str, Any], unit_mib: float | None) -> ProbeFacts:
    """A `single` record's probe facts: one batch, so its activations run through the origin."""
    row = single["memory_components"][0]
    cfg = single["config"]
    b = int(cfg.get("per_gpu_batch") or cfg["global_batch"])
    start = measured_state(row) or 0.0
    act = row["activation_peak_mib"]
    mem = (single.get("memory") or [{}])[0]
    return _base_facts(single, unit_mib, batches=(max(1, b // 2), b), activation_mib=(act * max(1, b // 2) / b, act),
                       fixed_mib=start - _state_mib(single, "single"), step_extra_mib=row["step_peak_mib"] - start,
                       reserved_extra_mib=row["reserved_peak_mib"] - _peak(row),
                       context_mib=(mem.get("nvml_used_mib") or 0) - (mem.get("reserved_mib") or 0)
                       if is_number(mem.get("nvml_used_mib")) else CONTEXT_BYTES / MIB)


# -- the cells ------------------------------------------------------------------------------------

def _cell(source: str, model: str, record: Mapping[str, Any], quantity: str, batch: int, measured: Any,
          predicted: Any, probe: bool, **extra: Any) -> dict[str, Any]:
    err = measured / predicted - 1.0 if is_number(measured) and is_number(predicted) and predicted else None
    if quantity == "largest_batch" and is_number(measured) and is_number(predicted):
        err = predicted - measured    # in batches; judged against the bisection step
    return {"source": source, "model": model, "setup": setup_of(record).name, "gpus": int(record["gpus"]),
            "precision": str((record.get("config") or {}).get("precision", "fp32")), "quantity": quantity,
            "batch": batch, "measured": measured, "predicted": predicted, "error": err, "probe": probe, **extra}


def estimate_key(record: Mapping[str, Any], unit_mib: float | None) -> str:
    """What the others' estimates depend on: variant, parameters, largest layer, GPUs, precision,
    the parameters' bytes."""
    P = int(record["parameters"])
    layer = None if unit_mib is None else int(unit_mib * MIB / (record["param_bytes"] / P))
    precision = str((record.get("config") or {}).get("precision", "fp32"))
    return f"{record['variant']}|{P}|{layer}|{int(record['gpus'])}|{precision}|{int(record['param_bytes'])}"


def live_estimates(key: str) -> dict[str, float | None]:
    """DeepSpeed's and accelerate's MiB per GPU for an estimate_key, from the installed packages."""
    variant, P, layer, gpus, precision, param_bytes = key.split("|")
    ds = others.deepspeed_bytes(variant, int(P), None if layer == "None" else int(layer), int(gpus))
    acc = others.accelerate_bytes(int(param_bytes), precision)
    return {"deepspeed_mib": None if ds is None else ds / MIB, "accelerate_mib": None if acc is None else acc / MIB}


def cached_estimates(path: Path = ESTIMATES) -> Callable[[str], dict[str, float | None]]:
    """The estimates saved by --save-estimates (so the docs render the same without the packages)."""
    saved = json.loads(path.read_text()) if path.exists() else {"estimates": {}}
    return lambda key: saved["estimates"].get(key, {"deepspeed_mib": None, "accelerate_mib": None})


def cached_versions(path: Path = ESTIMATES) -> dict[str, str]:
    saved = json.loads(path.read_text()) if path.exists() else {}
    return saved.get("versions") or {"deepspeed": others.NOT_INSTALLED, "accelerate": others.NOT_INSTALLED}


Estimates = Callable[[str], "dict[str, float | None]"]


def rehearsal_cells(folder: Path, estimates: Estimates = live_estimates, beside: Iterable[Path] = (),
                    measured: Mapping[str, GroupMemory] | None = None) -> list[dict[str, Any]]:
    """Every measured cell of a rehearsal reference, predicted from its one-rank ddp probe (or,
    for a reference of larger N only, the probe of a rehearsal folder `beside` it); NCCL's
    `measured` memory where a run had an NCCL group (a rehearsed one has gloo's)."""
    recs, source = rehearsal_records(folder), folder.name
    pool = recs + [r for f in beside if f != folder for r in rehearsal_records(f)]
    units = {r["size"]: r["memory_components"][0].get("largest_unit_mib") for r in pool
             if r["variant"] == "fsdp" and r.get("memory_components")}
    probes = {r["size"]: r for r in recs if r["variant"] == "ddp" and int(r["gpus"]) == 1 and r.get("search_trials")}
    for r in pool:   # this folder's own probe first
        if r["variant"] == "ddp" and int(r["gpus"]) == 1 and r.get("search_trials"):
            probes.setdefault(r["size"], r)
    out = []
    for r in recs:
        size, probe_rec = r["size"], probes.get(r["size"])
        facts = rehearsal_facts(probe_rec, units.get(size)) if probe_rec else None
        if facts is None or not r.get("memory_components"):
            continue
        setup, n, is_probe = setup_of(r), int(r["gpus"]), r is probe_rec
        facts, group = with_group(facts, r, measured or {})
        cfg = r.get("config") or {}
        b0 = int((r.get("options") or {}).get("per_gpu_batch") or cfg.get("per_gpu_batch")
                 or cfg.get("global_batch", n) // n)
        p = predict(facts, setup, n, b0)
        beside = {"estimate_key": estimate_key(r, units.get(size)), **estimates(estimate_key(r, units.get(size)))}
        out += [_cell(source, size, r, "allocated", b0, max(_peak(m) for m in r["memory_components"]),
                      p.allocated_mib, is_probe, **beside),
                _cell(source, size, r, "reserved", b0, max(m["reserved_peak_mib"] for m in r["memory_components"]),
                      p.reserved_mib, is_probe)]
        nvml = [m.get("nvml_process_mib") for m in r["memory_components"] if is_number(m.get("nvml_process_mib"))]
        if nvml:
            out.append(_cell(source, size, r, "nvml", b0, max(nvml), p.nvml_mib, is_probe, **group))
        for i, t in enumerate(t for t in r.get("search_trials") or [] if t.get("how") == "measured"):
            pt = predict(facts, setup, n, int(t["batch"]))
            out.append(_cell(source, size, r, "allocated", int(t["batch"]), t["peak_mib"], pt.allocated_mib, is_probe))
            if i:   # the first trial's reserved still holds the profiled step's cached blocks
                out.append(_cell(source, size, r, "reserved", int(t["batch"]), t["reserved_mib"], pt.reserved_mib,
                                 is_probe))
        for budget, found in sorted((r.get("search") or {}).items()):
            cap = found["cap_gib"] * 1024
            pred = largest_batch(facts, setup, n, cap, "allocated")
            step = max(1, (found.get("smallest_failing") or found["largest"] + 1) - found["largest"])
            out.append(_cell(source, size, r, "largest_batch", 0, found["largest"], pred, is_probe,
                             budget=budget, bisection_step=step))
    return out


def sharding_cells(folder: Path, estimates: Estimates = live_estimates,
                   measured: Mapping[str, GroupMemory] | None = None) -> list[dict[str, Any]]:
    """Every run of a sharding bench reference at one rank, predicted from the same model's
    `single` run (a cell in another precision than that probe is left out: its activations
    differ); NCCL's `measured` memory where a run had an NCCL group."""
    recs, source = sharding_records(folder), folder.name

    def model(r: Mapping[str, Any]) -> str:
        return json.dumps(r["config"].get("workload"), sort_keys=True)
    probes = {model(r): r for r in recs if r["variant"] == "single"}
    units = {model(r): r["memory_components"][0].get("largest_unit_mib") for r in recs if r["variant"] == "fsdp"}
    out = []
    for r in recs:
        probe_rec = probes.get(model(r))
        if probe_rec is None or r["config"].get("precision") != probe_rec["config"].get("precision"):
            continue
        facts, group = with_group(sharding_facts(probe_rec, units.get(model(r))), r, measured or {})
        name = model_name(r["folder"])
        setup = setup_of(r) if r["variant"] != "single" else Setup("ddp")
        b = int(r["config"].get("per_gpu_batch") or r["config"]["global_batch"])
        p = predict(facts, setup, int(r["gpus"]), b)
        if r["variant"] == "single":   # the probe itself: single holds ddp's state less its buckets
            continue
        row, mem = r["memory_components"][0], (r.get("memory") or [{}])[0]
        out += [_cell(source, name, r, "allocated", b, _peak(row), p.allocated_mib, False,
                      estimate_key=estimate_key(r, units.get(model(r))),
                      **estimates(estimate_key(r, units.get(model(r))))),
                _cell(source, name, r, "reserved", b, row["reserved_peak_mib"], p.reserved_mib, False)]
        if is_number(mem.get("nvml_used_mib")):
            out.append(_cell(source, name, r, "nvml", b, mem["nvml_used_mib"], p.nvml_mib, False, **group))
    return out


def c1_cells(folder: Path, facts: ProbeFacts) -> list[dict[str, Any]]:
    """C1's largest batches of ResNet18 at 10 outputs within its cap (single; ddp as one rank of a
    one-process group), predicted from the sharding bench's ResNet18 `single` probe."""
    doc = json.loads((folder / "C1.json").read_text())
    out = []
    for variant, per_rank in (("single", 1), ("ddp", 2)):   # ddp's global batch is 2 x the rank's
        o = (doc.get("observations") or {}).get(f"c1.max_batch.{variant}.out10")
        if not o:
            continue
        largest, failing = o["global_batch"] // per_rank, (o.get("smallest_failing") or 0) // per_rank
        record = {"variant": variant, "gpus": 1, "config": {"precision": "fp32"}}
        pred = largest_batch(facts, Setup(variant), 1, o["cap_gib"] * 1024, "allocated")
        out.append(_cell(folder.name, C1_MODEL, record, "largest_batch", 0, largest, pred, False,
                         budget=f"{o['cap_gib']:g} GiB", bisection_step=max(1, failing - largest)))
    return out


def cells(folders: Iterable[Path], estimates: Estimates = live_estimates,
          measured: Mapping[str, GroupMemory] | None = None) -> list[dict[str, Any]]:
    """The cells of every reference folder given (a rehearsal's, a sharding bench's, C1's probe:
    the last with a sharding bench's ResNet18 among the folders), with NCCL's `measured` memory
    (GPU name -> GroupMemory) added where a run had an NCCL group on such a GPU."""
    out: list[dict[str, Any]] = []
    c1 = []
    folders = list(folders)
    rehearsals = [f for f in folders if not (f / "C1.json").is_file() and not (f / "records").is_dir()]
    for folder in folders:
        if (folder / "C1.json").is_file():
            c1.append(folder)
        elif (folder / "records").is_dir():
            out += sharding_cells(folder, estimates, measured)
        else:
            out += rehearsal_cells(folder, estimates, rehearsals, measured)
    resnet = [r for f in folders if (f / "records").is_dir() for r in sharding_records(f)
              if r["variant"] == "single" and model_name(r["folder"]) == C1_MODEL]
    units = [r["memory_components"][0].get("largest_unit_mib") for f in folders if (f / "records").is_dir()
             for r in sharding_records(f) if r["variant"] == "fsdp" and model_name(r["folder"]) == C1_MODEL]
    for folder in c1 if resnet else []:
        out += c1_cells(folder, sharding_facts(resnet[0], units[0] if units else None))
    return out


def save_estimates(rows: list[dict[str, Any]], path: Path = ESTIMATES) -> None:
    """The others' estimates of these cells, with the packages' versions, for the docs."""
    keys = sorted({c["estimate_key"] for c in rows if c.get("estimate_key")})
    doc = {"versions": {p: others.version(p) for p in ("deepspeed", "accelerate")},
           "estimates": {k: live_estimates(k) for k in keys}}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


# -- the summary ----------------------------------------------------------------------------------

def within(cell: Mapping[str, Any], error: float | None = None) -> bool | None:
    """Whether a cell's prediction meets issue 42's target (None without one)."""
    err = cell["error"] if error is None else error
    if err is None:
        return None
    if cell["quantity"] == "largest_batch":
        return abs(err) <= cell["bisection_step"]
    return abs(err) <= TARGETS[cell["quantity"]]


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per quantity over the cells that are not the probe's: how many, the share within the
    target, the median and 90th percentile of |error|; DeepSpeed's and accelerate's share within
    the allocated target on the cells they estimate."""
    out = []
    for q in QUANTITIES:
        cs = [c for c in rows if c["quantity"] == q and not c["probe"] and c["error"] is not None]
        errs = sorted(abs(c["error"]) for c in cs)
        row: dict[str, Any] = {"quantity": q, "cells": len(cs),
                               "within_target": sum(bool(within(c)) for c in cs) / len(cs) if cs else None,
                               "median_abs_error": median(errs) if errs else None,
                               "p90_abs_error": errs[min(len(errs) - 1, int(0.9 * len(errs)))] if errs else None}
        for other in ("deepspeed", "accelerate"):
            est = [(c, c["measured"] / c[f"{other}_mib"] - 1) for c in cs if is_number(c.get(f"{other}_mib"))]
            row[f"{other}_within_target"] = (sum(bool(within(c, e)) for c, e in est) / len(est)) if est else None
            row[f"{other}_median_abs_error"] = median(abs(e) for _, e in est) if est else None
        out.append(row)
    return out


def _pct(v: Any, signed: bool = False) -> str:
    if not is_number(v):
        return "—"
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def summary_markdown(rows: list[dict[str, Any]], versions: dict[str, str] | None = None) -> str:
    versions = versions or {p: others.version(p) for p in ("deepspeed", "accelerate")}
    ds, acc = versions["deepspeed"], versions["accelerate"]
    heads = ["quantity", "cells", "target", "within target", "median |error|", "p90 |error|",
             f"DeepSpeed ({ds}) within", f"accelerate ({acc}) within"]
    target = {"allocated": "±10%", "reserved": "±10%", "nvml": "±15%", "largest_batch": "one bisection step"}
    body = []
    for s in summary(rows):
        fmt = (lambda v: "—" if v is None else f"{v:.1f}") if s["quantity"] == "largest_batch" else _pct
        body.append([s["quantity"], s["cells"], target[s["quantity"]], _pct(s["within_target"]),
                     fmt(s["median_abs_error"]), fmt(s["p90_abs_error"]),
                     _pct(s["deepspeed_within_target"]) if ds != others.NOT_INSTALLED else others.NOT_INSTALLED,
                     _pct(s["accelerate_within_target"]) if acc != others.NOT_INSTALLED else others.NOT_INSTALLED])
    return md_table(heads, body, right=(1, 3, 4, 5))


def cells_markdown(rows: list[dict[str, Any]]) -> str:
    """The profiled-step cells (one per run) and the largest batches, beside the others' estimates."""
    heads = ["source", "model", "setup", "gpus", "quantity", "batch", "measured", "advise", "error",
             "DeepSpeed", "accelerate"]
    body = []
    for c in rows:
        first = c["quantity"] == "largest_batch" or "deepspeed_mib" in c or c["quantity"] == "nvml"
        if not first:
            continue
        q = c["quantity"] if c["quantity"] != "largest_batch" else f"largest batch ({c['budget']})"
        num = (lambda v: "—" if not is_number(v) else f"{v:.0f}")
        err = (f"{c['error']:+.0f} (step {c['bisection_step']})" if c["quantity"] == "largest_batch"
               else _pct(c["error"], True)) if c["error"] is not None else "—"
        body.append([c["source"], c["model"], c["setup"] + (" (probe)" if c["probe"] else ""), c["gpus"], q,
                     c["batch"] or "", num(c["measured"]), num(c["predicted"]), err,
                     num(c.get("deepspeed_mib")), num(c.get("accelerate_mib"))])
    return md_table(heads, body, right=(3, 5, 6, 7, 9, 10))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="*", type=Path,
                    help="reference folders (default: " + ", ".join(REFERENCES) + " under results/reference)")
    ap.add_argument("--json", action="store_true", help="print the cells and the summary as JSON")
    ap.add_argument("--process-group", nargs="+", type=Path, metavar="FILE",
                    help="NCCL's memory measured apart: advise JSONs or advise.process_group_probe's JSON "
                         f"(default: every JSON under results/reference/{MEASUREMENTS.split('/')[0]}/)")
    ap.add_argument("--save-estimates", action="store_true",
                    help=f"save DeepSpeed's and accelerate's estimates of the cells to {ESTIMATES.name} (the docs read it)")
    args = ap.parse_args(argv)
    folders = args.folders or [ROOT / "results" / "reference" / name for name in REFERENCES]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        print(f"dpbench.advise.error: error: no folder {', '.join(missing)}")
        return 2
    measured = group_memory(args.process_group) if args.process_group else reference_group_memory()
    rows = cells(folders, measured=measured)
    if args.save_estimates:
        save_estimates(rows)
    if args.json:
        print(json.dumps({"summary": summary(rows), "cells": rows, "process_group": list(measured.values())},
                         default=lambda o: o.__dict__ if isinstance(o, GroupMemory) else str(o)))
        return 0
    print(summary_markdown(rows))
    print()
    print(cells_markdown(rows))
    print()
    print(group_note(rows, measured))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
