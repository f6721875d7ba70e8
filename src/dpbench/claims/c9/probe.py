"""C9 in practice: the largest per-GPU batch each variant trains within a memory cap per GPU,
and its throughput there, along the transformer family's size.

    python -m dpbench.claims.c9.probe --variants ddp zero1 fsdp --gpus 1 --cap-gib 22 \\
        --sizes 256x4 1024x16 2048x20 [--precision fp32]

prints largest_batch.csv's rows (results.LARGEST_BATCH_COLUMNS) as a table and, last, one JSON line.
Every trial is a real dpbench run in a fresh process (`python -m dpbench.run.launch`: torchrun for
the distributed variants, so any variant the launcher knows is searched the same way) of a few
steps on synthetic tokens, with the run option memory_cap_gib: what PyTorch may allocate on each
device is capped (torch.cuda.set_per_process_memory_fraction), so the answer does not depend on
the card. A trial fits when its record is ok and does not when it failed out of memory; any
other outcome (skipped, another failure) stops that search with the record's reason. The batch
doubles from START, then is bisected to RESOLUTION (claims.batch_search.largest); a short timed run
at the largest batch gives the throughput. Without CUDA nothing runs out of memory: the search
is skipped with that reason.
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from dpbench.claims import NOT_RUN
from dpbench.claims.batch_search import largest
from dpbench.claims.c9.predicted import BUDGETS
from dpbench.claims.c9.verdict import BASELINE, CONDITIONS_ID, SHARDED, row_id, verdict_from
from dpbench.claims.common import gpus_visible, record
from dpbench.claims.records import obs
from dpbench.report.markdown import md_table
from dpbench.results import LARGEST_BATCH_COLUMNS, STATUS_FAILED, STATUS_OK
from dpbench.run.launch import record_of_fresh_run
from dpbench.run.provenance import nvidia_smi_topology
from dpbench.workloads.transformer_lm import parameter_count

VARIANTS = ("ddp", "zero1", "fsdp")
# (width, layers) of the transformer family (seq_len 512, vocab 32768, tied): ~12M, ~42M, ~235M, ~1.07B
SIZES = ((256, 4), (512, 8), (1024, 16), (2048, 20))
START = 8
RESOLUTION = 1 / 16
TRIAL_STEPS, TIMED_STEPS, TIMED_WARMUP = 3, 10, 3
TRIAL_TIMEOUT_S = 300
CAP_GIB = BUDGETS["24GB"][0]   # the default budget per GPU: what a 24 GB card leaves PyTorch


class SearchStopped(Exception):
    """A trial that neither fitted nor ran out of memory: the search ends with its reason."""


def out_of_memory(reason: str) -> bool:
    """A failed record's reason as PyTorch, cuBLAS or cuDNN word a failed allocation."""
    text = reason.lower()
    return "out of memory" in text or "outofmemoryerror" in text or "alloc_failed" in text


def fits(record: dict[str, Any]) -> bool:
    """ok -> True, failed out of memory -> False, anything else stops the search."""
    status, reason = record.get("status"), str(record.get("reason") or "")
    if status == STATUS_OK:
        return True
    if status == STATUS_FAILED and out_of_memory(reason):
        return False
    raise SearchStopped(f"{status}: {reason}" if reason else str(status))


def search(trial: Callable[[int], dict[str, Any]], start: int = START,
           resolution: float = RESOLUTION) -> dict[str, Any]:
    """The largest batch whose trial record is ok: {largest (None where stopped), reason, trials}."""
    tried: list[int] = []

    def ok(batch: int) -> bool:
        tried.append(batch)
        return fits(trial(batch))

    try:
        found = largest(ok, granule=1, start=start, resolution=resolution)
    except SearchStopped as stop:
        return {"largest": None, "reason": str(stop), "trials": tried}
    reason = "" if found["largest"] else f"not even batch 1 fits (smallest failing: {found['smallest_failing']})"
    return {"largest": found["largest"] or None, "reason": reason, "trials": tried,
            "smallest_failing": found["smallest_failing"]}


