"""What each variant should send per training step, by collective, beside what rank 0 counted.

Payload: the bytes of the op's tensor on one rank, as the record counts them (the input of an
all-reduce or broadcast, the gathered output of an all-gather, the unreduced input of a
reduce-scatter). Wire: what one rank sends on a ring, (N-1)/N of the payload for an all-gather,
a reduce-scatter or a broadcast, twice that for an all-reduce. With P parameters, b bytes per
gradient as reduced (4: fp32, also under bf16 autocast and MixedPrecisionPolicy's fp32 reduction)
and c per parameter as gathered (2 under bf16 fsdp/hsdp, else b):

    ddp                 all_reduce P·b                     wire 2(N-1)/N·P·b
    zero1               ddp's, plus broadcast P·b (each rank's updated partition to the others)
    fsdp, reshard       all_gather 2·P·c (forward and backward), reduce_scatter P·b: with c = b
                        about 1.5 times ddp's wire bytes
    fsdp, no reshard    all_gather P·c (forward only), reduce_scatter P·b
    hsdp                fsdp's within a shard group of S ranks, plus all_reduce P·b/S across the
                        N/S replicas (called on one replica too, N = S: its payload counted, wire 0)

dpbench passes reshard_after_forward to every fully_shard call, the root's too, so FSDP2 gathers
the root again for the backward: the counted all-gathers are the whole 2·P·c (docs/sharding.md). With gradient accumulation over k micro-batches (one
optimizer step, the sync deferred to the last: run.knobs) fsdp/hsdp gather k times, hsdp over
several replicas also reduce-scatters k times (its all-reduce across replicas is what waits),
and every other reduction happens once. Numbers only (torch-free).
"""
from __future__ import annotations

from typing import Any, Mapping

from dpbench.analysis.memory_model import BF16_BYTES, TOLERANCE, is_number, setting_of

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _ring(collective: str, payload: float, ranks: int) -> float:
    share = (ranks - 1) / ranks if ranks > 0 else 0.0
    return (2 if collective == "all_reduce" else 1) * share * payload


def predicted_traffic(variant: str, parameters: int, ranks: int, reduce_bytes: float = 4.0,
                      gather_bytes: float | None = None, reshard_after_forward: bool = True,
                      shard_size: int | None = None, accumulate: int = 1) -> dict[str, dict[str, float]]:
    """Per optimizer step and rank: collective -> {"payload": bytes, "wire": bytes a ring sends}.
    Empty for a variant that does not communicate (single, dp*)."""
    gather = reduce_bytes if gather_bytes is None else gather_bytes
    P, out = parameters, {}

    def add(collective: str, payload: float, group: int) -> None:
        row = out.setdefault(collective, {"payload": 0.0, "wire": 0.0})
        row["payload"] += payload
        row["wire"] += _ring(collective, payload, group)

    if variant in ("ddp", "zero1"):
        add("all_reduce", P * reduce_bytes, ranks)
    if variant == "zero1":
        add("broadcast", P * reduce_bytes, ranks)
    if variant in ("fsdp", "hsdp"):
        group = (shard_size or ranks) if variant == "hsdp" else ranks
        replicas = ranks // group if variant == "hsdp" else 1
        if group > 1:   # a one-rank shard group holds whole tensors: FSDP2 sends nothing within it
            add("all_gather", accumulate * P * gather * (2 if reshard_after_forward else 1), group)
            add("reduce_scatter", (accumulate if replicas > 1 else 1) * P * reduce_bytes, group)
        if variant == "hsdp":   # FSDP2 all-reduces across the replicas even where there is one:
            # the record counts that call's payload; a ring of one rank sends nothing (wire 0)
            add("all_reduce", P * reduce_bytes / group, max(1, ranks // group))
    return out


def predicted_for(record: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """predicted_traffic for a record (its variant, gpus, config and sizes); {} without sizes."""
    s = setting_of(record)
    if s is None:
        return {}
    # Gradients reduce in fp32 (the parameters' dtype as stored); only fsdp/hsdp gather in bf16.
    gather = BF16_BYTES if s.compute_bytes == BF16_BYTES else s.param_bytes
    return predicted_traffic(s.variant, s.parameters, s.ranks, reduce_bytes=s.param_bytes,
                             gather_bytes=gather, reshard_after_forward=s.reshard_after_forward,
                             shard_size=s.shard_size if s.variant == "hsdp" else None,
                             accumulate=int((record.get("config") or {}).get("accumulate") or 1))


def collective_rows(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per collective the record counted or the model predicts: count, bytes (rank 0's
    payload), predicted_bytes and predicted_wire_bytes. [] for a record without `collectives`
    (older records, runs that never stepped)."""
    measured = record.get("collectives")
    if not isinstance(measured, list):
        return []
    predicted = predicted_for(record)
    rows: dict[str, dict[str, Any]] = {}
    for m in measured:
        # source: "counted" (the dispatch counter saw each op), "buckets" (DDP's reducer ran its
        # all-reduces where the counter cannot see: its buckets' sizes stand in), "" in older records
        row = rows.setdefault(str(m["collective"]), {"count": 0, "bytes": 0, "source": str(m.get("source") or "")})
        row["count"] += int(m.get("count") or 0)
        row["bytes"] += int(m.get("bytes") or 0)
    if measured or record.get("status") == "ok":   # an ok run that counted nothing: all predicted
        counted = "counted" if any(m.get("source") == "counted" for m in measured) else ""
        for name in predicted:
            rows.setdefault(name, {"count": 0, "bytes": 0, "source": counted})
    order = sorted(rows, key=lambda c: (COLLECTIVES.index(c) if c in COLLECTIVES else len(COLLECTIVES), c))
    # DDP (and ZeRO-1's DDP) also broadcasts its buffers (BatchNorm's statistics) before each
    # forward; the closed form counts parameters only, so those broadcasts have no prediction.
    buffers = record.get("variant") in ("ddp", "zero1") and "broadcast" not in predicted
    return [{"collective": c, **rows[c],
             "predicted_bytes": (None if buffers and c == "broadcast" else predicted.get(c, {}).get("payload", 0.0))
             if predicted else None,
             "predicted_wire_bytes": (None if buffers and c == "broadcast" else predicted.get(c, {}).get("wire", 0.0))
             if predicted else None}
            for c in order]


def comparison(rows: list[Mapping[str, Any]], tolerance: float = TOLERANCE) -> list[dict[str, Any]]:
    """Counted against predicted bytes per run and collective (rows of collectives.csv): the
    relative difference (bytes / predicted - 1) and whether it lies beyond the tolerance; a
    collective the formulas do not send compares by equality with zero. Rows without a
    prediction (a record without sizes) are left out, and so are rows the counter did not count
    (source "buckets": DDP's bucket sizes, which would check the formula against itself)."""
    out = []
    for row in rows:
        measured, predicted = row.get("bytes"), row.get("predicted_bytes")
        if not is_number(measured) or not is_number(predicted) or row.get("source") == "buckets":
            continue
        rel = measured / predicted - 1.0 if predicted else (0.0 if measured == 0 else float("inf"))
        out.append({**{k: row.get(k) for k in ("run_id", "variant", "gpus", "options", "collective", "count", "source")},
                    "bytes": measured, "predicted_bytes": predicted, "relative_difference": rel,
                    "beyond_tolerance": abs(rel) > tolerance})
    return out
