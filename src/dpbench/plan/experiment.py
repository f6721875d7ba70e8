"""The experiment config and its plan: experiments/<name>.yaml merged with what the user gave,
coerced to the schema's types, validated with its defaults filled in, and planned.

Nothing here imports torch, seaborn or matplotlib: planning (`snakemake -n`, every job of a
cluster executor, a login node) stays fast and needs none of them.
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from dpbench.plan import environments as envs
from dpbench.plan.config import schema
from dpbench.plan.matrix import Plan, plan_gpus
from dpbench.plan.tags import tag_problem
from dpbench.workloads.registry import typed_args, yaml_scalars

SCHEMA = "experiments/schema.yaml"   # where a user reads the keys (the package ships the same file)
# The working forms of command-line values, shown when one does not validate.
CLI_FORMS = "--config repeats=1 gpus=[1,2] tag=quick 'train={max_steps: 3, dataset: synthetic}'"


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


# -- the schema, walked: command-line strings to the schema's types, unknown keys named ------

def _resolve(spec: dict) -> dict:
    ref = spec.get("$ref")
    if ref:
        node: Any = schema()
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        return {**node, **{k: v for k, v in spec.items() if k != "$ref"}}
    return spec


_INT, _FLOAT = re.compile(r"[+-]?\d+"), re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?inf|nan")


def _from_text(text: str, types: list[str]) -> Any:
    """A command-line string as the first schema type it reads as; unchanged if none."""
    word = text.strip()
    if "null" in types and word.lower() in ("null", "none", "~", ""):
        return None
    if "boolean" in types and word.lower() in ("true", "false"):
        return word.lower() == "true"
    if "integer" in types and _INT.fullmatch(word):
        return int(word)
    if "number" in types and _FLOAT.fullmatch(word.lower()):
        return int(word) if _INT.fullmatch(word) else float(word)
    return text


def coerce(value: Any, spec: dict | None = None) -> Any:
    """`value` with every string the schema wants as a number, boolean, null or list item
    converted. Snakemake passes `gpus=[1,2]`'s items and the numbers inside `train={...}` as
    strings; YAML files are typed already and pass through unchanged. A workload's args (a
    `workload`'s, and cpu_plan.workload_args'), which the schema leaves to the factory, have
    their strings read as YAML scalars (registry.typed_args), so `args: {width: 64}` reaches the factory
    as 64 from the command line as from a file."""
    spec = _resolve(spec if spec is not None else schema())
    if isinstance(value, dict):
        props = spec.get("properties", {})
        out = {k: coerce(v, props[k]) if k in props else v for k, v in value.items()}
        if "workload" in props and "workload" in out:
            out["workload"] = typed_args(out["workload"])
        if "workload_args" in props and isinstance(out.get("workload_args"), dict):
            out["workload_args"] = {k: yaml_scalars(v) for k, v in out["workload_args"].items()}
        return out
    if isinstance(value, list) and "items" in spec:
        return [coerce(v, spec["items"]) for v in value]
    if isinstance(value, str):
        types = spec.get("type", [])
        types = [types] if isinstance(types, str) else list(types)
        if "enum" in spec:
            if value in spec["enum"]:
                return value
            types = sorted({type(e).__name__.replace("int", "integer").replace("bool", "boolean")
                            for e in spec["enum"] if not isinstance(e, str)})
        if types and "string" not in types:
            return _from_text(value, types)
    return value


def unknown_keys(value: Any, spec: dict | None = None, where: str = "") -> list[tuple[str, str, list[str]]]:
    """(where, key, known keys) for each key that an object of the schema does not allow."""
    spec = _resolve(spec if spec is not None else schema())
    found = []
    if isinstance(value, dict) and "properties" in spec:
        props = spec["properties"]
        for key, item in value.items():
            if key in props:
                found += unknown_keys(item, props[key], f"{where}{key}.")
            elif spec.get("additionalProperties") is False:
                found.append((where.rstrip(".") or "top level", key, sorted(props)))
    elif isinstance(value, list) and "items" in spec:
        for i, item in enumerate(value):
            found += unknown_keys(item, spec["items"], f"{where.rstrip('.')}[{i}].")
    return found


def _typo_message(unknown: list[tuple[str, str, list[str]]]) -> str:
    lines = []
    for where, key, known in unknown:
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        lines.append(f"unknown config key {key!r} ({where}){hint}")
    lines.append(f"Keys, allowed values and defaults: {SCHEMA}")
    return "\n".join(lines)


def _validation_message(merged: dict) -> str | None:
    """The first schema violation in two lines (the key, the problem, the working form), or None."""
    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(merged))
    if error is None:
        return None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return (f"config key {path or '(top level)'}: {error.message}\n"
            f"Allowed values: {SCHEMA}; on the command line: {CLI_FORMS}")


def fill_defaults(value: dict, spec: dict | None = None) -> dict:
    """`value` with the schema's defaults filled in for the keys it leaves out. A `$ref` is not
    followed: the `train` options' defaults are a run's (RunConfig applies them), and filled in
    here they would become options of every group and name its runs."""
    spec = spec if spec is not None else schema()
    for key, sub in spec.get("properties", {}).items():
        if key not in value and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if isinstance(value.get(key), dict) and "$ref" not in sub:
            fill_defaults(value[key], sub)
    return value


def load_experiment(config: dict, basedir: str | Path) -> dict:
    """experiments/<experiment>.yaml, overridden by what the user gave (config file, --config),
    coerced to the schema's types and validated against it with its defaults filled in. Train
    keys and repeats the user gave (config files, --config) are not the CPU plan's to replace."""
    config = coerce(config)
    unknown = unknown_keys(config)
    if unknown:   # first and short: before a validator dumps the schema
        raise ConfigError(_typo_message(unknown))
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
    unknown = unknown_keys(merged)
    if unknown:
        raise ConfigError(_typo_message(unknown) + f" (in {path.name})")
    problem = tag_problem(merged.get("tag"))
    if problem:   # before the schema's pattern, which would only show the regular expression
        raise ConfigError(problem)
    problem = _validation_message(merged)
    if problem:
        raise ConfigError(problem)
    fill_defaults(merged)
    merged["environments"] = paired_environments(merged)
    if config.get("train"):   # what the user asked for by name is not the CPU plan's to replace
        merged["cpu_plan"]["train"] = {k: v for k, v in merged["cpu_plan"]["train"].items()
                                       if k not in config["train"]}
    if "repeats" in config and "repeats" not in config.get("cpu_plan", {}):
        merged["cpu_plan"]["repeats"] = config["repeats"]
    return merged


