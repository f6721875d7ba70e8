"""The Snakemake command that makes a result set's files again with the set's own config, read
from its plan.json."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from dpbench import results

def _config_word(key: str, value: Any) -> str:
    """One `--config` entry as Snakemake reads it back: scalars bare, lists and mappings as
    YAML flow (JSON), which `coerce` types again by the schema."""
    if isinstance(value, (dict, list)):
        return f"{key}={json.dumps(value, sort_keys=True)}"
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    return f"{key}={'' if value is None else value}"


def set_config_args(set_dir: Path | str) -> list[str] | None:
    """`--config` and the entries that plan the result set in `set_dir` again, from its plan.json
    (what was given, its experiment and its tag pinned: a default tag names another torch once
    torch is upgraded); None where plan.json is missing, unreadable or predates `given`."""
    path = results.ResultSet.at(Path(set_dir)).plan_path
    try:
        doc = json.loads(path.read_text())
        given, experiment, tag = doc["given"], doc["experiment"], doc["tag"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(given, dict):
        return None
    config = {**given, "experiment": experiment, "tag": tag}
    results_dir = Path(set_dir).parent
    if str(results_dir) != str(config.get("results_dir", "results")):
        config["results_dir"] = str(results_dir)
    return ["--config", *(_config_word(k, v) for k, v in config.items())]


def rerun_command(set_dir: Path | str, *targets: str | Path, extra: tuple[str, ...] = ()) -> str:
    """The Snakemake command, shell-quoted, that makes `targets` of the result set in `set_dir`
    with the set's own experiment and config (see `set_config_args`). Without a readable
    plan.json: the command with its tag and a note that the set's other keys are needed."""
    words = ["snakemake", "--cores", "all", *map(str, targets), *extra]
    args = set_config_args(set_dir)
    if args is None:
        return (shlex.join([*words, "--config", f"tag={Path(set_dir).name}"])
                + " plus the experiment and --config keys that made the set (its plan.json is unreadable)")
    return shlex.join([*words, *args])
