"""`--check`: the advice checks itself. The recommended setup and its runners-up each run as a
short dpbench run (`python -m dpbench.run.launch`, a fresh process: torchrun for N ranks) on the
GPUs at hand, or as N rehearsed ranks sharing one GPU where fewer are visible (memory only: the
speed of shared ranks is nobody's), and on the CPU as N gloo ranks. Per setup it reports the
predicted beside the measured: the allocated and reserved peaks and NVML's memory per GPU (CUDA;
NVML only where each rank has its GPU to itself), and the tensors each rank holds by component
(parameters, gradients, optimizer state: counted, so also on the CPU), and samples/s against
advise.rank's rule where each rank has its GPU. On CUDA each rank may allocate what the advised
card leaves PyTorch (the run option memory_cap_gib), so a run that runs out of memory says the
advice was wrong for that card; the check then runs one bisection step below the advised batch,
which says whether the largest batch was still predicted within that step.
"""
from __future__ import annotations

from typing import Any

import torch

from dpbench.advise.predict import ProbeFacts, Setup, beyond_reserved_mib, predict, setting
from dpbench.advise.rank import speed
from dpbench.advise.recommend import Advice
from dpbench.analysis.memory_model import MIB, is_number, predicted_bytes
from dpbench.claims.batch_search import REHEARSAL_RESOLUTION
from dpbench.report.markdown import md_table
from dpbench.run.launch import record_of_fresh_run

RUNNERS_UP = 2
TIMEOUT_S = 300
CPU_BATCH = 4          # the CPU measures counted tensors: a small batch says as much
DEVICE_SHARE = 0.9     # rehearsed ranks together use at most this share of their GPU
# The resolution of the measured largest-batch search the advice's error is judged by.
BISECTION_STEP = REHEARSAL_RESOLUTION
COMPONENTS = ("parameters", "gradients", "optimizer")
COLUMNS = ["setup", "gpus", "batch", "how", "what", "predicted", "measured", "error"]   # MiB; samples/s
RANKING_TOLERANCE = 0.05   # issue 42: the advised setup within 5% of the best measured


def visible_gpus() -> tuple[int, float]:
    """(CUDA devices visible, the first one's memory in MiB); (0, 0) without CUDA."""
    if not torch.cuda.is_available():
        return 0, 0.0
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory / MIB


def chosen_setups(advice: Advice, runners_up: int = RUNNERS_UP) -> list[dict[str, Any]]:
    """The recommended row and the next fitting ones."""
    return [r for r in advice.rows if r["fits"]][:1 + runners_up]


