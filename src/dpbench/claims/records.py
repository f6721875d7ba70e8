"""Typed records of the claims ledger: probe observations with stable ids, probe records, and
ledger sections.

A probe names each observation by an id ("c6.cpu.bn_eval.batch128_split3") that stays fixed
when its description (`what`) is reworded; the ledger looks observations up by id only. On
disk a probe record keeps its observations as a mapping id -> {what, values...}, with their
order in `observation_order`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# A DataParallel step's stages in the order it runs them: dp_step.py times each, the ledger's
# text and figure show them. "backward" is the replicas' own backward, "backward_reduce" the sum
# of their gradients onto device 0 that ends it.
STAGES = ("scatter", "replicate", "replica_threads", "gather", "loss", "backward", "backward_reduce", "optimizer")
# One GPU's step taken apart the same way: what one GPU pays for the work of each DataParallel stage.
SINGLE_STAGES = ("forward", "loss", "backward", "optimizer")


def dp_step_id(flag: str, batch: int, part: str) -> str:
    """Id of a C7 probe observation of the DataParallel step breakdown at one cudnn.benchmark
    setting and global batch; part: "steps" or "stages.<single|dp|dp_persistent_threads>"."""
    return f"c7.dp_step.bench_{flag}.b{batch}.{part}"


@dataclass
class Observation:
    id: str
    what: str
    values: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, **self.values}


def obs(oid: str, what: str, **values: Any) -> Observation:
    return Observation(oid, what, values)


@dataclass
class ProbeRecord:
    claim: str
    title: str
    ran_on: dict[str, Any]
    observations: list[Observation]
    verdict: str
    advice: str
    not_run: str | None = None
    parts_not_run: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        ids = [o.id for o in self.observations]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"probe {self.claim}: observation ids must be unique, repeated: {dup}")

    def find(self, oid: str) -> Observation | None:
        return next((o for o in self.observations if o.id == oid), None)

    def values(self, oid: str) -> dict[str, Any]:
        """The observation's values, or {} where the probe did not record it."""
        o = self.find(oid)
        return dict(o.values) if o else {}

    def with_prefix(self, prefix: str) -> list[Observation]:
        return [o for o in self.observations if o.id.startswith(prefix)]

    def to_json(self) -> dict[str, Any]:
        return {"claim": self.claim, "title": self.title, "ran_on": self.ran_on,
                "observations": {o.id: o.to_json() for o in self.observations},
                "observation_order": [o.id for o in self.observations],
                "verdict": self.verdict, "advice": self.advice, "not_run": self.not_run,
                "parts_not_run": list(self.parts_not_run)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ProbeRecord":
        raw = data.get("observations") or {}
        if isinstance(raw, list):
            # Records written before observations had ids: kept as evidence lines, but no
            # verdict text can find them (ids are never guessed from descriptions).
            items = [(f"unnamed.{i}", o) for i, o in enumerate(raw)]
        else:
            order = data.get("observation_order") or list(raw)
            items = [(oid, raw[oid]) for oid in order if oid in raw]
            items += [(oid, o) for oid, o in raw.items() if oid not in order]
        observations = [Observation(oid, str(o.get("what", oid)), {k: v for k, v in o.items() if k != "what"})
                        for oid, o in items]
        return cls(claim=data["claim"], title=data.get("title", data["claim"]), ran_on=data.get("ran_on") or {},
                   observations=observations, verdict=data["verdict"], advice=data.get("advice", ""),
                   not_run=data.get("not_run"), parts_not_run=list(data.get("parts_not_run") or []))


@dataclass
class Section:
    """One claim's part of the ledger, as claims.json stores it."""
    id: str
    title: str
    claim: str
    verdict: str
    summary: str
    advice: str
    evidence: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    measured_on: list[str] = field(default_factory=list)
    not_run: str | None = None
    figures: list[str] = field(default_factory=list)
    runs_used: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Finding:
    """What a claim's builder found, before the ledger adds the claim's fixed texts."""
    verdict: str
    summary: str = ""
    evidence: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    measured_on: list[str] = field(default_factory=list)
    not_run: str | None = None
    runs_used: bool = False
    advice: str | None = None          # None: the claim's standing advice (dpbench.claims.ADVICE)
