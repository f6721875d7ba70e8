"""What a compare report decided, apart from its words: the verdict of every aspect per cell.

A report may gain an informative field, or word a verdict's reason anew, and still decide the
same: tests of evidence compare these, never the report's bytes.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dpbench import results
from dpbench import compare_cli

ASPECTS = ("status", "throughput", "memory", "loss", "accuracy")
# The fields that name what a row judges (a run, a cell, a device of a cell, a warning).
IDENTITY = ("run_id", "variant", "gpus", "options", "device", "category", "message")


def _row(r: dict) -> tuple:
    # status rows say their outcome as `change`; every other aspect as `verdict`
    return tuple(str(r[k]) for k in IDENTITY if k in r), r.get("verdict", r.get("change")), r["severity"]


def compare_verdicts(report: dict) -> dict:
    """aspect -> sorted (identity, verdict, severity) rows, plus the counts and the launch shift."""
    out = {"counts": report["verdict"]["counts"]}
    out.update({aspect: sorted(map(_row, report[aspect])) for aspect in ASPECTS})
    out.update({f"warnings {kind}": sorted(map(_row, rows)) for kind, rows in report["warnings"].items()})
    if report.get("noise"):
        out["noise shift_beyond"] = report["noise"]["shift_beyond"]
    return out


def run_compare(tmp_path: Path, root: Path, baseline: str, candidate: str, noise_from: Sequence[str] = (),
                fail_on: Sequence[str] = (), thresholds: dict | None = None,
                report_format: int | None = None) -> tuple[int, dict, Path]:
    """compare's CLI on result sets under root, linked into tmp_path (where the report goes);
    returns (exit status, the report's JSON, the markdown report's path)."""
    for tag in dict.fromkeys([baseline, candidate, *noise_from]):
        (tmp_path / tag).symlink_to(root / tag, target_is_directory=True)
    argv = ["--results-dir", str(tmp_path), "--baseline", baseline, "--candidate", candidate]
    argv += ["--noise-from", ",".join(noise_from)] if noise_from else []
    argv += ["--fail-on", ",".join(fail_on)] if fail_on else []
    argv += ["--report-format", str(report_format)] if report_format else []
    argv += [a for k, v in (thresholds or {}).items() for a in (f"--{k.replace('_', '-')}", repr(v))]
    code = compare_cli.main(argv)
    assert code in (0, 1), f"compare exited {code} (it could not compare)"
    md, js = results.compare_paths(tmp_path, baseline, candidate)
    return code, results.read_json(js), md
