"""The files the Snakefile's rules write for a plan (tables, figures, reports, probes, targets),
from the plan's result set."""
from __future__ import annotations

from pathlib import Path

from dpbench import SHARDED_VARIANTS, results
from dpbench.plan.matrix import Plan

def table_files(plan: Plan) -> dict[str, str]:
    return {name: str(path) for name, path in plan.results.table_paths().items()}


def figure_files(plan: Plan) -> dict[str, str]:
    return {name: str(path) for name, path in plan.results.figure_paths().items()}


def sharding_files(plan: Plan) -> dict[str, str]:
    """The sharded variants' figures (by name) and sharding.md ("md"), for a plan with sharded
    runs (none for the others)."""
    if not any(rc.variant in SHARDED_VARIANTS for rc in plan.runs.values()):
        return {}
    figures = {name: str(path) for name, path in plan.results.sharding_figure_paths().items()}
    return {**figures, "md": str(plan.results.sharding_md)}


def claim_figure_files(plan: Plan) -> dict[str, str]:
    """The claims ledger's own figures, drawn with claims.md."""
    return {key: str(path) for key, path in plan.results.claim_figure_paths().items()}


def probe_files(plan: Plan) -> list[str]:
    return [str(plan.results.probe_path(claim)) for claim in plan.config["probes"]]


def perf_target_files(plan: Plan) -> dict[str, str]:
    """What `dpbench perf-targets` writes for the perf experiment (its option -> file); none for
    the others, whose cells the targets do not name."""
    if plan.config["experiment"] != "perf":
        return {}
    rs = plan.results
    return {"md": str(rs.dir / "targets.md"), "json": str(rs.dir / "targets.json"),
            "figure": str(rs.figures_dir / "recipe_steps.png"),
            "sweep_figure": str(rs.figures_dir / "bucket_sweep.png")}


def final_targets(plan: Plan) -> list[str]:
    targets = list(table_files(plan).values()) + list(figure_files(plan).values())
    targets += [str(plan.results.summary_md), str(plan.results.plan_path)]
    targets += list(perf_target_files(plan).values()) + list(sharding_files(plan).values())
    if plan.config["probes"]:
        targets += [str(plan.results.claims_md), str(plan.results.claims_json)]
    return targets


def compare_log(config: dict) -> Path:
    return results.compare_dir(config["results_dir"]) / "compare.log"
