"""`dpbench bisect`: which environment of an ordered list (installs of successive PyTorch releases
or nightlies) first made the watched cells slower, with a per-step false-alarm rate fixed in
advance, and where the step's time went in it.

    dpbench bisect /venvs/2.9/bin/python /venvs/2.10/bin/python ... /venvs/2.14/bin/python \\
        [--envs-file FILE] [--name NAME] [--experiment upgrade] [--variants single,ddp] [--gpus 1] \\
        [--good 0] [--bad -1] [--repeats 3] [--alpha 0.01] [--margin 0.01] [--config KEY=VALUE]...

Every environment is checked first (a bounded `PY -c "import torch, dpbench"`, as a paired
launch checks its own): one that cannot run stops the bisection with one line naming it, exit 2.
Each step is one paired launch of the experiment (Snakemake, `environments={last good, midpoint}`,
the watched variants and GPU counts, tag `bisect-<name>-<base>-<cand>`) judged within the launch
(analysis.bisect.search: the rule printed at the top of the report, fixed before the first step).
A launch already finished is not run again, so a bisection stopped half way resumes where it was.
Then one profiled step of the flagged cell in the last good and the first bad environment (all of
them with --profile all): forward, backward, optimizer, exposed communication, and the kernels
that moved. Output: <results-dir>/bisect/<name>/report.md and report.json.

Exit status: 0 the bisection ran (found, none, or inconclusive: the report says which); 2 an
environment cannot run, a launch failed, or an input is wrong (one line, no traceback).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpbench import DISTRIBUTED_VARIANTS
from dpbench import results as R
from dpbench.analysis.bisect import profile as where
from dpbench.analysis.bisect import search
from dpbench.analysis.compare import one_launch
from dpbench.analysis.compare.loading import InputError
from dpbench.plan import environments as envs
from dpbench.report import bisect_report
from dpbench.results.files import write_atomic

NAME = re.compile(r"^[A-Za-z0-9_]+$")
PROVENANCE_KEYS = ("torch", "torch_git", "cuda", "cudnn", "nccl", "triton", "driver", "python")
PROFILE_TIMEOUT_S = 600
_FACTS = """
import json, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out.update(torch=torch.__version__, torch_git=torch.version.git_version, cuda=torch.version.cuda)
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn"] = None
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() else None
    except Exception:
        out["nccl"] = None
except Exception:
    pass
try:
    import triton
    out["triton"] = triton.__version__
except Exception:
    out["triton"] = None
