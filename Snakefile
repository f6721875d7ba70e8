# dpbench: single-device, DataParallel and DDP training of ResNet18 on CIFAR-10, measured.
#   snakemake --cores all                              the experiment in config.yaml
#   snakemake --cores all --config experiment=smoke    another one (experiments/*.yaml)
#   snakemake --cores all results/<tag>/runs/<run_id>/metrics.json --forcerun train   one run
#   dpbench report <tag>                               its HTML report (snakemake --report, the set's config)
#   snakemake --cores 1 compare --config baseline=<tag> candidate=<tag>
#   snakemake --cores all --config experiment=upgrade base=/venv-a/bin/python cand=/venv-b/bin/python
#   snakemake --cores 1 compare --config paired=<tag>            the environments of one paired launch
# The logic lives in the dpbench package (src/dpbench); rules only call it.
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))   # works without `pip install -e .` too
from snakemake.utils import min_version
from dpbench.plan import pipeline

pipeline.name_the_pipeline()   # a run stops when this Snakemake process is gone
pipeline.stop_runs_on_interrupt()   # SIGINT to Snakemake stops the running trainings too

min_version("8.0")

configfile: "config.yaml"

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
# Where the tables are tells a rule which result set it works on.
TAG_OF_INPUT = lambda w, input: pipeline.tag_args(input[0])
ENVFILE = "envs/dpbench.yaml"   # used with --software-deployment-method conda
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

# Under a cluster executor these read and write small files: no queue wait for them.
localrules: all, plan, collect, plots, summary, claims, compare

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


rule all:
    input:
        pipeline.final_targets(PLAN),
    default_target: True


rule train:
    output:
        str(RS.metrics_path("{run_id}")),
    log:
        str(RS.log_path("{run_id}")),
    params:
        run=lambda w: PLAN.run_json(w.run_id),
        identity=lambda w: PLAN.identity_json(w.run_id),   # the plan's ids, which the record copies
        env=lambda w: pipeline.run_fingerprint(PLAN, w.run_id, ENV),   # a new torch, CUDA or GPU reruns it
        out=lambda w, output: str(Path(output[0]).parent),
        lease=["--lease", "--exclusive"] if config["exclusive_timing"] else ["--lease"],
        planned=PLAN.gpus_visible,   # the launcher skips what the plan skips, on any machine
        py=RUN_PY,
    priority: lambda w: PLAN.priority_for(w.run_id)   # a paired launch's runs start in ABBA order
    resources:
        gpu=lambda w: PLAN.gpus_for(w.run_id),
        cpu_timing=lambda w: PLAN.cpu_timing_for(w.run_id),
    threads: lambda w: PLAN.threads_for(w.run_id)
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.run.launch --config {params.run:q} --identity {params.identity:q} --out {params.out:q} "
        "{params.lease:q} --planned-gpus {params.planned:q} --log {log:q}"


rule plan:
    # The plan as made here (groups -> run configs -> run ids, the CPU plan's substitutions, the
    # GPUs planned for): the probes and the ledger read it instead of resolving settings again.
    output:
        str(RS.plan_path),
    log:
        str(RS.log_path("plan")),
    params:
        plan=PLAN.plan_json(),   # a new plan (--config, other GPUs) rewrites it
    run:
        Path(output[0]).write_text(params.plan)
        Path(log[0]).write_text(f"wrote {output[0]}\n")


rule collect:
    input:
        runs=[str(RS.metrics_path(run_id)) for run_id in sorted(PLAN.runs)],
        # the set's experiment and config: a damaged run's "rerun it" names them (plan.json's `given`).
        # Not ancient(): with ancient(), a plan.json that must be rewritten (a changed config) left
        # collect, and with it the training, out of Snakemake 9.27's DAG (tests/test_stopping.py).
        plan=str(RS.plan_path),
    output:
        *TABLES.values(),
        provenance=str(RS.provenance_path),
    log:
        str(RS.log_path("collect")),
    params:
        where=lambda w, output: pipeline.tag_args(output[0]),
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.analysis.collect {params.where} --plan {input.plan:q} --print {input.runs:q} > {log:q} 2>&1"


