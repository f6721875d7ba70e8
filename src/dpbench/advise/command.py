"""`dpbench advise WORKLOAD --gpus N --gpu-memory GB`: the command line. Checks its arguments
(one line and exit status 2 on a bad one, before torch loads), probes the workload at one rank,
prints the advice's table and sentence (--json: the data), and with --check runs the
recommended setup and its runners-up and prints predicted against measured."""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict

from dpbench.advise.predict import ProbeFacts
from dpbench.advise.recommend import COLUMNS, HEADROOM, advise, table_rows
from dpbench.advise.rank import LINK_GBS
from dpbench.report.markdown import md_table
from dpbench.results.errors import error_text
from dpbench.workloads.registry import WorkloadError, parse, resolve

PROG = "dpbench advise"


class BadInput(ValueError):
    """An argument advise cannot work with: its one-line message."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line and exit status 2 (not the usage and the message)."""

    def error(self, message: str):   # type: ignore[override]
        print(f"{PROG}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("workload", help="a name (transformer-lm), a factory (pkg.mod:build, file.py:build), "
                                     "or a mapping '{name|factory: ..., args: {...}}'")
    ap.add_argument("--gpus", type=int, required=True, help="GPUs to train on (one node)")
    ap.add_argument("--gpu-memory", type=float, required=True, metavar="GB", help="memory of each GPU, GiB")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--batch", type=int, help="per-GPU batch wanted (default: each setup's largest)")
    ap.add_argument("--gpus-per-node", type=int, help="hsdp's shard group (default: all --gpus)")
    ap.add_argument("--link-gbs", type=float, default=LINK_GBS, help="GPU-to-GPU bandwidth, GB/s")
    ap.add_argument("--headroom", type=float, default=HEADROOM, metavar="FRACTION",
                    help="share of each GPU's memory left unplanned (default %(default)g)")
    ap.add_argument("--probe-batches", type=int, nargs=2, default=[2, 8], metavar=("B1", "B2"))
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where the probe runs")
    ap.add_argument("--check", action="store_true", help="run the recommended setup and runners-up")
    ap.add_argument("--runners-up", type=int, default=2, help="--check: setups run after the recommended one")
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the advice as JSON")
    ap.add_argument("--json-out", metavar="FILE", help="also write the advice as JSON to FILE")
    return ap


def validate(args: argparse.Namespace):
    """The parsed workload; BadInput or WorkloadError naming the first bad argument."""
    if args.runners_up < 0 or args.check_steps < 2:
        raise BadInput("--runners-up at least 0 and --check-steps at least 2")
    if args.gpus < 1:
        raise BadInput(f"--gpus {args.gpus}: at least 1")
    if not (args.gpu_memory > 0 and math.isfinite(args.gpu_memory)):
        raise BadInput(f"--gpu-memory {args.gpu_memory:g}: a positive number of GiB")
    if args.batch is not None and args.batch < 1:
        raise BadInput(f"--batch {args.batch}: at least 1")
    if args.gpus_per_node is not None and (args.gpus_per_node < 1 or args.gpus % args.gpus_per_node):
        raise BadInput(f"--gpus-per-node {args.gpus_per_node}: must divide --gpus {args.gpus}")
    b1, b2 = args.probe_batches
    if not 1 <= b1 < b2:
        raise BadInput(f"--probe-batches {b1} {b2}: two batches, 1 <= B1 < B2")
    if not args.link_gbs > 0:
        raise BadInput(f"--link-gbs {args.link_gbs:g}: a positive bandwidth")
    if not 0 <= args.headroom < 0.5:
        raise BadInput(f"--headroom {args.headroom:g}: a share of the card from 0 up to 0.5")
    workload = parse(args.workload)
    resolve(workload)
    return workload


def process_group_line(facts: ProbeFacts) -> str:
    """The probe's fact about NCCL's own memory, in one line."""
    got = facts.process_group
    if not got or got.get("reason"):
        return f"NCCL's memory at one rank: not measured ({got.get('reason') or 'no measurement'}); none added."
    return (f"NCCL's memory at one rank: {facts.process_group_mib:.0f} MiB (NCCL {got.get('nccl')}), added to the "
            f"NVML memory of ranks with an NCCL group (a lower bound at N > 1).")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:   # --help (0) or a malformed argument (2, one line already printed)
        return int(exc.code or 0)
    try:
        workload = validate(args)
        import torch   # the probe's: only once the arguments are known good

        from dpbench.advise.probe import probe   # needs torch: likewise only once the arguments are good
        device = None if args.device == "auto" else torch.device(args.device, 0) if args.device == "cuda" \
            else torch.device("cpu")
        if args.device == "cuda" and not torch.cuda.is_available():
            raise BadInput("--device cuda: no CUDA device visible")
        facts = probe(workload, args.precision, tuple(args.probe_batches), device)
    except (BadInput, WorkloadError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:   # the probe failed: the workload's problem, in one line
        print(f"{PROG}: error: probing {args.workload}: {error_text(exc)}", file=sys.stderr)
        return 2
    advice = advise(facts, args.gpus, args.gpu_memory, args.batch, args.gpus_per_node, args.link_gbs, args.headroom)
    checked = None
    if args.check:
        from dpbench.advise.check import check, check_table, ranking   # needs torch: only for --check
        checked = check(advice, workload, facts, args.precision, args.gpus_per_node, steps=args.check_steps,
                        runners_up=args.runners_up, cpu=facts.device == "cpu")
    doc = {k: v for k, v in asdict(advice).items() if k != "facts"}
    doc["probe"] = {k: v for k, v in advice.facts.items() if k != "measured"}
    if checked is not None:
        doc["ranking"] = ranking(checked)
    text = json.dumps({**doc, "check": checked}, default=str)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    if args.json:
        print(text)
        return 0
    print(f"{advice.workload}: {facts.parameters:,} parameters, probed on {facts.device_name} "
          f"at batches {facts.batches[0]} and {facts.batches[1]}; {args.gpus} GPU(s) of {args.gpu_memory:g} GiB, "
          f"{args.precision}")
    print(process_group_line(facts))
    print(md_table(COLUMNS, table_rows(advice), right=range(3, len(COLUMNS))))
    print()
    print(advice.sentence)
    if checked is not None:
        print()
        print(check_table(checked))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
