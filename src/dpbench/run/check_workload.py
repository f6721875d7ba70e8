"""`dpbench check-workload SPEC`: a workload checked on the CPU in seconds, then trained as a run
trains it. First its factory, batch maker, one forward and backward and the loss's shape
(workloads.check); then two steps of `single` and of `ddp` on one gloo rank, through the engine's
own pieces (run.engine's workload, model and DDP options, run.data.WorkloadFeed, run.variants.Variant,
run.step.train_step): a workload that passes trains in a run. It prints the sizes, the batch's
shapes and each variant's losses; on any problem, one line on stderr and exit status 2.

DataParallel needs GPUs and the sharded variants a process group of their own: not tried here."""
from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from dpbench.plan import variants
from dpbench.plan.config import RunConfig
from dpbench.results.errors import error_text
from dpbench.run import engine, step
from dpbench.run.data import WorkloadFeed
from dpbench.workloads.check import check
from dpbench.workloads.registry import WorkloadError, parse

VARIANTS = ("single", "ddp")
STEPS = 2
BATCH = 2


def train_steps(spec, variant: str, seed: int = 0, find_unused_parameters: bool = False) -> list[float]:
    """The global loss of each of STEPS steps of `variant` on the CPU, as a run takes them (ddp:
    under a process group, one of one gloo rank unless one is open already)."""
    cfg = RunConfig(variant=variant, workload=spec, seed=seed, device="cpu", global_batch=BATCH,
                    find_unused_parameters=find_unused_parameters, lr=0.01)
    opened = None
    if variants.spec(variant).distributed and not dist.is_initialized():
        opened = tempfile.TemporaryDirectory()
        dist.init_process_group("gloo", init_method=f"file://{Path(opened.name) / 'store'}", rank=0, world_size=1)
    try:
        w = engine.build_workload(cfg)
        device = torch.device("cpu")
        model = w.model.to(device).train()
        v, opt = engine.wrap(cfg, w, model, [device], 1)
        feed = WorkloadFeed(w.batch, STEPS * BATCH, BATCH, seed, device, total=STEPS)
        return [step.train_step(v, opt, x, y, n).global_sum.item() / n for x, y, n in feed.epoch(0)]
    finally:
        if opened is not None:
            dist.destroy_process_group()
            opened.cleanup()


def trained(spec, seed: int = 0, find_unused_parameters: bool = False) -> list[str]:
    """A line of losses for each variant tried; raises WorkloadError naming the variant that failed."""
    lines = []
    for variant in VARIANTS:
        try:
            with warnings.catch_warnings():   # one line on a problem: torch's warnings are not it
                warnings.simplefilter("ignore")
                losses = train_steps(spec, variant, seed, find_unused_parameters)
        except Exception as exc:
            text = error_text(exc)
            hint = ("; if some parameters are unused in forward, set the train option "
                    "find_unused_parameters: true (here --find-unused-parameters)"
                    if "find_unused_parameters" in text and not find_unused_parameters else "")
            raise WorkloadError(f"{variant} (the engine's step, {STEPS} steps on the CPU) failed: {text}{hint}") from exc
        lines.append(f"{variant}: {STEPS} steps of the engine's training step, global loss "
                     f"{' -> '.join(f'{v:.4f}' for v in losses)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dpbench check-workload", description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="a name (transformer-lm), a factory (pkg.mod:build, file.py:build), "
                                     "or a mapping '{name|factory: ..., args: {...}}'")
    parser.add_argument("--seed", type=int, default=0, help="the batch maker's generator seed")
    parser.add_argument("--find-unused-parameters", action="store_true",
                        help="ddp as the train option find_unused_parameters: true runs it")
    args = parser.parse_args(argv)
    try:
        spec = parse(args.spec)
        lines = check(spec, args.seed)
        lines += trained(spec, args.seed, args.find_unused_parameters)
    except Exception as exc:   # any problem, WorkloadError or not, is one line and status 2
        message = str(exc) if isinstance(exc, WorkloadError) else error_text(exc)
        print(f"dpbench check-workload: {message}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
