"""What the Snakefile needs, kept out of it so it can be tested: the one module the Snakefile and
rules/*.smk import, gathering the names they use from the modules that own them (the experiment
config and plan, tags, the pipeline's lock, its interrupt handling, its outcomes, and the rules'
files and arguments).

Nothing here imports torch, seaborn or matplotlib: planning (`snakemake -n`, every job of a
cluster executor, a login node) stays fast and needs none of them.
"""
from __future__ import annotations

from dpbench.plan.experiment import (
    CLI_FORMS,
    SCHEMA,
    ConfigError,
    coerce,
    deep_merge,
    fill_defaults,
    load_experiment,
    make_plan,
    paired_environments,
    plan_of_file,
    unknown_keys,
)
from dpbench.plan.interrupt import LAUNCHER, launchers_below, name_the_pipeline, stop_runs_on_interrupt
from dpbench.plan.locks import (
    LOCK_FREE_TARGETS,
    PIPELINE_LOCK,
    PipelineBusy,
    clear_stale_snakemake_locks,
    hold_pipeline_lock,
    needs_pipeline_lock,
    pipeline_alive,
)
from dpbench.plan.matrix import environment_fingerprint
from dpbench.plan.outcomes import outcome_lines, report_outcomes, run_outcomes
from dpbench.plan.rerun import rerun_command, set_config_args
from dpbench.plan.rule_args import compare_args, run_fingerprint, tag_args
from dpbench.plan.rule_files import (
    claim_figure_files,
    compare_log,
    figure_files,
    final_targets,
    perf_target_files,
    probe_files,
    sharding_files,
    table_files,
)
from dpbench.plan.tags import TAG_CHARS, TAG_MAX, TAG_RULE, tag_problem

__all__ = ["ConfigError", "PipelineBusy", "hold_pipeline_lock", "needs_pipeline_lock", "load_experiment",
           "tag_problem", "coerce", "unknown_keys", "make_plan", "table_files", "figure_files",
           "claim_figure_files", "probe_files", "perf_target_files", "final_targets", "tag_args", "compare_args",
           "environment_fingerprint", "run_fingerprint", "paired_environments",
           # also used by the Snakefile, the CLI and other modules through this one
           "CLI_FORMS", "SCHEMA", "deep_merge", "fill_defaults", "plan_of_file", "LAUNCHER", "launchers_below",
           "name_the_pipeline", "stop_runs_on_interrupt", "LOCK_FREE_TARGETS", "PIPELINE_LOCK",
           "clear_stale_snakemake_locks", "pipeline_alive", "outcome_lines", "report_outcomes", "run_outcomes",
           "rerun_command", "set_config_args", "compare_log", "sharding_files", "TAG_CHARS", "TAG_MAX",
           "TAG_RULE"]