def run_config(variant: str, gpus: int, size: tuple[int, int], batch: int, cap_gib: float,
               precision: str, steps: int, warmup: int) -> dict[str, Any]:
    """One trial's run config: a few steps of the transformer at this per-GPU batch, capped."""
    width, layers = size
    return {"variant": variant, "gpus": gpus, "precision": precision, "memory_cap_gib": cap_gib,
            "workload": {"name": "transformer-lm", "args": {"width": width, "layers": layers}},
            "per_gpu_batch": batch, "global_batch": batch * gpus, "dataset": "synthetic",
            "synthetic_size": batch * gpus * steps, "synthetic_test_size": gpus, "eval_samples": gpus,
            "eval_each_epoch": False, "epochs": 1, "max_steps": steps, "warmup_steps": warmup}


def launch(cfg: dict[str, Any]) -> dict[str, Any]:
    """A dpbench run in a fresh process; its record (a failed one where it left none)."""
    return record_of_fresh_run(cfg, TRIAL_TIMEOUT_S, prefix="c9-")


def search_row(variant: str, gpus: int, size: tuple[int, int], cap_gib: float, precision: str = "fp32",
               run: Callable[[dict[str, Any]], dict[str, Any]] = launch, cuda_gpus: int | None = None,
               resolution: float = RESOLUTION) -> dict[str, Any]:
    """One row of largest_batch.csv as far as the search goes (time_row adds the throughput)."""
    width, layers = size
    row: dict[str, Any] = {"workload": f"transformer-lm-{width}x{layers}", "variant": variant, "gpus": gpus,
                           "parameters": parameter_count(width, layers, 512, 32768, True),
                           "reshard_after_forward": variant in ("fsdp", "hsdp"), "precision": precision,
                           "largest_batch": None, "samples_per_s_at_largest": None, "cap_gib": cap_gib,
                           "budget": next((n for n, (g, _) in BUDGETS.items() if g == cap_gib), ""),
                           "rehearsed": False, "predicted_largest_batch": None, "smallest_failing": None}
    found_gpus = cuda_devices() if cuda_gpus is None else cuda_gpus
    if found_gpus < gpus:
        return {**row, "reason": f"needs {gpus} CUDA GPU{'s' if gpus > 1 else ''} (found {found_gpus}): "
                                 "nothing runs out of memory without CUDA"}
    found = search(lambda b: run(run_config(variant, gpus, size, b, cap_gib, precision, TRIAL_STEPS, 1)),
                   resolution=resolution)
    return {**row, "largest_batch": found["largest"], "reason": found["reason"],
            "smallest_failing": found.get("smallest_failing")}


def time_row(row: dict[str, Any], size: tuple[int, int],
             run: Callable[[dict[str, Any]], dict[str, Any]] = launch) -> dict[str, Any]:
    """The row with the samples/s of a short timed run at its largest batch (alone on its GPUs)."""
    if not row["largest_batch"]:
        return row
    timed = run(run_config(row["variant"], row["gpus"], size, row["largest_batch"], row["cap_gib"],
                           row["precision"], TIMED_STEPS, TIMED_WARMUP))
    if timed.get("status") != STATUS_OK:
        return {**row, "reason": f"timed run at the largest batch {timed.get('status')}: {timed.get('reason')}"}
    tp = timed["throughput"]   # samples (sequences) a second; records before workloads: images
    return {**row, "samples_per_s_at_largest": tp.get("samples_per_s") or tp.get("images_per_s")}


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def sweep(sizes=SIZES, variants=VARIANTS, gpu_counts=None, cap_gib: float = CAP_GIB, precision: str = "fp32",
          jobs: int = 1, resolution: float = RESOLUTION,
          run: Callable[[dict[str, Any]], dict[str, Any]] = launch) -> list[dict[str, Any]]:
    """Every (GPUs, size, variant) row; by default at one GPU and at every GPU visible. With jobs > 1
    the searches share the GPUs, `jobs` at a time (each within its cap: jobs x cap must fit the
    card); the timed runs then run one at a time, so no throughput is measured beside another run."""
    n = cuda_devices()
    cells = [(v, g, s) for g in (gpu_counts or sorted({1, max(n, 1)})) for s in sizes for v in variants]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(lambda c: search_row(c[0], c[1], c[2], cap_gib, precision, run, n, resolution), cells))
    return [time_row(r, c[2], run) for r, c in zip(rows, cells)]


