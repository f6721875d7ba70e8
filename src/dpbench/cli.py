"""The `dpbench` command: one entry point for the package's tools.

    dpbench train --config '{"variant": "ddp", "gpus": 2}' --out results/x/runs/ddp-g2-r0
    dpbench collect --results-dir results --tag TAG      (the tidy tables, provenance.json)
    dpbench plots   --results-dir results --tag TAG      (figures/*.png)
    dpbench summary --results-dir results --tag TAG      (summary.md)
    dpbench claims  --results-dir results --tag TAG      (claims.md, claims.json)
    dpbench probe C2 --out results/TAG/claims/C2.json    (one claim probe)
    dpbench compare --baseline TAG --candidate TAG       (the regression check)
    dpbench reference results/TAG results/reference/NAME (a committed reference)
    dpbench perf-targets results/TAG --md F --json F     (the perf experiment's targets)
    dpbench tag [EXPERIMENT]                             (the default results tag here)
    dpbench check-workload mypkg.models:build            (a workload's factory, checked on the CPU)

Each subcommand is the module's own command line (`python -m dpbench.<module>` still works) and
its exit status is the command's (2, with one line naming the folder, where a result set's folder
is not writable). Modules load only when their subcommand runs, so that
`dpbench collect` or `dpbench tag` never imports torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with main(argv), what it does)
COMMANDS = {
    "train": ("dpbench.run.launch", "one training run (the pipeline's train rule)"),
    "collect": ("dpbench.analysis.collect", "runs' records -> the tidy tables and provenance.json"),
    "plots": ("dpbench.report.plots", "the figures of one result set"),
    "summary": ("dpbench.report.summarize", "summary.md of one result set"),
    "claims": ("dpbench.claims.ledger", "the claims ledger (claims.md, claims.json)"),
    "probe": ("dpbench.claims.probe", "one claim probe's record"),
    "compare": ("dpbench.compare_cli", "the regression check of two result sets"),
    "reference": ("dpbench.results.reference", "a finished result set -> a committed reference (clean commits only)"),
    "check-workload": ("dpbench.workloads.check", "a workload's factory: one CPU forward and backward, its sizes"),
}


def tag_main(argv: list[str]) -> int:
    from dpbench.plan.matrix import default_tag
    parser = argparse.ArgumentParser(prog="dpbench tag",
                                     description="The results tag an experiment gets by default here.")
    parser.add_argument("experiment", nargs="?", default="scaling")
    print(default_tag(parser.parse_args(argv).experiment))
    return 0


def perf_targets_main(argv: list[str]) -> int:
    from dpbench.report import perf_targets

    def ddp_default_bucket():   # torch only where a DDP run left bucket_cap_mb unset
        from dpbench.run.device_facts import ddp_default_bucket_mb
        return ddp_default_bucket_mb()

    return perf_targets.main(argv, pytorch_bucket=ddp_default_bucket)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="dpbench", description="Data-parallel training benchmark: run, collect, draw, compare.",
        epilog="`dpbench COMMAND --help` shows a command's options.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    sub.add_parser("tag", help="the default results tag here (torch-<version>)", add_help=False)
    sub.add_parser("perf-targets", help="the perf experiment's targets (targets.md, targets.json, figures)",
                   add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "tag":
        return tag_main(rest)
    if command == "perf-targets":
        return perf_targets_main(rest)
    if command not in COMMANDS:
        parser.parse_args([command])   # argparse's own message and exit status 2
    from dpbench.results.files import NotWritable
    module = importlib.import_module(COMMANDS[command][0])
    prog, sys.argv[0] = sys.argv[0], f"dpbench {command}"   # the module's argparse names itself so
    try:
        code = module.main(rest)
    except NotWritable as exc:   # a read-only result set: one line naming the folder, no traceback
        print(f"dpbench {command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.argv[0] = prog
    return 0 if code is None else int(code)


if __name__ == "__main__":
    sys.exit(main())