def paired_environments(config: dict) -> dict[str, str]:
    """`environments`, with the `base`/`cand` shorthands of the command line folded in; a
    paired launch needs two or more."""
    found = dict(config.get("environments") or {})
    found.update({k: config.pop(k) for k in ("base", "cand") if config.get(k)})
    if len(found) == 1:
        (name, python), = found.items()
        raise ConfigError(f"environments: only {name}={python}; a paired launch compares two or more, "
                          f"e.g. --config base=/venv-a/bin/python cand=/venv-b/bin/python")
    return found


def make_plan(config: dict, given: dict | None = None) -> Plan:
    """The plan of a loaded experiment; `given`: the config as the user gave it (plan.json keeps
    it). A paired launch's environments are checked here, before anything trains."""
    plan = Plan(config, plan_gpus(config), None if given is None else coerce(copy.deepcopy(given)))
    try:
        plan.runs
        plan.environment_versions
        tag = plan.tag
    except envs.EnvironmentProblem as exc:
        raise ConfigError(str(exc)) from None
    except ValueError as exc:   # an impossible combination (e.g. batchnorm=sync with dp)
        raise ConfigError(f"experiment {config['experiment']!r}: {exc}") from None
    problem = tag_problem(tag)
    if problem:   # a tag made from the experiment's name
        raise ConfigError(f"{problem}; set one with --config tag=<name>")
    return plan


def plan_of_file(path: Path | str, **overrides: Any) -> dict:
    """plan.json's document for a complete experiment kept outside experiments/ (an archived
    one), planned with `overrides` (tag, gpus_available) as the plan rule would plan it."""
    config = {**yaml.safe_load(Path(path).read_text()), **overrides}
    return make_plan(load_experiment(config, Path(path).parent)).document()
