"""The regression check's command line: compare two result sets, write the markdown and json
reports, and exit 0 (compared), 1 (a --fail-on kind was found) or 2 (an input is missing or
damaged; never a traceback).

    python -m dpbench.compare_cli --results-dir results --baseline A --candidate B \\
        [--fail-on-regression] [--fail-on new-warnings,diverged-curves] [--noise-from A,A2,A3]
    dpbench compare --baseline A --candidate B        (the same)
    dpbench compare --paired TAG [--base base --cand cand]   (the environments of one paired launch)

It sits above analysis (the numbers) and report (the words), which may not import each other
that way round.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings

from dpbench import results as R
from dpbench.analysis import compare
from dpbench.analysis.compare import one_launch
from dpbench.report import compare_report
from dpbench.results.errors import error_text


def _fail_on(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in compare.FAIL_ON]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown kind {unknown[0]!r}; choose from {', '.join(compare.FAIL_ON)}")
    return kinds


def _tags(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _parser() -> argparse.ArgumentParser:
    # No prog: argparse takes sys.argv[0], which `dpbench compare` sets to its own name.
    p = argparse.ArgumentParser(description=compare.__doc__.split("\n")[0],
                                epilog="Exit status: 0 compared; 1 a --fail-on kind was found; "
                                       "2 an input is missing or damaged.")
    p.add_argument("--results-dir", default="results")
    p.add_argument("--baseline", help="tag of the reference result set")
    p.add_argument("--candidate", help="tag of the result set under test")
    p.add_argument("--paired", metavar="TAG", help="a paired launch (experiment key environments): "
                   "compare its environments within it, instead of --baseline and --candidate")
    p.add_argument("--base", help="--paired: the reference environment (default: the first named)")
    p.add_argument("--cand", help="--paired: the environment under test (default: the second named)")
    p.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when regressions are found (same as --fail-on regressions)")
    p.add_argument("--fail-on", type=_fail_on, default=[], metavar="KIND[,KIND]",
                   help=f"exit 1 when any of these is found: {', '.join(compare.FAIL_ON)}")
    p.add_argument("--noise-from", type=_tags, default=[], metavar="TAG,TAG[,TAG]",
                   help="learn the noise between launches from these A/A launches (the same "
                        "experiment launched several times on the baseline's machine) instead of "
                        "--noise-floor")
    p.add_argument("--report-format", type=int, choices=range(1, compare.REPORT_FORMAT + 1),
                   default=compare.REPORT_FORMAT,
                   help="remake a report by an older format's rules (1: throughput change a ratio "
                        "of medians, Welch on raw images/s; 2: every loss curve by the unpaired "
                        "curve test, none seed-paired)")
    for f in dataclasses.fields(compare.Thresholds):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=float, default=f.default,
                       help=f"default {f.default:g}")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.paired and not (args.baseline and args.candidate):
        parser.error("give --baseline and --candidate (two result sets), or --paired TAG (one paired launch)")
    what = f"paired launch {args.paired!r}" if args.paired else f"{args.baseline!r} with {args.candidate!r}"
    th = compare.Thresholds(**{f.name: getattr(args, f.name) for f in dataclasses.fields(compare.Thresholds)})
    fail_on = list(dict.fromkeys((["regressions"] if args.fail_on_regression else []) + args.fail_on))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # one line out, whatever pandas or scipy think
            if args.paired:
                report = one_launch.compare_paired(args.results_dir, args.paired, args.base, args.cand, th)
                md_path, json_path = R.paired_compare_paths(args.results_dir, args.paired,
                                                            report["baseline"], report["candidate"])
            else:
                report = compare.compare(args.results_dir, args.baseline, args.candidate, th, args.noise_from,
                                         args.report_format)
                md_path, json_path = R.compare_paths(args.results_dir, args.baseline, args.candidate)
            report["fail_on"] = fail_on
            # Rendered before anything is written, the json last: a crash leaves no half report.
            text = compare_report.render_markdown(report)
            R.write_atomic(md_path, text)
            R.write_json(json_path, report)
    except (compare.InputError, R.NotWritable) as exc:
        print(f"dpbench.compare_cli: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # never a traceback, never exit 1: the checker broke, not the code
        print(f"dpbench.compare_cli: error: cannot compare {what}: {error_text(exc)}", file=sys.stderr)
        return 2
    if report["provenance"]["warning"]:
        print(f"WARNING: {report['provenance']['warning']}", file=sys.stderr)
    failed = [k for k in fail_on if report["verdict"]["counts"][k]]
    print(f"{report['verdict']['line']}  ->  {md_path}"
          + (f"  (fails on: {', '.join(failed)})" if failed else ""))
    return compare.exit_code(report, fail_on)


if __name__ == "__main__":
    sys.exit(main())