def check_batch(facts: ProbeFacts, setup: Setup, row: dict[str, Any], gpus: int, here: int, device_mib: float,
                gpus_per_node: int | None) -> int:
    """The per-GPU batch the check runs: the advice's, fewer where `here` rehearsed ranks must
    share one GPU; a small one on the CPU."""
    b = max(setup.accumulate, int(row["batch"] or 1))
    if not device_mib:
        return max(setup.accumulate, min(b, CPU_BATCH))
    while b > setup.accumulate and \
            here * predict(facts, setup, gpus, b, gpus_per_node, rehearsed=here > 1).nvml_mib > DEVICE_SHARE * device_mib:
        b = max(setup.accumulate, (b // 2) // setup.accumulate * setup.accumulate)
    return b


def cap_gib(facts: ProbeFacts, setup: Setup, gpu_memory_gib: float, here: int, device_mib: float) -> float | None:
    """What PyTorch may allocate per rank in the check (run option memory_cap_gib): the advised
    card less its CUDA context (and NCCL's memory where the ranks have an NCCL group), so a run on
    a larger GPU answers for the card asked about; less where `here` rehearsed ranks share one
    GPU. None on the CPU (nothing to cap)."""
    if not device_mib:
        return None
    outside = beyond_reserved_mib(facts, setup, rehearsed=here > 1)
    return (min(gpu_memory_gib * 1024, DEVICE_SHARE * device_mib / here) - outside) / 1024


def run_config(workload: Any, setup: Setup, gpus: int, batch: int, precision: str, steps: int,
               rehearse: bool, cuda: bool, gpus_per_node: int | None, cap: float | None = None) -> dict[str, Any]:
    cfg = {**setup.run_options(), "gpus": gpus, "workload": workload, "precision": precision,
           "per_gpu_batch": batch, "global_batch": batch * gpus, "dataset": "synthetic",
           "synthetic_size": batch * gpus * steps, "synthetic_test_size": gpus, "eval_samples": gpus,
           "eval_each_epoch": False, "epochs": 1, "max_steps": steps, "warmup_steps": min(2, steps - 1),
           "device": "cuda" if cuda else "cpu", "max_cpu_ranks": max(gpus, 4)}
    if rehearse:
        cfg["rehearse"] = True
    if cap is not None:
        cfg["memory_cap_gib"] = round(cap, 3)
    if setup.variant == "hsdp" and gpus_per_node:
        cfg["hsdp_shard_size"] = gpus_per_node
    return cfg


def launch(cfg: dict[str, Any]) -> dict[str, Any]:
    """A dpbench run in a fresh process; its record (a failed one where it left none)."""
    return record_of_fresh_run(cfg, TIMEOUT_S, prefix="advise-")


def _rel(measured: Any, predicted: Any) -> float | None:
    if not is_number(measured) or not is_number(predicted) or not predicted:
        return None
    return measured / predicted - 1.0


def compare(record: dict[str, Any], facts: ProbeFacts, setup: Setup, gpus: int, batch: int,
            rehearsed: bool, gpus_per_node: int | None) -> list[dict[str, Any]]:
    """Predicted beside measured, one row per quantity (the worst rank's measurement); samples/s
    where the ranks had their GPUs to themselves (a rehearsed speed is nobody's)."""
    p = predict(facts, setup, gpus, batch, gpus_per_node, rehearsed=rehearsed)
    comp = predicted_bytes(setting(facts, setup, gpus, gpus_per_node))
    pairs: list[tuple[str, float | None, float | None]] = []
    rows = record.get("memory_components") or []
    for c in COMPONENTS:
        measured = [r.get(f"{c}_mib") for r in rows if is_number(r.get(f"{c}_mib"))]
        predicted = 0.0 if setup.offload else float(comp[c] or 0) / MIB
        pairs.append((c, predicted, max(measured) if measured else None))
    memory = record.get("memory") or []
    for what, key, pred in (("allocated", "allocated_mib", p.allocated_mib), ("reserved", "reserved_mib", p.reserved_mib),
                            ("nvml", "nvml_used_mib", p.nvml_mib)):
        if what == "nvml" and rehearsed:
            continue   # one GPU's NVML memory holds every rehearsed rank
        measured = [m.get(key) for m in memory if is_number(m.get(key))]
        if measured or memory:
            pairs.append((what, pred, max(measured) if measured else None))
    sp = speed(facts, setup, gpus, batch, gpus_per_node)
    rate = (record.get("throughput") or {}).get("samples_per_s")
    if not rehearsed and sp is not None and is_number(rate):
        pairs.append(("samples_per_s", sp.samples_per_s(gpus), rate))
    return [{"setup": setup.name, "gpus": gpus, "batch": batch, "how": "rehearsed" if rehearsed else "ranks",
             "what": w, "predicted": pr, "measured": me, "error": _rel(me, pr),
             "status": record.get("status"), "reason": record.get("reason") or ""} for w, pr, me in pairs]


def check(advice: Advice, workload: Any, facts: ProbeFacts, precision: str, gpus_per_node: int | None = None,
          steps: int = 3, run=launch, runners_up: int = RUNNERS_UP, cpu: bool = False) -> list[dict[str, Any]]:
    """Run the recommended setup and its runners-up (on the CPU's gloo ranks where `cpu`);
    predicted against measured per quantity."""
    visible, device_mib = (0, 0.0) if cpu else visible_gpus()
    cuda = visible > 0
    rehearsed = cuda and visible < advice.gpus
    here = -(-advice.gpus // visible) if cuda else 1
    out: list[dict[str, Any]] = []
    for row in chosen_setups(advice, runners_up):
        setup = Setup(**_setup_fields(row["options"]))
        b = check_batch(facts, setup, row, advice.gpus, here, device_mib if cuda else 0.0, gpus_per_node)
        cap = cap_gib(facts, setup, advice.gpu_memory_gib, here, device_mib if cuda else 0.0)
        how = "rehearsed" if rehearsed else "ranks"

        def attempt(batch: int) -> dict[str, Any]:
            return run(run_config(workload, setup, advice.gpus, batch, precision, steps, rehearsed, cuda,
                                  gpus_per_node, cap))

        rec = attempt(b)
        if rec.get("status") != "ok":
            out.append(failed_row(setup, advice.gpus, b, how, rec))
            below = one_step_below(b, setup.accumulate)
            if not (cuda and out_of_memory(rec) and below < b):
                continue
            # the advised batch did not fit the card: one bisection step below says whether the
            # largest batch was still predicted within that step
            rec = attempt(below)
            fits = rec.get("status") == "ok"
            out.append({"setup": setup.name, "gpus": advice.gpus, "batch": below, "how": how, "what": "largest_batch",
                        "predicted": float(b), "measured": float(below) if fits else None,
                        "error": below / b - 1.0 if fits else None, "status": rec.get("status"),
                        "reason": "" if fits else str(rec.get("reason") or "")[:300]})
            if not fits:
                continue
            b = below
        out += compare(rec, facts, setup, advice.gpus, b, rehearsed, gpus_per_node)
    return out


def failed_row(setup: Setup, gpus: int, batch: int, how: str, rec: dict[str, Any]) -> dict[str, Any]:
    return {"setup": setup.name, "gpus": gpus, "batch": batch, "how": how, "what": "run", "predicted": None,
            "measured": None, "error": None, "status": rec.get("status"), "reason": str(rec.get("reason") or "")[:300]}


def out_of_memory(rec: dict[str, Any]) -> bool:
    reason = str(rec.get("reason") or "")
    return "OutOfMemoryError" in reason or "out of memory" in reason


def one_step_below(batch: int, granule: int) -> int:
    """The batch one bisection step (BISECTION_STEP of it) below `batch`, a multiple of `granule`."""
    below = int(batch * (1 - BISECTION_STEP)) // granule * granule
    return max(granule, below)


def _setup_fields(options: dict[str, Any]) -> dict[str, Any]:
    return {"variant": options["variant"], "reshard_after_forward": options.get("reshard_after_forward", True),
            "accumulate": options.get("accumulate", 1), "checkpoint": options.get("checkpoint") == "units",
            "offload": bool(options.get("offload", False))}


def ranking(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The advised setup (the first checked) against the fastest measured one: its measured
    samples/s over the best's, and whether that is within RANKING_TOLERANCE. None where fewer
    than two setups were timed (rehearsed ranks are never timed); `advised_rate` None where the
    advised setup itself did not run."""
    rates: dict[str, float] = {}
    for r in rows:
        if r["what"] == "samples_per_s" and is_number(r["measured"]):
            rates.setdefault(r["setup"], float(r["measured"]))
    if len(rates) < 2 or not rows:
        return None
    advised = rows[0]["setup"]
    best = max(rates, key=lambda k: rates[k])
    rate = rates.get(advised)
    share = rate / rates[best] if rate is not None else None
    return {"advised": advised, "advised_rate": rate, "best": best, "best_rate": rates[best], "share_of_best": share,
            "within": share is not None and share >= 1.0 - RANKING_TOLERANCE, "tolerance": RANKING_TOLERANCE}


def check_table(rows: list[dict[str, Any]]) -> str:
    def fmt(r: dict[str, Any]) -> list[Any]:
        err = r["error"]
        return [r["setup"], r["gpus"], r["batch"], r["how"], r["what"] if r["what"] != "run" else f"run {r['status']}",
                None if r["predicted"] is None else round(r["predicted"], 1),
                None if r["measured"] is None else round(r["measured"], 1),
                r["reason"] if r["what"] == "run" else (None if err is None else f"{err:+.1%}")]
    text = "Predicted against measured (--check)\n\n" + md_table(COLUMNS, [fmt(r) for r in rows], right=(1, 2, 5, 6))
    rk = ranking(rows)
    if rk is not None:
        got = "did not run" if rk["advised_rate"] is None else f"{rk['share_of_best']:.1%} of the best"
        text += (f"\n\nRanking: the advised {rk['advised']}: {got} ({rk['best']}, {rk['best_rate']:,.1f} samples/s); "
                 f"{'within' if rk['within'] else 'not within'} {rk['tolerance']:.0%}")
    return text
