"""The experiment matrix: from a validated experiment config to one RunConfig per run id.

Groups in `matrix` expand to variants x gpus x repeats; `options` are per-group overrides that
also label the runs. Without CUDA the CPU plan applies: its `train` overrides win (synthetic
data, a small step budget), the same run ids are kept, and what cannot run there is recorded
as skipped by the engine with its reason.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

from . import results
from .config import RunConfig


def visible_gpus() -> int:
    """CUDA devices this process may use, counted without initialising CUDA."""
    from .gpu_lease import pool
    try:
        import torch
        if not torch.cuda.is_available():
            return 0
    except ImportError:
        return 0
    return len(pool())


def default_tag(experiment: str) -> str:
    """torch-<version> for the default experiment; others get their name in front, so that two
    experiments never mix their runs in one folder."""
    import torch
    tag = f"torch-{torch.__version__}"
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

    @property
    def cpu(self) -> bool:
        return self.gpus_visible == 0

    @cached_property
    def tag(self) -> str:
        return self.config.get("tag") or default_tag(self.config["experiment"])

    @property
    def base(self) -> str:
        return str(results.tag_dir(self.config["results_dir"], self.tag))

    @cached_property
    def runs(self) -> dict[str, RunConfig]:
        cfg = self.config
        cpu_plan = cfg["cpu_plan"]
        runs: dict[str, RunConfig] = {}
        origin: dict[str, str] = {}
        for group in cfg["matrix"]:
            repeats = cpu_plan["repeats"] if self.cpu else group.get("repeats", cfg["repeats"])
            options = self.group_options(group)
            for variant in group.get("variants", cfg["variants"]):
                for gpus in ([1] if variant == "single" else group.get("gpus", cfg["gpus"])):
                    for repeat in range(repeats):
                        train = {**cfg.get("train", {}), **options}
                        if self.cpu:
                            train.update(cpu_plan["train"], max_cpu_ranks=cpu_plan["max_ranks"])
                        rc = RunConfig.from_dict(resolve_run(train, variant, gpus, repeat, options,
                                                             cfg.get("seeds", "distinct")))
                        rid = results.run_id(variant, gpus, repeat, options)
                        if rid in runs and runs[rid] != rc:
                            raise ValueError(
                                f"groups {origin[rid]!r} and {group['name']!r} both make run {rid} "
                                f"with different settings; give one of them distinguishing options")
                        runs.setdefault(rid, rc)
                        origin.setdefault(rid, group["name"])
        return runs

    def group_options(self, group: dict) -> dict:
        """A group's options as its runs use them: the CPU plan's settings win over the group's,
        and a label names only what really applies."""
        options = group.get("options", {})
        if self.cpu:
            options = {k: v for k, v in options.items() if k not in self.config["cpu_plan"]["train"]}
        return options

    def matrix_json(self) -> str:
        """The experiment's groups as planned here (for the claims ledger, which finds runs by group)."""
        import json
        cfg = self.config
        matrix = [dict(g, options=self.group_options(g)) for g in cfg["matrix"]]
        return json.dumps({"variants": cfg["variants"], "gpus": cfg["gpus"], "matrix": matrix},
                          sort_keys=True)

    def run(self, run_id: str) -> RunConfig:
        try:
            return self.runs[run_id]
        except KeyError:
            some = ", ".join(sorted(self.runs)[:6])
            raise ValueError(f"run {run_id!r} is not in experiment {self.config['experiment']!r} as "
                             f"planned here ({len(self.runs)} runs, e.g. {some}); choose the "
                             f"experiment with --config experiment=NAME") from None

    def run_json(self, run_id: str) -> str:
        import json
        return json.dumps(self.run(run_id).to_dict(), sort_keys=True)

    def gpus_for(self, run_id: str) -> int:
        """The `gpu` resource of a run: what it occupies (all of them when timing exclusively)."""
        rc = self.run(run_id)
        if self.cpu or rc.gpus > self.gpus_visible:
            return 0
        return self.gpus_visible if self.config["exclusive_timing"] else rc.gpus

    def threads_for(self, run_id: str) -> int:
        rc = self.run(run_id)
        ranks = rc.gpus if rc.variant == "ddp" else 1
        return max(1, ranks) + (rc.workers if rc.feed == "torch" else 0)

    def banner(self) -> str:
        n = len(self.runs)
        if self.cpu:
            return (f"dpbench: no CUDA device visible: running the CPU plan ({n} runs): single and "
                    f"ddp on gloo with synthetic data and a small step budget; the DataParallel "
                    f"variants and ddp beyond {self.config['cpu_plan']['max_ranks']} processes are "
                    f"recorded as skipped with the reason. Results: {self.base}")
        skipped = sorted({rc.gpus for rc in self.runs.values() if rc.gpus > self.gpus_visible})
        extra = f"; runs on {skipped} GPUs are recorded as skipped" if skipped else ""
        source = "planned (gpus_available)" if self.config.get("gpus_available") is not None else "visible"
        return f"dpbench: {self.gpus_visible} GPU(s) {source}, {n} runs{extra}. Results: {self.base}"


def environment_fingerprint() -> str:
    """What decides results besides the config: a change reruns the runs (Snakemake params)."""
    import torch
    from .measure import nvml
    lib = nvml() if torch.cuda.is_available() else None
    gpus = sorted({lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(i))
                   for i in range(lib.nvmlDeviceGetCount())}) if lib else []
    return (f"torch={torch.__version__} git={torch.version.git_version} cuda={torch.version.cuda} "
            f"gpus={','.join(map(str, gpus)) or 'none'} python={os.sys.version.split()[0]}")