print(json.dumps(out))
"""


class BisectError(ValueError):
    """One line: what stopped the bisection, and the way out."""


@dataclass
class Env:
    name: str
    python: str


def parse_envs(items: list[str], envs_file: Path | None) -> list[Env]:
    """Environments from the command line and/or a file (one a line: `PYTHON` or `NAME PYTHON`,
    `NAME=PYTHON` on the command line; # comments), in order; unnamed ones are e0, e1, ..."""
    given: list[tuple[str | None, str]] = []
    if envs_file is not None:
        try:
            lines = envs_file.read_text().splitlines()
        except OSError as exc:
            raise BisectError(f"--envs-file {envs_file}: {exc.strerror}") from None
        for line in lines:
            parts = line.split("#", 1)[0].split()
            if len(parts) == 1:
                given.append((None, parts[0]))
            elif len(parts) == 2:
                given.append((parts[0], parts[1]))
            elif parts:
                raise BisectError(f"--envs-file {envs_file}: {line.strip()!r} is neither PYTHON nor NAME PYTHON")
    for item in items:
        name, sep, python = item.partition("=")
        given.append((name, python) if sep and NAME.match(name) else (None, item))
    out = [Env(name or f"e{i}", str(python)) for i, (name, python) in enumerate(given)]
    for e in out:
        if not NAME.match(e.name):
            raise BisectError(f"environment name {e.name!r}: letters, digits and _ only (it goes into run ids)")
    names = [e.name for e in out]
    if len(set(names)) != len(names):
        raise BisectError(f"environment names repeat: {', '.join(n for n in names if names.count(n) > 1)}")
    if len(out) < 2:
        raise BisectError(f"{len(out)} environment(s): a bisection needs two or more, in order (good first)")
    return out


def position(text: str, env_list: list[Env]) -> int:
    """An end given as an index (negative from the end) or a name."""
    names = [e.name for e in env_list]
    if text in names:
        return names.index(text)
    try:
        i = int(text)
    except ValueError:
        raise BisectError(f"end {text!r}: no environment of that name ({', '.join(names)}) nor an index") from None
    if not -len(names) <= i < len(names):
        raise BisectError(f"end {i}: out of range for {len(names)} environments")
    return i % len(names)


def check_all(env_list: list[Env], src: str) -> dict[str, str]:
    """Every environment checked (in parallel): name -> torch version; the first problem, in the
    list's order, raises BisectError with its one line."""
    def one(e: Env):
        try:
            return envs.torch_version_of(e.name, e.python, src)
        except envs.EnvironmentProblem as exc:
            return exc
    with ThreadPoolExecutor(max_workers=min(8, len(env_list))) as pool:
        got = list(pool.map(one, env_list))
    for e, v in zip(env_list, got):
        if isinstance(v, Exception):
            raise BisectError(str(v))
    return {e.name: v for e, v in zip(env_list, got)}


def install_facts(python: str, src: str) -> dict[str, Any]:
    """torch (and its git version), CUDA, cuDNN, NCCL, Triton and python as the install reports them."""
    try:
        done = subprocess.run([python, "-c", _FACTS], capture_output=True, text=True, env=envs.run_env(src),
                              timeout=envs.CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL)
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def step_tag(name: str, base: str, cand: str) -> str:
    return f"bisect-{name}-{base}-{cand}"


def launch(args, workflow: Path, tag: str, pair: dict[str, str], log: Path) -> None:
    """One paired launch of the two environments' watched cells (its tables, provenance and
    plan); BisectError naming its log when Snakemake fails."""
    rs = R.ResultSet(workflow / args.results_dir, tag)
    targets = [str(Path(p).relative_to(workflow)) for p in
               [*rs.table_paths().values(), rs.provenance_path, rs.plan_path]]
    config = [f"experiment={args.experiment}", f"environments={json.dumps(pair)}", f"tag={tag}",
              f"results_dir={args.results_dir}"]
    config += [f"variants={json.dumps(args.variants)}"] if args.variants else []
    config += [f"gpus={json.dumps(args.gpus)}"] if args.gpus else []
    config += [f"repeats={args.repeats}"] if args.repeats else []
    cmd = [sys.executable, "-m", "snakemake", "--cores", str(args.cores), "--config", *config, *args.config,
           "--", *targets]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write(f"$ {shlex.join(cmd)}\n")
        out.flush()
        code = subprocess.run(cmd, cwd=workflow, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode
    if code != 0:
        raise BisectError(f"the paired launch {tag} failed (snakemake exit {code}); see {log}")


def _cell_of(options: str) -> str:
    return ",".join(i for i in str(options).split(",") if i and not i.startswith("environment="))


def step_logs(rs: dict, base: str, cand: str) -> dict[tuple, tuple[list[float], list[float]]]:
    """cell -> (base's, cand's) log samples/s over the cells the launch ran (skipped ones left out)."""
    summary = rs["tables"]["summary"]
    cells = sorted({(str(v), int(g), _cell_of(o)) for v, g, o, s in
                    zip(summary["variant"], summary["gpus"], summary["options"], summary["status"])
                    if s != R.STATUS_SKIPPED})
    frame = one_launch.samples(rs, base, cand)
    logs = {}
    for cell in cells:
        mine = frame[frame["cell"] == cell]
        logs[cell] = tuple([math.log(v) for v in mine.loc[mine["environment"] == e, "samples_per_s"]]
                           for e in (base, cand))
    return logs


def judge_step(results_dir: Path, tag: str, base: str, cand: str, rule: search.Rule):
    """(the step's judgement, its loaded set)."""
    rs = one_launch.load_paired(results_dir, tag)
    logs = step_logs(rs, base, cand)
    if not logs:
        raise BisectError(f"the paired launch {tag} ran no cell of {base} and {cand} (all skipped?); "
                          f"see {R.ResultSet(results_dir, tag).dir}")
    return search.judge_logs(logs, rule), rs


def run_config(rs: dict, cell: tuple, env: str) -> dict | None:
    """A planned run's config of `cell` for environment `env` (plan.json), without the environment."""
    for cfg in (rs.get("plan") or {}).get("runs", {}).values():
        options = {k: v for k, v in (cfg.get("options") or {}).items() if k != "environment"}
        if (cfg["variant"], int(cfg["gpus"]), R.options_label(options)) == tuple(cell) and \
                cfg.get("environment") == env:
            return {**cfg, "options": options, "environment": None}
    return None


def profile_step(e: Env, cfg: dict, out: Path, src: str, log: Path) -> dict | None:
    """One profiled step of `cfg` by the environment's python (torchrun for distributed
    variants); None, with the reason in its log, when it fails."""
    tail = ["-m", "dpbench.run.step_breakdown", "--config", json.dumps(cfg), "--out", str(out)]
    cmd = [e.python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
           f"--nproc-per-node={cfg['gpus']}", *tail] if cfg["variant"] in DISTRIBUTED_VARIANTS else [e.python, *tail]
    try:
        with log.open("w") as f:
            f.write(f"$ {shlex.join(cmd)}\n")
            f.flush()
            subprocess.run(cmd, env=envs.run_env(src), stdout=f, stderr=subprocess.STDOUT, timeout=PROFILE_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        return json.loads(out.read_text())
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def flagged_cell(result: search.BisectResult) -> tuple | None:
    """The cell the step that saw the first bad slower found slowed most."""
    for step in reversed(result.steps):
        if step.cand == result.first_bad and step.judgement.verdict == search.BAD:
            slower = [c for c in step.judgement.cells if c.verdict == search.SLOWER]
            return tuple(min(slower, key=lambda c: c.change).cell) if slower else None
    return None


def provenance_of(rs: dict, name: str) -> dict[str, Any]:
    prov = one_launch.side(rs, name)["provenance"] or {}
    return {k: prov.get(k) for k in PROVENANCE_KEYS if prov.get(k) is not None}


def provenance_diff(good: dict, bad: dict) -> list[dict[str, Any]]:
    """Each provenance key with both sides' values, and whether they differ."""
    return [{"key": k, "good": good.get(k), "bad": bad.get(k), "differs": good.get(k) != bad.get(k)}
            for k in PROVENANCE_KEYS if good.get(k) is not None or bad.get(k) is not None]


def bisect(args) -> dict[str, Any]:
    started = time.monotonic()
    workflow = Path(args.workflow).resolve()
    if not (workflow / "Snakefile").is_file():
        raise BisectError(f"no Snakefile in {workflow}: run from the repository's root or give --workflow DIR")
    src = str(workflow / "src")
    env_list = parse_envs(args.environments, args.envs_file)
    good, bad = position(args.good, env_list), position(args.bad, env_list)
    if not good < bad:
        raise BisectError(f"good end {env_list[good].name} must come before bad end {env_list[bad].name}")
    rule = search.Rule(alpha=args.alpha, margin=args.margin)   # fixed here, before any step
    versions = check_all(env_list, src)
    results_dir = workflow / args.results_dir
    out_dir = results_dir / "bisect" / args.name
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"dpbench bisect: {len(env_list)} environments checked; rule: alpha {rule.alpha} a step, "
          f"margin {rule.margin:.2%}; good {env_list[good].name}, bad {env_list[bad].name}", file=sys.stderr)
    steps_doc, loaded, provenance = [], {}, {}

    def judge(i: int, j: int) -> search.StepJudgement:
        b, c = env_list[i], env_list[j]
        tag = step_tag(args.name, b.name, c.name)
        t0 = time.monotonic()
        launch(args, workflow, tag, {b.name: b.python, c.name: c.python}, out_dir / f"step{len(steps_doc) + 1}.log")
        try:
            j_, rs = judge_step(results_dir, tag, b.name, c.name, rule)
        except InputError as exc:
            raise BisectError(f"step {len(steps_doc) + 1} ({tag}): {exc}") from None
        loaded[tag] = rs
        for e in (b, c):
            provenance.setdefault(e.name, provenance_of(rs, e.name))
        steps_doc.append({"tag": tag, "seconds": round(time.monotonic() - t0, 1)})
        seen = "; ".join(f"{c_.cell[0]} g{c_.cell[1]} {_pct(c_.change)} (smallest detectable "
                         f"{_pct(c_.smallest_detectable, False)}): {c_.verdict}" for c_ in j_.cells)
        print(f"dpbench bisect: step {len(steps_doc)}: {b.name} vs {c.name}: {j_.verdict} ({seen})", file=sys.stderr)
        return j_

    result = search.bisect(len(env_list), judge, good, bad)
    doc: dict[str, Any] = {
        "name": args.name, "experiment": args.experiment, "variants": args.variants, "gpus": args.gpus,
        "repeats": args.repeats, "rule": asdict(rule),
        "environments": [{"index": i, "name": e.name, "python": e.python, "torch": versions[e.name]}
                         for i, e in enumerate(env_list)],
        "good": good, "bad": bad,
        "result": {"status": result.status, "first_bad": result.first_bad, "last_good": result.last_good,
                   "open_range": list(result.open_range) if result.open_range else None},
        "steps": [{"number": s.number, "base": s.base, "cand": s.cand, **steps_doc[s.number - 1],
                   **s.judgement.to_dict()} for s in result.steps],
    }
    if result.status == "found":
        lg, fb = env_list[result.last_good], env_list[result.first_bad]
        facts = {e.name: install_facts(e.python, src) for e in (lg, fb)}
        merged = {e.name: {**facts[e.name], **provenance.get(e.name, {})} for e in (lg, fb)}
        doc["provenance"] = provenance_diff(merged[lg.name], merged[fb.name])
        cell = flagged_cell(result)
        if cell is not None and args.profile != "none":
            doc["where_the_time_went"] = profile_cell(args, env_list, result, cell, loaded, out_dir, src)
    doc["seconds"] = round(time.monotonic() - started, 1)
    return doc


def profile_cell(args, env_list: list[Env], result: search.BisectResult, cell: tuple, loaded: dict,
                 out_dir: Path, src: str) -> dict[str, Any]:
    """One profiled step of the flagged cell in the last good and first bad environments (all
    with --profile all), configured as the launches ran it."""
    lg, fb = env_list[result.last_good], env_list[result.first_bad]
    cfg = next((c for rs in loaded.values() for c in [run_config(rs, cell, fb.name)] if c), None)
    if cfg is None:
        return {"cell": list(cell), "error": "no planned run of the cell to profile"}
    chosen = env_list if args.profile == "all" else [lg, fb]
    profiles = {}
    for e in chosen:
        got = profile_step(e, {**cfg, "environment": None}, out_dir / f"profile-{e.name}.json", src,
                           out_dir / f"profile-{e.name}.log")
        if got is not None:
            profiles[e.name] = got
    section = where.where_the_time_went(profiles, [e.name for e in chosen], lg.name, fb.name, list(cell))
    missing = [e.name for e in chosen if e.name not in profiles]
    if missing:
        section["error"] = f"no profile from {', '.join(missing)} (see {out_dir}/profile-<name>.log)"
    return section


def _pct(v: float | None, sign: bool = True) -> str:
    return "–" if v is None else (f"{100 * v:+.2f}%" if sign else f"{100 * v:.2f}%")


def _list(text: str, kind=str) -> list:
    return [kind(x.strip()) for x in text.split(",") if x.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="Exit status: 0 the bisection ran (its report says what it found); "
                                       "2 an environment cannot run, a launch failed or an input is wrong.")
    p.add_argument("environments", nargs="*", metavar="PYTHON",
                   help="the environments' pythons in order (good end first); NAME=PYTHON names one")
    p.add_argument("--envs-file", type=Path, help="a file listing them, one a line: PYTHON or NAME PYTHON")
    p.add_argument("--name", default="bisect", help="the report's folder: RESULTS_DIR/bisect/NAME")
    p.add_argument("--experiment", default="upgrade", help="the experiment each step launches (default: upgrade)")
    p.add_argument("--variants", type=_list, default=[], help="the variants to watch, e.g. single,ddp "
                   "(default: the experiment's)")
    p.add_argument("--gpus", type=lambda t: _list(t, int), default=[], help="the GPU counts to watch, e.g. 1,2")
    p.add_argument("--good", default="0", help="the good end: an index or a name (default: the first)")
    p.add_argument("--bad", default="-1", help="the bad end: an index or a name (default: the last)")
    p.add_argument("--repeats", type=int, help="runs a side in each step (default: the experiment's)")
    p.add_argument("--alpha", type=float, default=search.RULE.alpha,
                   help=f"a step's false-alarm rate, Holm over the cells (at most 0.01; default {search.RULE.alpha})")
    p.add_argument("--margin", type=float, default=search.RULE.margin,
                   help="a step is good when every cell is shown not slower by more than this "
                        f"(default {search.RULE.margin})")
    p.add_argument("--profile", choices=("ends", "all", "none"), default="ends",
                   help="profile the flagged cell in the last good and first bad environment (ends), "
                        "every environment, or none")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="a Snakemake --config item for every launch (e.g. 'train={max_steps: 100}'); repeatable")
    p.add_argument("--results-dir", default="results", help="relative to --workflow (default: results)")
    p.add_argument("--workflow", default=".", help="the folder of the Snakefile (default: .)")
    p.add_argument("--cores", default="all")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        doc = bisect(args)
    except (BisectError, ValueError) as exc:
        print(f"dpbench bisect: error: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.workflow) / args.results_dir / "bisect" / args.name
    md = bisect_report.markdown(doc)
    write_atomic(out_dir / "report.json", (json.dumps(doc, indent=1, default=str) + "\n").encode())
    write_atomic(out_dir / "report.md", md.encode())
    print(bisect_report.summary_line(doc))
    print(f"dpbench bisect: report {out_dir / 'report.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
