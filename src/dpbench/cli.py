"""The `dpbench` command: one entry point for the package's tools.

    dpbench train --config '{"variant": "ddp", "gpus": 2}' --out results/x/runs/ddp-g2-r0
    dpbench collect --results-dir results --tag TAG      (the tidy tables, provenance.json)
    dpbench plots   --results-dir results --tag TAG      (figures/*.png)
    dpbench summary --results-dir results --tag TAG      (summary.md)
    dpbench claims  --results-dir results --tag TAG      (claims.md, claims.json)
    dpbench probe C2 --out results/TAG/claims/C2.json    (one claim probe)
    dpbench compare --baseline TAG --candidate TAG       (the regression check)
    dpbench compare --paired TAG                         (the environments of one paired launch)
    dpbench bisect PY1 PY2 ... PYn                       (which environment first made a cell slower)
    dpbench reference results/TAG results/reference/NAME (a committed reference)
    dpbench perf-targets results/TAG --md F --json F     (the perf experiment's targets)
    dpbench tag [EXPERIMENT]                             (the default results tag here)
    dpbench report TAG                                   (results/TAG/report.html, from the set's plan.json)
    dpbench check-workload mypkg.models:build            (a workload's factory, checked on the CPU)
    dpbench advise transformer-lm --gpus 8 --gpu-memory 80 (which setup: predicted, ranked, --check)

Each subcommand is the module's own command line (`python -m dpbench.<module>` still works) and
its exit status is the command's (2, with one line naming the folder, where a result set's folder
is not writable). Modules load only when their subcommand runs, so that
`dpbench collect` or `dpbench tag` never imports torch.
"""
from __future__ import annotations

import argparse
import importlib
import json
import shlex
import subprocess
import sys
from pathlib import Path

# The dispatch: each subcommand imports its modules (dpbench's, and yaml) when it runs, in its
# function below or in main, so that `dpbench tag` or `dpbench collect` never loads torch.

# subcommand -> (module with main(argv), what it does)
COMMANDS = {
    "train": ("dpbench.run.launch", "one training run (the pipeline's train rule)"),
    "collect": ("dpbench.analysis.collect", "runs' records -> the tidy tables and provenance.json"),
    "plots": ("dpbench.report.plots", "the figures of one result set"),
    "summary": ("dpbench.report.summarize", "summary.md of one result set"),
    "claims": ("dpbench.claims.ledger", "the claims ledger (claims.md, claims.json)"),
    "probe": ("dpbench.claims.probe", "one claim probe's record"),
    "compare": ("dpbench.compare_cli", "the regression check of two result sets"),
    "bisect": ("dpbench.bisect_cli", "which of an ordered list of environments first made a cell slower"),
    "reference": ("dpbench.results.reference", "a finished result set -> a committed reference (clean commits only)"),
    "check-workload": ("dpbench.run.check_workload", "a workload on the CPU: its factory, a forward and backward, two engine steps"),
}


def tag_main(argv: list[str]) -> int:
    from dpbench.plan.matrix import default_tag   # its subcommand's own (see the top)
    parser = argparse.ArgumentParser(prog="dpbench tag",
                                     description="The results tag an experiment gets by default here.")
    parser.add_argument("experiment", nargs="?", default="scaling")
    print(default_tag(parser.parse_args(argv).experiment))
    return 0


REPORT_CONFIG = "report.config.yaml"   # next to plan.json: the config the report was planned with


class ReportError(ValueError):
    """A report that cannot be built: the message names the file and the way out."""


