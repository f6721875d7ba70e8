"""What the Snakefile needs, kept out of it so it can be tested: the experiment config
(merged, coerced and validated), the plan, and the files each rule reads and writes.

Nothing here imports torch, seaborn or matplotlib: planning (`snakemake -n`, every job of a
cluster executor, a login node) stays fast and needs none of them.
"""
from __future__ import annotations

import copy
import difflib
import os
import re
import shlex
import signal
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from dpbench import SHARDED_VARIANTS, results
from dpbench.host import PIPELINE_PID_ENV
from dpbench.plan import environments as envs
from dpbench.plan.config import schema
from dpbench.plan.matrix import Plan, environment_fingerprint, plan_gpus
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
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(merged))
    if error is None:
        return None
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
    return (f"config key {path or '(top level)'}: {error.message}\n"
            f"Allowed values: {SCHEMA}; on the command line: {CLI_FORMS}")


TAG_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._+-")
TAG_MAX = 100   # one folder's name, with room under the file system's 255 for what dpbench adds
TAG_RULE = f"letters, digits and ._+- only, at most {TAG_MAX} characters, no leading '.' and no '..'"


def tag_problem(tag: Any, key: str = "tag") -> str | None:
    """Why `tag` is not a result set's name (one folder under results_dir), or None. A tag is
    letters, digits and `._+-` (it reaches file names, logs and the rules' command lines), at
    most TAG_MAX characters; a leading dot would hide it, '..' would leave results_dir."""
    if not isinstance(tag, str) or tag == "":
        return None   # not a string: the schema says so; empty: the default tag
    bad_char = next((c for c in tag if c not in TAG_CHARS), None)
    bad = (f"{len(tag)} characters" if len(tag) > TAG_MAX
           else "a path separator" if bad_char in ("/", "\\")
           else "white space" if bad_char is not None and bad_char.isspace()
           else f"the character {bad_char!r}" if bad_char is not None
           else "'..'" if ".." in tag else "a leading '.'" if tag.startswith(".") else None)
    if bad is None:
        return None
    shown = tag if len(tag) <= 40 else tag[:37] + "..."
    return (f"config key {key}: {shown!r} has {bad}; a tag is one folder's name under results_dir: "
            f"{TAG_RULE} (e.g. {key}=quick or {key}=torch-2.14.1)")


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


def name_the_pipeline() -> None:
    """Tell every run this process starts which process is the pipeline: its watchdog
    (dpbench.run.watchdog) stops the run when that process is gone."""
    os.environ[PIPELINE_PID_ENV] = str(os.getpid())


LAUNCHER = "dpbench.run.launch"   # a run's launcher names its module in its command line


