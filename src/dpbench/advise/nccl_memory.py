"""NCCL's own memory at one rank, measured apart (advise.process_group_probe) and applied to
the published error's NVML cells: read from advise JSONs (their probe facts) or the probe's own
JSON, and added to the prediction of runs whose ranks brought up an NCCL group on a GPU of the
measured name; the sentence that says whether it was. Torch-free."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any, Callable, Iterable, Mapping

from dpbench.advise.predict import ProbeFacts
from dpbench.analysis.memory_model import is_number
from dpbench.host.source import PROJECT

MEASUREMENTS = "*advise*/**/*.json"   # under results/reference: where NCCL's measured memory is looked for


@dataclass(frozen=True)
class GroupMemory:
    """NCCL's own memory at one rank on one GPU model (advise.process_group_probe): the median of
    the measurements read (each one's value), their NCCL versions and the files they came from."""
    mib: float
    device_name: str
    nccl: tuple[str, ...]
    sources: tuple[str, ...]
    values: tuple[float, ...] = ()


def _measured(doc: Any) -> dict[str, Any] | None:
    """The measurement in an advise JSON (its probe facts) or in the probe's own JSON; None where
    the file holds none (a CPU probe, a failure, another kind of file)."""
    if not isinstance(doc, dict):
        return None
    facts = doc.get("probe") if isinstance(doc.get("probe"), dict) else None
    got = (facts or {}).get("process_group") if facts is not None else doc
    if not isinstance(got, dict) or got.get("reason") or not is_number(got.get("process_group_mib")):
        return None
    name = got.get("device_name") or (facts or {}).get("device_name")
    return {**got, "device_name": name} if name and name != "cpu" else None


def group_memory(paths: Iterable[Path], root: Path = PROJECT) -> dict[str, GroupMemory]:
    """GPU name -> NCCL's measured memory at one rank, over the files given that hold one."""
    found: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for path in sorted(paths):
        try:
            got = _measured(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            got = None
        if got is not None:
            where = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
            found.setdefault(got["device_name"], []).append((got, where))
    out = {}
    for name, ms in found.items():
        values = tuple(float(g["process_group_mib"]) for g, _ in ms)
        out[name] = GroupMemory(median(values), name, tuple(sorted({str(g["nccl"]) for g, _ in ms if g.get("nccl")})),
                                tuple(w for _, w in ms), values)
    return out


def reference_group_memory(ref: Path = PROJECT / "results" / "reference") -> dict[str, GroupMemory]:
    """The measurements committed under results/reference (MEASUREMENTS)."""
    return group_memory(ref.glob(MEASUREMENTS), ref.parent.parent)


def ran_nccl_group(record: Mapping[str, Any]) -> bool:
    """Whether the measured run's ranks brought up an NCCL group (run.context's rule): ranks under
    torchrun on CUDA, not rehearsed (rehearsed ranks share a GPU over gloo)."""
    return (record.get("device_type") == "cuda" and (record.get("launch") or {}).get("launcher") == "torchrun"
            and not (record.get("config") or {}).get("rehearse"))


def with_group(facts: ProbeFacts, record: Mapping[str, Any],
               measured: Mapping[str, GroupMemory]) -> tuple[ProbeFacts, dict[str, Any]]:
    """The facts for predicting `record`, with NCCL's memory where its run had an NCCL group on a
    GPU measured; and what the cell says of it."""
    gpu = ((record.get("provenance") or {}).get("gpu_names") or [None])[0]
    group = measured.get(gpu) if ran_nccl_group(record) and gpu else None
    return (replace(facts, process_group_mib=group.mib) if group else facts,
            {"nccl_group": ran_nccl_group(record), "gpu_name": gpu, "process_group_mib": group.mib if group else None})


def group_note(rows: list[dict[str, Any]], measured: Mapping[str, GroupMemory],
               cite: Callable[[str], str] = str) -> str:
    """Whether NCCL's measured memory entered the NVML cells, in a sentence: its value, GPU,
    NCCL version and sources (each through `cite`), or why not."""
    nccl = [c for c in rows if c["quantity"] == "nvml" and c.get("nccl_group")]
    applied = [c for c in nccl if c.get("process_group_mib") is not None]
    if not nccl:
        return "No NVML cell ran with an NCCL group: NCCL's memory enters none."
    if not applied:
        gpus = ", ".join(sorted({str(c.get("gpu_name")) for c in nccl}))
        return (f"NCCL's own memory is not applied: {len(nccl)} NVML cells ran with an NCCL group (on {gpus}), and "
                f"no measurement of it from that GPU was read (advise.process_group_probe measures it).")
    used = [m for m in measured.values() if any(c.get("gpu_name") == m.device_name for c in applied)]

    def one(m: GroupMemory) -> str:
        spread = f", {min(m.values):.0f}–{max(m.values):.0f}" if len(m.values) > 1 else ""
        folders = sorted({str(Path(src).parent) for src in m.sources})
        return (f"{m.mib:.0f} MiB on {m.device_name} (NCCL {', '.join(m.nccl) or 'unknown'}; the median of "
                f"{len(m.values)} measurement(s){spread}, in {', '.join(cite(f) for f in folders)})")
    what = "; ".join(one(m) for m in used)
    return (f"NCCL's own memory at one rank, measured apart, is added to the NVML prediction of the {len(applied)} "
            f"of {len(nccl)} NVML cells that ran with an NCCL group: {what}.")