def report_config(results_dir: str, tag: str, workflow: Path) -> tuple[dict, str | None]:
    """The config that plans TAG's DAG again: what the set's plan.json says was given, with its
    experiment, its tag (a default tag names another torch once torch is upgraded) and the GPUs it
    was planned for pinned; and a note when plan.json is older than its `given`."""
    from dpbench import results   # its subcommand's own (see the top)
    from dpbench.plan.pipeline import tag_problem

    problem = tag_problem(tag)
    if problem or not tag:
        raise ReportError(problem or "a tag is needed: dpbench report TAG (the folders under results/)")
    rs = results.ResultSet(workflow / results_dir, tag)
    try:
        doc = json.loads(rs.plan_path.read_text())
        experiment, planned_tag, gpus = doc["experiment"], doc["tag"], doc["gpus_planned"]
    except FileNotFoundError:
        raise ReportError(f"{rs.plan_path}: not found; the report is built from the set's plan: make it "
                          f"with the command that made the set (its --config or --configfile, tag={tag}) "
                          f"and the target {rs.plan_path}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{rs.plan_path}: unreadable ({type(exc).__name__}: {exc}); rebuild it with the "
                          f"command that made the set (its --config or --configfile, tag={tag}) and the "
                          f"target {rs.plan_path}") from None
    given, note = doc.get("given"), None
    if not isinstance(given, dict):
        given, note = {}, (f"{rs.plan_path} predates the config it was given: the report plans experiment "
                           f"{experiment!r} without the set's other --config keys")
    config = {**given, "experiment": experiment, "tag": planned_tag, "results_dir": results_dir,
              "gpus_available": gpus}
    return config, note


def report_command(results_dir: str, tag: str, out: str | None, workflow: Path) -> tuple[list[str], Path, dict, str | None]:
    """`snakemake --report OUT --configfile F` for TAG (run in the workflow folder), the file F to
    write the set's config to, the config, and report_config's note."""
    if not (workflow / "Snakefile").is_file():
        raise ReportError(f"no Snakefile in {workflow.resolve()}: run from the repository's root or give --workflow DIR")
    config, note = report_config(results_dir, tag, workflow)
    set_dir = workflow / results_dir / config["tag"]
    target = str(Path(out).resolve()) if out else str(Path(results_dir) / config["tag"] / "report.html")
    configfile = (set_dir / REPORT_CONFIG).resolve()
    return ([sys.executable, "-m", "snakemake", "--report", target, "--configfile", str(configfile)],
            configfile, config, note)


def report_main(argv: list[str]) -> int:
    import yaml   # its subcommand's own (see the top)
    from dpbench.results.files import NotWritable, write_atomic

    parser = argparse.ArgumentParser(
        prog="dpbench report",
        description="The HTML report of one result set (snakemake --report), planned with the set's own "
                    "experiment, tag and config as its plan.json keeps them.")
    parser.add_argument("tag", help="the result set: a folder under --results-dir")
    parser.add_argument("--results-dir", default="results", help="relative to --workflow (default: results)")
    parser.add_argument("--out", help="the report (default: RESULTS_DIR/TAG/report.html)")
    parser.add_argument("--workflow", type=Path, default=Path("."), help="the folder of the Snakefile (default: .)")
    parser.add_argument("--print", action="store_true", dest="print_only",
                        help="print the command and the config file it reads, build nothing")
    args = parser.parse_args(argv)
    try:
        command, configfile, config, note = report_command(args.results_dir, args.tag, args.out, args.workflow)
    except ReportError as exc:
        print(f"dpbench report: error: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"dpbench report: note: {note}", file=sys.stderr)
    try:
        write_atomic(configfile, yaml.safe_dump(config, sort_keys=True).encode())
    except NotWritable as exc:
        print(f"dpbench report: error: {exc}", file=sys.stderr)
        return 2
    shown = shlex.join(["snakemake", *command[3:]])
    print(f"dpbench report: {shown}   (in {args.workflow.resolve()})", file=sys.stderr)
    if args.print_only:
        return 0
    return subprocess.run(command, cwd=args.workflow).returncode


def perf_targets_main(argv: list[str]) -> int:
    from dpbench.report import perf_targets   # its subcommand's own (see the top)

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
    sub.add_parser("report", help="the HTML report of one result set, with the set's own config", add_help=False)
    sub.add_parser("perf-targets", help="the perf experiment's targets (targets.md, targets.json, figures)",
                   add_help=False)
    sub.add_parser("advise", help="which data-parallel setup for a workload on N GPUs: predicted, ranked, checked",
                   add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "tag":
        return tag_main(rest)
    if command == "perf-targets":
        return perf_targets_main(rest)
    if command == "report":
        return report_main(rest)
    if command == "advise":   # its own prog name; torch loads only once its arguments are good
        from dpbench.advise.command import main as advise_main
        return advise_main(rest)
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