def _children() -> dict[int, list[int]]:
    """Each live process's children, from /proc (empty where there is no /proc)."""
    kids: dict[int, list[int]] = {}
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
            ppid = int(text[text.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def launchers_below(root: int) -> list[int]:
    """The run launchers started below `root` (through its job shells): the top launcher of
    each run, not the ranks under its torchrun (the launcher stops those)."""
    kids, found, todo = _children(), [], [root]
    while todo:
        for pid in kids.get(todo.pop(), []):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"-m {LAUNCHER} " in f"{cmd} ":
                found.append(pid)   # its torchrun and ranks are its own to stop
            else:
                todo.append(pid)
    return found


def stop_runs_on_interrupt() -> None:
    """SIGINT to Snakemake (Ctrl-C, `kill -INT`) stops the running trainings within seconds.

    Snakemake's own SIGINT handling ("Terminating processes on user request") only waits for
    its running jobs: a SIGINT sent to Snakemake's pid alone (not to the terminal's whole
    process group, as Ctrl-C does) left a training running to its last step. This handler
    passes the SIGINT on to every run launcher below this process (each stops its torchrun and
    ranks and writes a failed record, "stopped by SIGINT") and then lets Snakemake handle it as
    before (KeyboardInterrupt). Installed from the Snakefile, in its main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGINT)
    if getattr(previous, "dpbench_stops_runs", False):
        return

    def interrupt(signum, frame):
        for pid in launchers_below(os.getpid()):
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    interrupt.dpbench_stops_runs = True   # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, interrupt)


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


# -- one pipeline per result set -------------------------------------------------------------

PIPELINE_LOCK = ".pipeline.lock"
_HELD: dict[str, int] = {}   # lock file -> its open descriptor, held for the life of the process
# Targets that write nothing into the pipeline's own result set: no lock (compare writes under
# results/compare/ and only reads the sets).
LOCK_FREE_TARGETS = frozenset({"compare"})


class PipelineBusy(ConfigError):
    """Another pipeline holds the result set: its runs would train twice at once, timed together."""


def needs_pipeline_lock(targets: Any) -> bool:
    """Whether a Snakemake run of `targets` (empty: the default target) writes into the result set."""
    return not targets or not set(targets) <= LOCK_FREE_TARGETS


def hold_pipeline_lock(set_dir: Path | str, tag: str) -> Path:
    """Takes results/<tag>/.pipeline.lock (a non-blocking flock) for the life of this process, or
    raises PipelineBusy naming the tag and the holder's pid. The kernel lets it go when the
    process ends, however it ends (kill -9 included): no stale lock to remove. The descriptor is
    not inherited by the jobs (Python opens it close-on-exec). Taken again in one process: kept."""
    import fcntl

    path = Path(set_dir) / PIPELINE_LOCK
    if str(path) in _HELD:
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"result set {tag!r}: cannot open {path} ({exc.strerror}); "
                          f"choose a writable results_dir or another tag") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = ""
        for _ in range(20):   # the holder writes its pid just after it locks: a bounded wait
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if holder:
                break
            time.sleep(0.05)
        os.close(fd)
        raise PipelineBusy(f"result set {tag!r} is in use by another pipeline (pid {holder or 'unknown'}, "
                           f"{path}): wait for it, stop it (kill {holder or '<pid>'}), or use "
                           f"--config tag=<another>") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[str(path)] = fd
    return path


def pipeline_alive(set_dir: Path | str) -> bool:
    """Whether a live pipeline holds results/<tag>/.pipeline.lock (see `hold_pipeline_lock`):
    the kernel lets the lock go when its holder dies, however it dies."""
    import fcntl

    path = Path(set_dir) / PIPELINE_LOCK
    if str(path) in _HELD:
        return True
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False   # no lock file: no pipeline ever got as far as taking it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _set_dir_of(path: str, results_dir: Path) -> Path | None:
    """results_dir/<tag> for a file under it (None: elsewhere)."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(Path(os.path.abspath(results_dir)))
    except ValueError:
        return None
    return Path(results_dir) / rel.parts[0] if len(rel.parts) >= 2 and rel.parts[0] != "compare" else None


def clear_stale_snakemake_locks(results_dir: Path | str, workdir: Path | str = ".") -> list[Path]:
    """Removes the lock files a killed Snakemake left in <workdir>/.snakemake/locks (its default
    file backend) when every file a lock names lies in a result set that no live pipeline holds
    (`pipeline_alive`): after `kill -9` of a pipeline, the same command with
    `--rerun-incomplete` runs instead of stopping at Snakemake's LockException. A lock naming
    any other file (another workflow's, a compare's) is left for `snakemake --unlock`.
    Returns the lock files removed."""
    lockdir = Path(workdir) / ".snakemake" / "locks"
    removed = []
    for lock in sorted(lockdir.glob("*.*put.lock")) if lockdir.is_dir() else []:
        try:
            files = [line.strip() for line in lock.read_text().splitlines() if line.strip()]
        except OSError:
            continue
        sets = {_set_dir_of(f, Path(results_dir)) for f in files}
        if not files or None in sets or any(pipeline_alive(d) for d in sets):
            continue
        try:
            lock.unlink()
        except OSError:
            continue
        removed.append(lock)
    return removed


def _config_word(key: str, value: Any) -> str:
    """One `--config` entry as Snakemake reads it back: scalars bare, lists and mappings as
    YAML flow (JSON), which `coerce` types again by the schema."""
    import json

    if isinstance(value, (dict, list)):
        return f"{key}={json.dumps(value, sort_keys=True)}"
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    return f"{key}={'' if value is None else value}"


def set_config_args(set_dir: Path | str) -> list[str] | None:
    """`--config` and the entries that plan the result set in `set_dir` again, from its plan.json
    (what was given, its experiment and its tag pinned: a default tag names another torch once
    torch is upgraded); None where plan.json is missing, unreadable or predates `given`."""
    import json

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


def run_outcomes(plan: Plan) -> dict[str, Any]:
    """What the plan's runs came to, from their records: counts per status (`not run` where no
    record is there) and, per status, (reason, count) from the commonest down."""
    from collections import Counter

    counts: Counter = Counter()
    reasons: dict[str, Counter] = {}
    for run_id in plan.runs:
        try:
            rec = results.read_metrics(plan.results.run_dir(run_id))
        except (OSError, ValueError):
            rec = {"status": results.STATUS_FAILED, "reason": "its metrics.json cannot be read"}
        status = rec.get("status", "?") if isinstance(rec, dict) else "not run"
        counts[status] += 1
        if isinstance(rec, dict) and status != results.STATUS_OK:
            reason = str(rec.get("reason") or "no reason recorded").strip().splitlines()
            line = reason[0] if reason else "no reason recorded"
            reasons.setdefault(status, Counter())[line if len(line) <= 160 else line[:157] + "..."] += 1
    return {"counts": dict(counts), "reasons": {k: v.most_common() for k, v in reasons.items()}}


def outcome_lines(plan: Plan, top: int = 3) -> list[str]:
    """The pipeline's last words: how many runs are ok, failed, skipped (and not run), with the
    commonest reasons, and where the rest is written."""
    out = run_outcomes(plan)
    counts = out["counts"]
    order = [results.STATUS_OK, results.STATUS_FAILED, results.STATUS_SKIPPED, "not run"]
    parts = [f"{counts.get(k, 0)} {k}" for k in order if counts.get(k) or k != "not run"]
    parts += [f"{n} {k}" for k, n in counts.items() if k not in order]
    lines = [f"dpbench: {len(plan.runs)} runs in {plan.results.dir}: {', '.join(parts)}"]
    for status in (results.STATUS_FAILED, results.STATUS_SKIPPED):
        for reason, n in out["reasons"].get(status, [])[:top]:
            lines.append(f"dpbench:   {status} ({n}): {reason}")
        rest = len(out["reasons"].get(status, [])) - top
        if rest > 0:
            lines.append(f"dpbench:   {status}: {rest} other reason(s)")
    if counts.get(results.STATUS_FAILED) or counts.get(results.STATUS_SKIPPED):
        lines.append(f"dpbench: every run and its reason: {plan.results.summary_md}")
    return lines


def report_outcomes(plan: Plan, targets: Any, succeeded: bool) -> int:
    """Prints `outcome_lines` (Snakemake's onsuccess and onerror) where the pipeline made or
    needs runs of this set; returns the exit status the pipeline should end with: 1 when
    `fail_on_failed_runs` is set and a run failed, else 0."""
    import sys

    if not needs_pipeline_lock(targets):   # compare: no runs of this set
        return 0
    try:
        lines = outcome_lines(plan)
        failed = run_outcomes(plan)["counts"].get(results.STATUS_FAILED, 0)
    except OSError as exc:
        print(f"dpbench: cannot count the runs of {plan.results.dir} ({exc})", file=sys.stderr)
        return 0
    if plan.config.get("fail_on_failed_runs") and failed:
        lines.append(f"dpbench: {failed} run(s) failed and fail_on_failed_runs is set: the pipeline fails"
                     + ("" if succeeded else " (it failed anyway)"))
    print("\n".join(lines), file=sys.stderr, flush=True)
    return 1 if plan.config.get("fail_on_failed_runs") and failed else 0


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


def compare_log(config: dict) -> Path:
    return results.compare_dir(config["results_dir"]) / "compare.log"


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


__all__ = ["ConfigError", "PipelineBusy", "hold_pipeline_lock", "needs_pipeline_lock", "load_experiment",
           "tag_problem", "coerce", "unknown_keys", "make_plan", "table_files", "figure_files",
           "claim_figure_files", "probe_files", "perf_target_files", "final_targets", "tag_args", "compare_args",
           "environment_fingerprint", "run_fingerprint", "paired_environments"]