rule plots:
    input:
        *TABLES.values(),
    output:
        **{name: report(path, caption=f"report/{name}.rst", category="Figures")
           for name, path in FIGURES.items()},
    log:
        str(RS.log_path("plots")),
    params:
        where=TAG_OF_INPUT,
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.report.plots {params.where} > {log:q} 2>&1"


rule summary:
    input:
        *TABLES.values(),
        str(RS.provenance_path),
    output:
        report(str(RS.summary_md), caption="report/summary_table.rst", category="Summary"),
    log:
        str(RS.log_path("summary")),
    params:
        where=TAG_OF_INPUT,
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.report.summarize {params.where} > {log:q} 2>&1"


if pipeline.perf_target_files(PLAN):   # the perf experiment only: its targets name its cells

    rule perf_targets:
        input:
            *TABLES.values(),   # first: the result set is input[0]'s folder
            str(RS.provenance_path),
        output:
            **pipeline.perf_target_files(PLAN),
        log:
            str(RS.log_path("perf_targets")),
        params:
            where=lambda w, input: str(Path(input[0]).parent),
            **PY,
        conda:
            ENVFILE
        shell:
            "{params.py} -m dpbench.cli perf-targets {params.where:q} --md {output.md:q} --json {output.json:q} "
            "--figure {output.figure:q} --sweep-figure {output.sweep_figure:q} > {log:q} 2>&1"


SHARDING = pipeline.sharding_files(PLAN)
if SHARDING:   # experiments with sharded runs only

    rule sharding:
        input:
            *TABLES.values(),
        output:
            **{name: report(path, caption="report/sharding_figures.rst", category="Figures")
               for name, path in SHARDING.items() if name != "md"},
            md=SHARDING["md"],
        log:
            str(RS.log_path("sharding")),
        params:
            where=TAG_OF_INPUT,
            **PY,
        conda:
            ENVFILE
        shell:
            "({params.py} -m dpbench.report.sharding_plots {params.where} && "
            "{params.py} -m dpbench.report.sharding_tables {params.where} --out {output.md:q}) > {log:q} 2>&1"


rule probe:
    input:
        # C1 and C7 measure at the batches and widths their groups train with. A new plan.json
        # reruns a probe only when those settings change (not for a new count of GPUs).
        plan=ancient(str(RS.plan_path)),
    output:
        str(RS.probe_path("{claim}")),
    log:
        str(RS.log_path("probe-{claim}")),
    params:
        groups=PLAN.groups_digest(),
        **PY,
    resources:
        gpu=PLAN.gpus_visible,   # probes start CUDA their own way: alone on the machine
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.claims.probe {wildcards.claim:q} --out {output:q} --plan {input.plan:q} "
        "> {log:q} 2>&1"


rule claims:
    input:
        *TABLES.values(),   # first: TAG_OF_INPUT reads the result set from input[0]
        str(RS.provenance_path),
        pipeline.probe_files(PLAN),
        *FIGURES.values(),   # claims.md links some of them
        plan=ancient(str(RS.plan_path)),   # the groups as planned here, --config overrides included
    output:
        md=report(str(RS.claims_md), caption="report/claims.rst", category="Claims"),
        json=str(RS.claims_json),
        figures=[report(path, caption="report/claim_figures.rst", category="Claims")
                 for path in pipeline.claim_figure_files(PLAN).values()],
    log:
        str(RS.log_path("claims")),
    params:
        where=TAG_OF_INPUT,
        groups=PLAN.groups_digest(),
        **PY,
    conda:
        ENVFILE
    shell:
        "{params.py} -m dpbench.claims.ledger {params.where} --plan {input.plan:q} > {log:q} 2>&1"


rule compare:
    # No outputs: always runs when asked for, and its exit status is the verdict (with
    # compare.fail_on_regression) while the report it writes stays in place.
    log:
        str(pipeline.compare_log(config)),
    params:
        args=lambda w: pipeline.compare_args(config, PLAN.tag),
        **PY,
    conda:
        ENVFILE
    shell:
        "set -o pipefail; {params.py} -m dpbench.compare_cli {params.args} 2>&1 | tee {log:q}"
