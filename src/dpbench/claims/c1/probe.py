"""C1 in practice: the largest global batch each variant trains within a fixed memory budget
per GPU, at a narrow and a wide output.

    python -m dpbench.claims.c1.probe --variant dp --classes 10 32768 [--cap-gib 8]

prints one JSON line (one variant, each output size); the C1 probe starts one fresh process per
variant, so that no search inherits another's cached or fragmented memory. On every device the
variant uses, what PyTorch may allocate is capped at CAP_GIB
(torch.cuda.set_per_process_memory_fraction): the answer does not depend on how large the GPU
is, and the search stays quick. The CUDA context, NCCL's buffers and the cuBLAS/cuDNN handles
lie outside the cap, so a card of CAP_GIB holds somewhat less. The batch doubles from
batch_search.START until a training step runs out of memory, then is bisected to within 1/32.

A trial is two SGD steps with momentum (the second holds the momentum buffers) on random
images through dpbench's own model, variant wrappers and training step (c1.devices), with
the batch on the first device as the gpu feed puts it; the training runs' resident dataset (about 0.25 GiB on each rank's
device, all on device 0 under DataParallel) is not part of it. `dp` computes the loss on the
gathered outputs on device 0, `dp_sum` inside each replica. `ddp` is one rank in a one-process
group: every rank of a DDP run holds the same, so its global batch on N GPUs is N x the rank's.
"""
from __future__ import annotations

import argparse
import gc
import json
from typing import Any

import torch

from dpbench.claims import NOT_RUN
from dpbench.claims.batch_search import largest
from dpbench.claims.c1 import attribution
from dpbench.claims.c1.devices import one_rank, train_steps, variant_devices
from dpbench.claims.c1.verdict import DP_GPUS, verdict_from
from dpbench.claims.common import gpus_visible, needs, record, run_python
from dpbench.claims.records import obs as observation

CAP_GIB = 8.0
VARIANTS = ("single", "dp", "dp_sum", "ddp")


class _Trial:
    """Two training steps of one variant at one batch, on capped devices."""

    def __init__(self, variant: str, classes: int, devices: list):
        self.variant, self.classes, self.devices = variant, classes, devices
        self.peaks: dict[int, list[float]] = {}

    def __call__(self, batch: int) -> bool:
        for d in self.devices:
            torch.cuda.reset_peak_memory_stats(d)
        try:
            train_steps(self.variant, self.classes, batch, self.devices)
            self.peaks[batch] = [torch.cuda.max_memory_allocated(d) / 2**20 for d in self.devices]
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        except RuntimeError as exc:   # cuBLAS/cuDNN report a failed allocation in their own words
            if "out of memory" in str(exc).lower() or "ALLOC_FAILED" in str(exc):
                return False
            raise
        finally:
            gc.collect()
            torch.cuda.empty_cache()


def search(variant: str, classes: list[int], cap_gib: float) -> dict[str, Any]:
    """One variant's searches in this process (CUDA must not be initialised by anyone else)."""
    devices, skipped = variant_devices(variant)
    if skipped:
        return {"variant": variant, "skipped": skipped}
    for d in devices:
        total = torch.cuda.get_device_properties(d).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total), d)
    out: dict[str, Any] = {"variant": variant, "gpus": len(devices), "cap_gib": cap_gib,
                           "gpu_name": torch.cuda.get_device_name(0), "per_classes": {}}
    with one_rank(variant):
        for c in classes:
            trial = _Trial(variant, c, devices)
            found = largest(trial, granule=8 * len(devices))
            found["peak_mib_per_device"] = [round(m) for m in trial.peaks.get(found["largest"], [])]
            out["per_classes"][str(c)] = found
    return out


# -- the probe: one process per variant, and a verdict ------------------------------------------

def global_batch(variant: str, largest: int) -> int:
    """The global batch on DP_GPUS GPUs (single: on its one GPU)."""
    return largest * DP_GPUS if variant == "ddp" else largest


def variant_json(module: str, variant: str, *args: str) -> tuple[dict[str, Any], str | None]:
    """One variant's JSON line from `python -m module --variant V ARGS` in a fresh process, and
    why there is none (skipped, or failed with its exit code and last lines) where there is none."""
    r = run_python("", args=["-m", module, "--variant", variant, *args])
    if r.get("rc") or "per_classes" not in r:
        return r, r.get("skipped") or (f"failed (exit code {r.get('rc')}): " + " / ".join(r.get("stderr_tail") or []))
    return r, None


def run(batch: int, classes: list[int]):
    """batch: the C1 runs' global batch (the memory snapshots); classes: the output widths
    searched and snapshotted (dpbench.claims.settings)."""
    n = gpus_visible()
    if n < 1:
        return record("C1", [], NOT_RUN, not_run=needs(DP_GPUS, n))
    observations, parts_not_run = [], []
    found: dict[str, dict[str, int]] = {}
    for variant in VARIANTS:
        r, why = variant_json("dpbench.claims.c1.probe", variant, "--classes", *map(str, classes))
        if why:
            parts_not_run.append(f"largest batch of {variant} within {CAP_GIB:g} GiB allocated per GPU: {why}")
            continue
        for width, f in r["per_classes"].items():
            if f["largest"] == 0:
                parts_not_run.append(f"largest batch of {variant} at {int(width):,} outputs: not even "
                                     f"{f['smallest_failing']} images fit in {r['cap_gib']:g} GiB per GPU")
                continue
            total = global_batch(variant, f["largest"])
            found.setdefault(variant, {})[width] = total
            where = ("one rank of a one-process group, global = " + f"{DP_GPUS} x the rank's"
                     if variant == "ddp" else f"{r['gpus']} GPU{'s' if r['gpus'] > 1 else ''}")
            failing = f["smallest_failing"] and global_batch(variant, f["smallest_failing"])
            observations.append(observation(
                f"c1.max_batch.{variant}.out{width}",
                f"largest batch {variant} trains within {r['cap_gib']:g} GiB allocated by PyTorch per GPU, "
                f"{int(width):,} outputs ({where})",
                global_batch=total, smallest_failing=failing, cap_gib=r["cap_gib"],
                peak_mib_per_device=f["peak_mib_per_device"], trials=len(f["trials"]), gpu=r["gpu_name"]))
    # Why device 0 holds more: its peak by what allocated it, at the runs' batch (one process each)
    for variant in VARIANTS:
        r, why = variant_json("dpbench.claims.c1.attribution", variant, "--batch", str(batch),
                              "--classes", *map(str, classes))
        if why:
            parts_not_run.append(f"each device's peak by what allocated it (memory snapshot), {variant}: {why}")
            continue
        observations += attribution.observations(r)
    return record("C1", observations, verdict_from(found), parts_not_run=parts_not_run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", required=True, choices=VARIANTS)
    ap.add_argument("--classes", type=int, nargs="+", required=True, help="output widths (the C1 probe passes the experiment's)")
    ap.add_argument("--cap-gib", type=float, default=CAP_GIB)
    args = ap.parse_args(argv)
    print(json.dumps(search(args.variant, args.classes, args.cap_gib)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
