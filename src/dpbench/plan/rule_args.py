"""The arguments the Snakefile's rules pass to their commands: the result set's tag, a run's
environment fingerprint, and the compare CLI's flags from the config."""
from __future__ import annotations

import shlex

from dpbench.plan.experiment import ConfigError
from dpbench.plan.matrix import Plan
from dpbench.plan.tags import tag_problem

def tag_args(plan: Plan) -> str:
    """`--results-dir R --tag T` of the plan's result set, quoted: what every rule's command that
    works on the set is told (from the plan, never read back out of a path)."""
    rs = plan.results
    return f"--results-dir {shlex.quote(str(rs.root))} --tag {shlex.quote(rs.tag)}"


def run_fingerprint(plan: Plan, run_id: str, fingerprint: str) -> str:
    """environment_fingerprint for one run: a paired run's torch is its environment's."""
    name = plan.run(run_id).environment
    if name is None:
        return fingerprint
    return f"{fingerprint} {name}={plan.environments[name]} torch={plan.environment_versions[name]}"


def compare_args(config: dict, tag: str) -> str:
    """The compare CLI's arguments from `--config baseline=... candidate=...` (or `paired=TAG`)
    and `compare:`."""
    baseline = config.get("baseline")
    if config.get("paired"):   # one paired launch: its environments compared within it
        problem = tag_problem(config["paired"], "paired")
        if problem:
            raise ConfigError(problem)
        args = ["--results-dir", config["results_dir"], "--paired", config["paired"]]
        return " ".join(shlex.quote(str(a)) for a in args + _compare_flags(dict(config["compare"])))
    if not baseline:
        raise ConfigError("compare needs a baseline: snakemake --cores 1 compare --config baseline=<tag> "
                          "[candidate=<tag>], or paired=<tag> (tags are the folders under results/)")
    for key in ("baseline", "candidate"):
        problem = tag_problem(config.get(key), key)
        if problem:
            raise ConfigError(problem)
    args = ["--results-dir", config["results_dir"], "--baseline", baseline,
            "--candidate", config.get("candidate") or tag]
    return " ".join(shlex.quote(str(a)) for a in args + _compare_flags(dict(config["compare"])))


def _compare_flags(c: dict) -> list[str]:
    """The compare CLI's flags from the schema's `compare:` block."""
    args: list[str] = []
    if c.pop("fail_on_regression", False):
        args.append("--fail-on-regression")
    if c.get("fail_on"):
        args += ["--fail-on", ",".join(c["fail_on"])]
    c.pop("fail_on", None)
    if c.get("noise_from"):
        args += ["--noise-from", ",".join(c["noise_from"])]
    c.pop("noise_from", None)
    # Every other key of the schema's compare block is a threshold flag of the same name.
    for key, value in sorted(c.items()):
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args
