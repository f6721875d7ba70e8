"""The experiment matrix: from a validated experiment config to one RunConfig per run id.

Groups in `matrix` expand to variants x gpus x repeats; `options` are per-group overrides that
also label the runs (with `train`'s workload where it is not the default: what trains names the
run). Options a variant ignores (plan.variants) and factories that are not there are
refused before anything runs. Without CUDA the CPU plan applies: its `train` settings (synthetic
data, a small step and evaluation budget) and `repeats` replace the experiment's, except keys the
user gave (pipeline.load_experiment keeps those) and a group's batch or step budget within
`keep_up_to`, and its `workload_args` are merged over the args of the workloads a group or `train`
names (a transformer trains at a CPU size); the same run ids are kept, what cannot run there is
recorded as skipped with its reason, and its timed runs take one `cpu_timing` slot each, so that
no two of them share the machine.

Which runs are skipped is `dpbench.plan.skips.skip_reason`, asked with the GPUs the plan is made for;
the launcher asks it again with the GPUs it sees, no more than the plan's (`--planned-gpus`).

Planning imports no torch: GPUs are counted through NVML and the tag comes from torch's
version file.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from dpbench import DISTRIBUTED_VARIANTS, VARIANTS, results
from dpbench.host.gpu_lease import pool
from dpbench.host.nvml import gpu_count, gpu_names
from dpbench.host.torch_facts import torch_version
from dpbench.plan import environments as envs
from dpbench.plan import variants as variant_registry
from dpbench.plan.config import RunConfig, factory_problem, train_schema
from dpbench.plan.skips import skip_reason
from dpbench.workloads.registry import DEFAULT as DEFAULT_WORKLOAD, resolve


def visible_gpus() -> int:
    """CUDA devices this process may use, counted through NVML (no torch, no CUDA context):
    CUDA_VISIBLE_DEVICES when set (a scheduler's grant), else every GPU the driver shows."""
    return len(pool()) if gpu_count() else 0


def default_tag(experiment: str) -> str:
    """torch-<version> for the default experiment; others get their name in front, so that two
    experiments never mix their runs in one folder."""
    tag = f"torch-{torch_version()['version']}"
    return tag if experiment == "scaling" else f"{experiment}-{tag}"


def resolve_run(train: dict, variant: str, gpus: int, repeat: int, options: dict,
                seeds: str) -> dict:
    """One run's RunConfig keys: the seed it trains with and, under weak scaling, its global batch."""
    run = {**train, "variant": variant, "gpus": gpus, "repeat": repeat, "options": dict(options)}
    if seeds == "distinct":
        run["seed"] = train.get("seed", 0) + repeat
    if train.get("per_gpu_batch") is not None:
        run["global_batch"] = train["per_gpu_batch"] * gpus
    return run


def plan_gpus(config: dict) -> int:
    """The GPUs the plan is made for: `gpus_available` when set (planning on a cluster's login
    node, which has none), else what this machine shows."""
    given = config.get("gpus_available")
    return visible_gpus() if given is None else given


@dataclass
class Plan:
    config: dict
    gpus_visible: int
    # The config as given (config.yaml, --configfile, --config), before the experiment's file and
    # the defaults: plan.json keeps it, so that `dpbench report TAG` plans the set's DAG again.
    given: dict | None = None

    @property
    def cpu(self) -> bool:
        return self.gpus_visible == 0

    @cached_property
    def tag(self) -> str:
        if self.config.get("tag"):
            return self.config["tag"]
        if self.paired:   # upgrade-2.13.0+cpu-vs-2.14.1+cpu: what the launch compares
            return f"{self.config['experiment']}-" + "-vs-".join(self.environment_versions.values())
        return default_tag(self.config["experiment"])

    @property
    def environments(self) -> dict[str, str]:
        """A paired launch's environments (name -> python), {} for a launch in this python alone."""
        return dict(self.config.get("environments") or {})

    @property
    def paired(self) -> bool:
        return bool(self.environments)

    @cached_property
    def environment_versions(self) -> dict[str, str]:
        """name -> torch version of each environment, each checked (envs.EnvironmentProblem)."""
        return envs.check_environments(self.environments)

    def python_for(self, run_id: str) -> str | None:
        """The python that runs `run_id`: its environment's, None for this one's."""
        name = self.run(run_id).environment
        return None if name is None else self.environments[name]

    def priority_for(self, run_id: str) -> int:
        """The Snakemake priority that makes a paired launch's runs start in the plan's order
        (the environments interleaved ABBA) when they run one at a time; 0 for other launches."""
        if not self.paired:
            return 0
        order = list(self.runs)
        return len(order) - order.index(run_id)

    @property
    def results(self) -> results.ResultSet:
        return results.ResultSet(self.config["results_dir"], self.tag)

    @cached_property
    def runs(self) -> dict[str, RunConfig]:
        return {rid: rc for group in self.group_runs.values() for rid, rc in group.items()}

    @cached_property
    def group_runs(self) -> dict[str, dict[str, RunConfig]]:
        """Group name -> its runs (run id -> RunConfig), in the experiment's order. Two groups
        may make one run, with the same settings."""
        cfg = self.config
        cpu_plan = cfg["cpu_plan"]
        self.check_options()
        runs: dict[str, RunConfig] = {}
        origin: dict[str, str] = {}
        groups: dict[str, dict[str, RunConfig]] = {}
        for group in cfg["matrix"]:
            mine = groups.setdefault(group["name"], {})
            repeats = cpu_plan["repeats"] if self.cpu else group.get("repeats", cfg["repeats"])
            options = self.group_options(group)
            for variant in group.get("variants", cfg["variants"]):
                for gpus in ([1] if variant == "single" else group.get("gpus", cfg["gpus"])):
                    for repeat, env in self._repeats(repeats):
                        run_options = options | ({"environment": env} if env else {})
                        train = {**cfg.get("train", {}), **run_options}
                        if self.cpu:   # what the group kept (cpu_plan.keep_up_to) stays
                            train.update({k: v for k, v in cpu_plan["train"].items() if k not in run_options},
                                         max_cpu_ranks=cpu_plan["max_ranks"])
                            if "workload" in train:
                                train["workload"] = self.cpu_workload(train["workload"])[0]
                        rc = RunConfig.from_dict(resolve_run(train, variant, gpus, repeat, run_options,
                                                             cfg.get("seeds", "distinct")))
                        rid = results.run_id(variant, gpus, repeat, run_options)
                        if rid in runs and runs[rid] != rc:
                            raise ValueError(
                                f"groups {origin[rid]!r} and {group['name']!r} both make run {rid} "
                                f"with different settings; give one of them distinguishing options")
                        mine[rid] = runs.setdefault(rid, rc)
                        origin.setdefault(rid, group["name"])
        return groups

    @cached_property
    def identities(self) -> dict[str, results.Identity]:
        """Run id -> its identity (run id, cell id, setup id, group): decided here, once; the
        launcher and the record copy it. A run two groups make belongs to the first."""
        group_of: dict[str, str] = {}
        for name, runs in self.group_runs.items():
            for rid in runs:
                group_of.setdefault(rid, name)
        return {rid: results.identity_of(rid, rc.to_dict(), group_of[rid]) for rid, rc in self.runs.items()}

    def identity_json(self, run_id: str) -> str:
        self.run(run_id)   # an unknown run id: the one-line error
        return json.dumps(self.identities[run_id].to_dict(), sort_keys=True)

    def check_options(self) -> None:
        """Refuses (ValueError, one line) what no run could honour as written: an option a variant
        ignores, set to other than its default in a group's options for that variant (it would
        name runs that differ by nothing), or in `train` where no variant of the experiment takes
        it (plan/variants/); and a workload factory that cannot be found here."""
        cfg = self.config
        defaults = {k: spec.get("default") for k, spec in train_schema().items()}
        groups = [(g, g.get("options", {}), g.get("variants", cfg["variants"])) for g in cfg["matrix"]]
        for group, options, variants in groups:
            for option in variant_registry.specific_options():
                ignoring = [v for v in variants if option in variant_registry.ignored(v, options, defaults)]
                if ignoring:
                    raise ValueError(variant_registry.refusal(f"group {group['name']!r}", option,
                                                             options[option], ignoring))
        # train (an experiment's or a recipe's settings of every run) only needs a variant of the
        # experiment that takes it: a recipe's DDP knobs over perf's single groups and its DDP
        # groups, which name the knobs themselves, are fine.
        train = cfg.get("train", {})
        every = list(dict.fromkeys(v for _, _, variants in groups for v in variants))
        for option in variant_registry.specific_options():
            if option not in train or train[option] == defaults.get(option):
                continue
            if not any(variant_registry.takes(v, option) for v in every):
                raise ValueError(variant_registry.refusal("train", option, train[option], every))
        for workload in [train.get("workload")] + [o.get("workload") for _, o, _ in groups]:
            if workload is not None and (problem := factory_problem(workload)):
                raise ValueError(problem)

    def _repeats(self, repeats: int) -> list[tuple[int, str | None]]:
        """(repeat, environment) of one cell's runs in launch order: a paired launch interleaves
        its environments per repeat (ABBA), any other has one run per repeat."""
        names = list(self.environments)
        if not names:
            return [(r, None) for r in range(repeats)]
        return [(r, env) for r in range(repeats) for env in envs.interleaved(names, r)]

    def group_options(self, group: dict) -> dict:
        """A group's options as its runs use them, which name its runs: the CPU plan's settings
        win over the group's (but a batch or step budget within cpu_plan.keep_up_to), and a label
        names only what really applies; a workload other than the default is among them where
        `train` sets it too (two models are never one cell)."""
        options = dict(group.get("options", {}))
        given = self.config.get("train", {}).get("workload")
        if "workload" not in options and given is not None and results.workload_label(given) != DEFAULT_WORKLOAD:
            options["workload"] = given   # what a run trains names it, wherever it is set
        if self.cpu:
            cpu_plan = self.config["cpu_plan"]
            keep = cpu_plan.get("keep_up_to", {})
            options = {k: v for k, v in options.items() if k not in cpu_plan["train"]
                       or (k in keep and v is not None and v <= keep[k])}
            if "workload" in options:
                options["workload"] = self.cpu_workload(options["workload"])[0]
        return options

    def cpu_workload(self, workload) -> tuple[Any, dict, dict]:
        """A workload as the CPU plan trains it: cpu_plan.workload_args[its name] (a built-in's or
        plugin's name, or a factory's reference) merged over its args; and the args it replaced,
        (asked, used), empty when none."""
        shrink = self.config["cpu_plan"].get("workload_args", {})
        name, _, args = resolve(workload)
        used = {**args, **shrink.get(name, {})}
        changed = sorted(k for k in used if args.get(k) != used[k])
        if not changed:
            return workload, {}, {}
        spec = dict(workload) if isinstance(workload, dict) else (
            {"factory": workload} if ":" in workload else {"name": workload})
        return ({**spec, "args": used}, {k: args.get(k) for k in changed}, {k: used[k] for k in changed})

    def document(self) -> dict:
        """plan.json: what every later reader takes from the plan (the probes, the ledger, the
        perf targets) instead of resolving settings again. Groups keep the experiment's order."""
        cfg = self.config
        return {"experiment": cfg["experiment"], "tag": self.tag, "gpus_planned": self.gpus_visible,
                "gpus_available": cfg.get("gpus_available"), "cpu_plan": self.cpu,
                "cpu_replaced": {k: {"asked": a, "used": u} for k, (a, u) in self.cpu_replaced().items()} if self.cpu else {},
                "groups": [{"name": g["name"], "variants": list(g.get("variants", cfg["variants"])),
                            "gpus": list(g.get("gpus", cfg["gpus"])), "options": self.group_options(g),
                            "label": results.options_label(self.group_options(g)),
                            "runs": sorted(self.group_runs[g["name"]])} for g in cfg["matrix"]],
                "runs": {rid: rc.to_dict() for rid, rc in sorted(self.runs.items())},
                # every run's run_id, cell_id, setup_id and group: what every later step copies
                "identities": {rid: self.identities[rid].to_dict() for rid in sorted(self.runs)},
                # A paired launch: its environments and the order its runs were made to start in.
                "environments": self.environments,
                "environment_versions": self.environment_versions if self.paired else {},
                "run_order": list(self.runs) if self.paired else [],
                "skipped": {rid: self.skip_reason(rc) for rid, rc in sorted(self.runs.items()) if self.skipped(rc)},
                "given": self.given}

    def plan_json(self) -> str:
        return json.dumps(self.document(), indent=1, default=str) + "\n"

    def groups_digest(self) -> str:
        """A digest of what the probes and the ledger take from plan.json (the groups and their
        runs' settings, not the GPUs planned for): a change reruns them (Snakemake params)."""
        doc = self.document()
        used = [doc["groups"], {rid: doc["runs"][rid] for g in doc["groups"] for rid in g["runs"]}]
        return hashlib.sha256(json.dumps(used, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def run(self, run_id: str) -> RunConfig:
        try:
            return self.runs[run_id]
        except KeyError:
            some = ", ".join(sorted(self.runs)[:6])
            raise ValueError(f"run {run_id!r} is not in experiment {self.config['experiment']!r} as "
                             f"planned here ({len(self.runs)} runs, e.g. {some}); choose the "
                             f"experiment with --config experiment=NAME") from None

    def run_json(self, run_id: str) -> str:
        return json.dumps(self.run(run_id).to_dict(), sort_keys=True)

    def gpus_for(self, run_id: str) -> int:
        """The `gpu` resource of a run: what it occupies (all of them when timing exclusively).
        A run that will be recorded as skipped asks for none: a cluster could otherwise hold it
        queued for GPUs it never uses, or forever when no node has that many."""
        rc = self.run(run_id)
        if self.cpu or rc.device == "cpu" or self.skipped(rc):
            return 0
        return self.gpus_visible if self.config["exclusive_timing"] else rc.gpus_held

    def skipped(self, rc: RunConfig) -> bool:
        """Whether the run is recorded as skipped where the plan is made for."""
        return self.skip_reason(rc) is not None

    def skip_reason(self, rc: RunConfig) -> str | None:
        return skip_reason(rc, self.gpus_visible)

    def threads_for(self, run_id: str) -> int:
        """CPU cores of a run: one per rank of a distributed variant, plus its loader workers; one for a run that will
        be recorded as skipped (on SLURM, --cpus-per-task beyond a node's CPUs never starts)."""
        rc = self.run(run_id)
        if self.skipped(rc):
            return 1
        ranks = rc.gpus if rc.variant in DISTRIBUTED_VARIANTS else 1
        return max(1, ranks) + (rc.workers if rc.feed == "torch" else 0)

    def cpu_timing_for(self, run_id: str) -> int:
        """The `cpu_timing` resource of a run: 1 for a CPU-plan run that trains (its timing is
        only worth something alone on the machine), 0 for GPU runs and for runs that the
        engine records as skipped."""
        return int(self.cpu and not self.skipped(self.run(run_id)))

    def cpu_replaced(self) -> dict[str, tuple]:
        """The experiment's train settings that the CPU plan replaced: key -> (asked, used)."""
        asked = self.config.get("train", {})
        used = self.config["cpu_plan"]["train"]
        replaced = {k: (asked[k], used[k]) for k in sorted(used) if k in asked and asked[k] != used[k]}
        # and the workload args that cpu_plan.workload_args replaced, where a workload is named
        named = [("train", asked)] + [(g["name"], g.get("options", {})) for g in self.config["matrix"]]
        for where, given in named:
            if "workload" in given and (change := self.cpu_workload(given["workload"]))[1]:
                replaced[f"{where}.workload.args"] = change[1:]
        return replaced

    def skipped_summary(self, runs: list[RunConfig]) -> str:
        """Runs by variant and GPU counts: 'dp on [1, 2], ddp on [3]'."""
        counts: dict[str, set[int]] = {}
        for rc in runs:
            counts.setdefault(rc.variant, set()).add(rc.gpus)
        return ", ".join(f"{v} on {sorted(g)}" for v, g in counts.items())

    def banner(self) -> str:
        if not self.paired:
            return self._banner()
        sides = ", ".join(f"{k} (torch {v}: {self.environments[k]})" for k, v in self.environment_versions.items())
        return (self._banner() + f"\ndpbench: a paired launch of {sides}, their runs interleaved "
                f"per cell and repeat (ABBA); compare them with: snakemake --cores 1 compare --config paired={self.tag}"
                + (f" results_dir={self.config['results_dir']}" if self.config.get("results_dir", "results") != "results" else ""))

    def cpu_ran_words(self) -> str:
        """What the CPU plan trains, from its runs that are not skipped: 'single on 1 process, ddp
        on 1 and 2 gloo processes'."""
        counts: dict[str, set[int]] = {}
        for rc in self.runs.values():
            if not self.skipped(rc):
                counts.setdefault(rc.variant, set()).add(rc.gpus)
        if not counts:
            return "nothing to train (every run is skipped)"
        parts = []
        for variant in sorted(counts, key=lambda v: (VARIANTS.index(v) if v in VARIANTS else 99, v)):
            ranks = sorted(counts[variant])
            listed = (", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}") if len(ranks) > 1 else str(ranks[0])
            many = len(ranks) > 1 or ranks[0] > 1
            parts.append(f"{variant} on {listed} {'gloo ' if variant != 'single' else ''}"
                         f"process{'es' if many else ''}")
        return ", ".join(parts)

    def _banner(self) -> str:
        n = len(self.runs)
        skipped = [rc for rc in self.runs.values() if self.skipped(rc)]
        where = self.results.dir
        if self.cpu:
            datasets = " and ".join(sorted({rc.dataset for rc in self.runs.values()})) or "no"
            replaced = self.cpu_replaced()
            what = ("; it replaced the experiment's " + ", ".join(
                f"{k}={a} (now {u})" for k, (a, u) in replaced.items()) if replaced else "")
            repeats = self.config["cpu_plan"]["repeats"]
            extra = (f"; {len(skipped)} are recorded as skipped with the reason ({self.skipped_summary(skipped)})"
                     if skipped else "")
            return (f"dpbench: no CUDA device visible: running the CPU plan ({n} runs, {repeats} "
                    f"repeat(s) each) on {datasets} data with cpu_plan.train's budget{what}.\n"
                    f"dpbench: {self.cpu_ran_words()}, one timed run at a time{extra}. Results: {where}")
        short = sorted({rc.gpus for rc in skipped if rc.gpus > self.gpus_visible})
        other = [rc for rc in skipped if rc.gpus <= self.gpus_visible]
        extra = f"; runs on {short} GPUs are recorded as skipped" if short else ""
        if other:
            extra += (f"; {len(other)}{' more' if short else ''} are recorded as skipped with the reason "
                      f"({self.skipped_summary(other)})")
        source = "planned (gpus_available)" if self.config.get("gpus_available") is not None else "visible"
        return f"dpbench: {self.gpus_visible} GPU(s) {source}, {n} runs{extra}. Results: {where}"


def _document(source: Path | str | dict) -> dict:
    return source if isinstance(source, dict) else json.loads(Path(source).read_text())


def planned_runs(source: Path | str | dict) -> dict[str, RunConfig]:
    """plan.json's runs (a path, or the document itself): run id -> RunConfig, as they train."""
    return {rid: RunConfig.from_dict(cfg) for rid, cfg in _document(source)["runs"].items()}


def read_plan(source: Path | str | dict) -> dict[str, dict[str, Any]]:
    """plan.json's groups (a path, or the document itself): name -> {variants, gpus, options,
    label, runs: {run id: RunConfig}}, in the experiment's order. With planned_runs, the one
    reader of a plan: the runs' settings as they train, never resolved again."""
    doc = _document(source)
    runs = planned_runs(doc)
    return {g["name"]: {**{k: v for k, v in g.items() if k != "name"}, "runs": {rid: runs[rid] for rid in g["runs"]}}
            for g in doc["groups"]}


def read_identities(source: Path | str | dict) -> dict[str, results.Identity]:
    """plan.json's identities (a path, or the document itself): run id -> Identity. A plan
    written before the plan decided them gets theirs from its runs and groups (identity_of)."""
    doc = _document(source)
    if "identities" in doc:
        return {rid: results.Identity.from_dict(ident) for rid, ident in doc["identities"].items()}
    group_of: dict[str, str] = {}
    for group in doc["groups"]:
        for rid in group["runs"]:
            group_of.setdefault(rid, group["name"])
    return {rid: results.identity_of(rid, cfg, group_of.get(rid, "")) for rid, cfg in doc["runs"].items()}


def environment_fingerprint() -> str:
    """What decides results besides the config: a change reruns the runs (Snakemake params)."""
    torch = torch_version()
    gpus = sorted(set(gpu_names()))
    return (f"torch={torch['version']} git={torch['git']} cuda={torch['cuda']} "
            f"gpus={','.join(gpus) or 'none'} python={sys.version.split()[0]}")