def probe_record(rows: list[dict[str, Any]], cap_gib: float):
    """The probe record: where the searches ran, then one observation per row (its id:
    verdict.row_id); the ledger decides the verdict again from the same rows."""
    conditions = obs(CONDITIONS_ID, "where the searches ran", interconnect=interconnect(nvidia_smi_topology()))
    observations = [conditions] + [obs(row_id(r), f"largest batch of {r['variant']} on {r['gpus']} GPU(s), "
                                       f"{r['workload']}, within {cap_gib:g} GiB per GPU", **r) for r in rows]
    parts = [f"{r['variant']} on {r['gpus']} GPU(s), {r['workload']}: {r['reason']}" for r in rows if r["reason"]]
    return record("C9", observations, verdict_from(rows).verdict, parts_not_run=parts)


def jobs_that_fit(cap_gib: float) -> int:
    """How many capped searches share the GPUs at once: as many as the smallest card holds with a
    CUDA context (~1.5 GiB) beside each cap."""
    total = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    return max(1, int(total / 2**30 // (cap_gib + 1.5)))


def run(sizes=SIZES, variants=(BASELINE, SHARDED), cap_gib: float = CAP_GIB):
    """The C9 probe of the claims experiment (python -m dpbench.claims.probe C9): the two variants
    the verdict compares (tools/device/c9_bench.sh adds zero1), searches sharing the GPUs."""
    if gpus_visible() < 1:
        return record("C9", [], NOT_RUN, not_run="needs CUDA: nothing runs out of memory on the CPU")
    return probe_record(sweep(sizes, variants, cap_gib=cap_gib, jobs=jobs_that_fit(cap_gib), resolution=1 / 8),
                        cap_gib)


def interconnect(topology: str | None) -> str:
    """GPU0 to GPU1 as `nvidia-smi topo -m` names the link (NV18: NVLink; PIX, PHB, SYS: PCIe)."""
    lines = [ln.split() for ln in (topology or "").splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln and ln[0].startswith("GPU")), None)
    row0 = next((ln for ln in lines[lines.index(header) + 1:] if ln[0] == "GPU0"), None) if header else None
    if not header or not row0 or "GPU1" not in header:
        return "one GPU" if header and "GPU1" not in header else "unknown (no nvidia-smi topo -m)"
    return row0[header.index("GPU1") + 1]


def arguments() -> argparse.ArgumentParser:
    """The probe's command line (claims.c9.bench adds its ledger directory)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--gpus", type=int, nargs="+", help="GPU counts (default: 1 and all visible)")
    ap.add_argument("--sizes", nargs="+", default=[f"{w}x{n}" for w, n in SIZES], help="WIDTHxLAYERS")
    ap.add_argument("--cap-gib", type=float, default=CAP_GIB)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--jobs", type=int, default=1, help="searches at a time (sharing the GPUs, each capped)")
    ap.add_argument("--resolution", type=float, default=RESOLUTION, help="bisect until within this fraction")
    return ap


def sweep_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of the sweep the command line asks for."""
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes]
    return sweep(sizes, args.variants, args.gpus, args.cap_gib, args.precision, args.jobs, args.resolution)


def table(rows: list[dict[str, Any]]) -> str:
    """largest_batch.csv's rows as a markdown table."""
    return md_table(LARGEST_BATCH_COLUMNS, [[r[c] for c in LARGEST_BATCH_COLUMNS] for r in rows])


def main(argv: list[str] | None = None) -> int:
    rows = sweep_of(arguments().parse_args(argv))
    print(table(rows))
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
