# The pipeline's common part: the plan (every run's ids and settings, decided once), the result
# set's paths, the command prefixes, the resources, and the hooks that start and end a pipeline.
# Every rule's tag and inputs come from PLAN and RS, never from reading a path back.
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))   # works without `pip install -e .` too
from dpbench.plan import pipeline

pipeline.name_the_pipeline()   # a run stops when this Snakemake process is gone
pipeline.stop_runs_on_interrupt()   # SIGINT to Snakemake stops the running trainings too

GIVEN = dict(config)   # config.yaml, --configfile, --config: plan.json keeps it (`dpbench report`)
config.update(pipeline.load_experiment(config, workflow.basedir))
PLAN = pipeline.make_plan(config, GIVEN)   # a paired launch's environments checked before anything trains
RS = PLAN.results   # every path of the result set (dpbench.results.ResultSet)
# After `kill -9` of a pipeline its Snakemake locks stay behind: gone here when no live pipeline
# holds the result sets they name, so that the same command with --rerun-incomplete resumes.
# (The main Snakemake process only: a cluster job's or a subprocess's Snakemake takes no lock.)
if workflow.exec_mode.name == "DEFAULT" and pipeline.clear_stale_snakemake_locks(config["results_dir"]):
    print("dpbench: removed the Snakemake locks of a pipeline that is no longer running", file=sys.stderr)
TABLES = pipeline.table_files(PLAN)
FIGURES = pipeline.figure_files(PLAN)
ENV = pipeline.environment_fingerprint()
# Rules run the package with the Python that runs Snakemake (the environment's own `python`
# under --software-deployment-method conda), and find it without an install too.
CONDA = "conda" in str(workflow.deployment_settings.deployment_method).lower()
# Every argument of every rule's command is quoted ({x:q}, shlex.quote): a path with a space or a
# shell character is one argument, never a command (tags are names too: see experiments/schema.yaml).
PYTHONPATH = f"PYTHONPATH={shlex.quote(str(Path(workflow.basedir) / 'src'))}${{PYTHONPATH:+:$PYTHONPATH}}"
PY = dict(py=f"{PYTHONPATH} {'python' if CONDA else shlex.quote(sys.executable)}")
# A paired launch's run is made by its environment's python (torchrun's ranks inherit it).
RUN_PY = lambda w: f"{PYTHONPATH} {shlex.quote(PLAN.python_for(w.run_id))}" if PLAN.python_for(w.run_id) else PY["py"]
# The result set every rule after train works on: the plan's (`--results-dir R --tag T`, quoted).
WHERE = pipeline.tag_args(PLAN)
ENVFILE = "../envs/dpbench.yaml"   # with --software-deployment-method conda; relative to rules/
# The `gpu` limit is this machine's GPUs (unless --resources gpu=N), for jobs run here. A cluster
# executor (--jobs N, as the SLURM profile sets) places each job on a node that grants it its
# own GPUs: a global cap would hold the whole pipeline to one node's count.
LOCAL = workflow.resource_settings.nodes is None
if "gpu" not in workflow.global_resources and LOCAL:
    workflow.register_resource("gpu", PLAN.gpus_visible)
# The CPU plan's timed runs one at a time when they share this machine (cluster jobs get their
# own CPUs from the scheduler).
if "cpu_timing" not in workflow.global_resources and LOCAL:
    workflow.register_resource("cpu_timing", 1)

onstart:
    # One pipeline per result set, for the life of this process (dry runs never get here): a
    # second one on the same tag stops with one line naming the holder's pid.
    if pipeline.needs_pipeline_lock(workflow.dag_settings.targets):
        try:
            pipeline.hold_pipeline_lock(RS.dir, PLAN.tag)
        except pipeline.ConfigError as exc:
            sys.exit(f"dpbench: {exc}")
    print(PLAN.banner(), file=sys.stderr)

# The last lines of every pipeline: its runs counted (ok, failed, skipped) with the commonest
# reasons; `--config fail_on_failed_runs=true` makes a failed run fail the pipeline (CI).
onsuccess:
    if pipeline.report_outcomes(PLAN, workflow.dag_settings.targets, succeeded=True):
        sys.exit(1)

onerror:
    pipeline.report_outcomes(PLAN, workflow.dag_settings.targets, succeeded=False)

wildcard_constraints:
    run_id="[A-Za-z0-9_.-]+",
    claim="C[0-9]+",
