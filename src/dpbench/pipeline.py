"""What the Snakefile needs, kept out of it so it can be tested: the experiment config
(merged and validated), the plan, and the files each rule reads and writes."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from . import results
from .plan import Plan, environment_fingerprint, plan_gpus

SCHEMA = "experiments/schema.yaml"
TABLE_NAMES = list(results.TABLES)


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is allowed."""


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_experiment(config: dict, basedir: str | Path) -> dict:
    """experiments/<experiment>.yaml, overridden by what the user gave (config file, --config),
    validated against the schema with its defaults filled in."""
    from snakemake.utils import validate

    name = config.get("experiment", "scaling")
    path = Path(basedir) / "experiments" / f"{name}.yaml"
    if path.exists():
        base = yaml.safe_load(path.read_text())
    elif "matrix" in config:   # a complete experiment given as a --configfile of its own
        base = {}
    else:
        known = sorted(p.stem for p in (Path(basedir) / "experiments").glob("*.yaml") if p.stem != "schema")
        raise ConfigError(f"experiment {name!r}: no file {path}; known experiments: {', '.join(known)} "
                          f"(or give a complete experiment with --configfile)")
    merged = deep_merge(base or {}, config)
    try:
        validate(merged, str(Path(basedir) / SCHEMA))
    except Exception as exc:   # Snakemake's message names the key; add where to look
        raise ConfigError(f"{exc}\nAllowed keys and values: {SCHEMA}") from None
    return merged


def make_plan(config: dict) -> Plan:
    plan = Plan(config, plan_gpus(config))
    try:
        plan.runs
    except ValueError as exc:   # an impossible combination (e.g. batchnorm=sync with dp)
        raise ConfigError(f"experiment {config['experiment']!r}: {exc}") from None
    return plan


def table_files(plan: Plan) -> dict[str, str]:
    return {name: str(results.table_path(plan.config["results_dir"], plan.tag, name))
            for name in TABLE_NAMES}


def figure_files(plan: Plan) -> dict[str, str]:
    from .plots import FIGURES
    fig_dir = results.figures_dir(plan.config["results_dir"], plan.tag)
    return {name: str(fig_dir / f"{name}.png") for name in FIGURES}


def claim_figure_files(plan: Plan) -> dict[str, str]:
    """The claims ledger's own figures (dpbench.claims.figures), drawn with claims.md."""
    from .claims.figures import DRAW, figure_name
    fig_dir = results.figures_dir(plan.config["results_dir"], plan.tag)
    return {cid: str(fig_dir / figure_name(cid)) for cid in DRAW}


def probe_files(plan: Plan) -> list[str]:
    return [f"{plan.base}/claims/{claim}.json" for claim in plan.config["probes"]]


def final_targets(plan: Plan) -> list[str]:
    targets = list(table_files(plan).values()) + list(figure_files(plan).values())
    targets += [f"{plan.base}/summary.md"]
    if plan.config["probes"]:
        targets += [f"{plan.base}/claims.md", f"{plan.base}/claims.json"]
    return targets


def tag_args(table_file: str) -> str:
    """`--results-dir R --tag T` for a file directly under R/T/ (a table, provenance.json)."""
    import shlex
    tag_dir = Path(table_file).parent
    return f"--results-dir {shlex.quote(str(tag_dir.parent))} --tag {shlex.quote(tag_dir.name)}"


def compare_args(config: dict, tag: str) -> str:
    """The compare CLI's arguments from `--config baseline=... candidate=...` and `compare:`."""
    import shlex
    baseline = config.get("baseline")
    if not baseline:
        raise ConfigError("compare needs a baseline: snakemake compare --config baseline=<tag> "
                          "[candidate=<tag>] (tags are the folders under results/)")
    c = dict(config["compare"])
    args = ["--results-dir", config["results_dir"], "--baseline", baseline,
            "--candidate", config.get("candidate") or tag]
    if c.pop("fail_on_regression", False):
        args.append("--fail-on-regression")
    if c.get("fail_on"):
        args += ["--fail-on", ",".join(c["fail_on"])]
    c.pop("fail_on", None)
    # Every other key of the schema's compare block is a threshold flag of the same name.
    for key, value in sorted(c.items()):
        args += [f"--{key.replace('_', '-')}", value]
    return " ".join(shlex.quote(str(a)) for a in args)


__all__ = ["ConfigError", "load_experiment", "make_plan", "table_files", "figure_files",
           "claim_figure_files", "probe_files", "final_targets", "tag_args", "compare_args",
           "environment_fingerprint"]
