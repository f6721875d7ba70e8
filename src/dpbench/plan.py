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
        for group in cfg["matrix"]:
            repeats = cpu_plan["repeats"] if self.cpu else group.get("repeats", cfg["repeats"])
            options = group.get("options", {})
            for variant in group.get("variants", cfg["variants"]):
                for gpus in ([1] if variant == "single" else group.get("gpus", cfg["gpus"])):
                    for repeat in range(repeats):
                        train = {**cfg["train"], **options}
                        if self.cpu:
                            train.update(cpu_plan["train"], max_cpu_ranks=cpu_plan["max_ranks"])
                        rc = RunConfig.from_dict({**train, "variant": variant, "gpus": gpus,
                                                  "repeat": repeat, "options": dict(options)})
                        runs[results.run_id(variant, gpus, repeat, options)] = rc
        return runs

    def run_json(self, run_id: str) -> str:
        import json
        return json.dumps(self.runs[run_id].to_dict(), sort_keys=True)

    def gpus_for(self, run_id: str) -> int:
        """The `gpu` resource of a run: what it occupies (all of them when timing exclusively)."""
        rc = self.runs[run_id]
        if self.cpu or rc.gpus > self.gpus_visible:
            return 0
        return self.gpus_visible if self.config["exclusive_timing"] else rc.gpus

    def threads_for(self, run_id: str) -> int:
        rc = self.runs[run_id]
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
        return f"dpbench: {self.gpus_visible} GPU(s) visible, {n} runs{extra}. Results: {self.base}"


def environment_fingerprint() -> str:
    """What decides results besides the config: a change reruns the runs (Snakemake params)."""
    import torch
    gpus = []
    if torch.cuda.is_available():
        try:
            import pynvml
            pynvml.nvmlInit()
            gpus = sorted({pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                           for i in range(pynvml.nvmlDeviceGetCount())})
        except Exception:
            gpus = ["unknown"]
    return (f"torch={torch.__version__} git={torch.version.git_version} cuda={torch.version.cuda} "
            f"gpus={','.join(map(str, gpus)) or 'none'} python={os.sys.version.split()[0]}")
